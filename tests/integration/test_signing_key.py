"""provisioner.gpu.provisioner_signing_key through ansible-playbook (connection local, a key server on loopback): the
repository key is installed only when its fingerprint is pinned, a wrong one is refused naming the variable (nothing
written; a key on the node that fails the pin is removed), check mode downloads nothing. Keys are made by gpg and
the module's own fingerprints are checked against gpg's.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner import PROJECT_ROOT

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(shutil.which("gpg") is None, reason="needs gpg (gnupg)")

PLAY = textwrap.dedent("""\
    - name: provisioner_signing_key
      hosts: local
      gather_facts: false
      tasks:
        - name: The repository key, pinned
          provisioner.gpu.provisioner_signing_key:
            url: "{{ key_url }}"
            dest: "{{ root }}/keyrings/repo.asc"
            fingerprints: "{{ pinned }}"
            var: nvidia_repo_key_fingerprints
          register: key
        - name: Result
          ansible.builtin.copy:
            dest: "{{ root }}/result.json"
            content: "{{ key | to_json }}"
            mode: "0644"
          check_mode: false
    """)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """Two keys (the pinned one, a stranger) as gpg exports them: armoured, binary, and both in one file."""
    d = tmp_path_factory.mktemp("keys")
    home = d / "gnupg"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    fps: dict[str, str] = {}
    try:
        for name, algo in (("good", "ed25519"), ("evil", "rsa2048")):
            subprocess.run([*gpg, "--quick-gen-key", f"{name} <{name}@example.invalid>", algo, "sign", "never"],
                           check=True, capture_output=True)
            out = subprocess.run([*gpg, "--with-colons", "--list-keys", f"{name}@example.invalid"], check=True,
                                 capture_output=True, text=True).stdout
            fps[name] = next(ln.split(":")[9] for ln in out.splitlines() if ln.startswith("fpr:"))
            subprocess.run([*gpg, "--armor", "--output", str(d / f"{name}.asc"), "--export", fps[name]], check=True)
            subprocess.run([*gpg, "--output", str(d / f"{name}.gpg"), "--export", fps[name]], check=True)
        (d / "both.asc").write_bytes((d / "good.asc").read_bytes() + (d / "evil.asc").read_bytes())
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)
    yield d, fps


@pytest.fixture(scope="module")
def server(keys: tuple[Path, dict[str, str]]) -> Iterator[str]:
    handler = functools.partial(_Quiet, directory=str(keys[0]))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _play(tmp_path: Path, url: str, pinned: list[str], *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and "proxy" not in k.lower()}
    env.update(ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_PATH=str(PROJECT_ROOT / "collections"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_REMOTE_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "files").mkdir(exist_ok=True)
    (tmp_path / "files" / "result.json").unlink(missing_ok=True)
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"[local]\nalpha ansible_connection=local ansible_python_interpreter={sys.executable} "
                   f"root={tmp_path / 'files'}\n")
    extra = json.dumps({"key_url": url, "pinned": pinned})
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(tmp_path / "play.yml"), "-e", extra,
                        *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    res = tmp_path / "files" / "result.json"
    return r, (json.loads(res.read_text()) if res.is_file() else {})


def test_pinned_key_is_installed_once_and_kept(tmp_path: Path, keys: tuple[Path, dict[str, str]],
                                               server: str) -> None:
    d, fps = keys
    dest = tmp_path / "files" / "keyrings" / "repo.asc"
    r, res = _play(tmp_path, f"{server}/good.asc", [fps["good"]], "--check")
    assert r.returncode == 0 and res["changed"] and not dest.exists(), r.stdout[-3000:]  # check mode: no download
    spaced = " ".join(fps["good"][i:i + 4] for i in range(0, 40, 4)).lower()  # as `gpg -k` prints it
    r, res = _play(tmp_path, f"{server}/good.asc", [spaced])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert res["changed"] and res["fingerprints"] == [fps["good"]]  # the module's parser agrees with gpg
    assert dest.read_bytes() == (d / "good.asc").read_bytes() and dest.stat().st_mode & 0o777 == 0o644
    r, res = _play(tmp_path, f"{server}/good.asc", [fps["good"]])
    assert r.returncode == 0 and not res["changed"] and res["resources"] == []
    r, res = _play(tmp_path, f"{server}/good.gpg", [fps["good"], fps["evil"]])  # binary key, either pin
    assert r.returncode == 0 and not res["changed"]  # the file on the node already passes: kept, not fetched


def test_wrong_fingerprint_is_refused_naming_the_variable(tmp_path: Path, keys: tuple[Path, dict[str, str]],
                                                          server: str) -> None:
    d, fps = keys
    dest = tmp_path / "files" / "keyrings" / "repo.asc"
    for served in ("evil.asc", "evil.gpg", "both.asc"):  # another key, or the right one with a stranger beside it
        r, _ = _play(tmp_path, f"{server}/{served}", [fps["good"]])
        assert r.returncode != 0, served
        assert "refusing the repository key" in r.stdout and "nvidia_repo_key_fingerprints" in r.stdout, r.stdout
        assert fps["evil"] in r.stdout and not dest.exists()
    r, _ = _play(tmp_path, f"{server}/good.asc", [])
    assert r.returncode != 0 and "nvidia_repo_key_fingerprints is empty" in r.stdout and not dest.exists()
    r, _ = _play(tmp_path, f"{server}/good.asc", ["3BF863CC"])  # a short key id is no pin
    assert r.returncode != 0 and "expected a list of OpenPGP fingerprints" in r.stdout and not dest.exists()


def test_a_swapped_key_on_the_node_is_replaced_or_removed(tmp_path: Path, keys: tuple[Path, dict[str, str]],
                                                          server: str) -> None:
    d, fps = keys
    dest = tmp_path / "files" / "keyrings" / "repo.asc"
    dest.parent.mkdir(parents=True)
    shutil.copy(d / "evil.asc", dest)  # someone put another key where apt reads it
    r, res = _play(tmp_path, f"{server}/good.asc", [fps["good"]], "--check")
    assert r.returncode == 0 and res["changed"] and res["resources"] == [["file", str(dest)]]
    assert dest.read_bytes() == (d / "evil.asc").read_bytes()  # check mode changes nothing
    r, res = _play(tmp_path, f"{server}/good.asc", [fps["good"]])
    assert r.returncode == 0 and res["changed"] and dest.read_bytes() == (d / "good.asc").read_bytes()
    shutil.copy(d / "evil.asc", dest)
    r, _ = _play(tmp_path, f"{server}/evil.asc", [fps["good"]])  # and the mirror serves it too: refused, removed
    assert r.returncode != 0 and "was removed" in r.stdout and not dest.exists()
