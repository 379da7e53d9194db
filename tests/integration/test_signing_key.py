"""provisioner.gpu.provisioner_signing_key through ansible-playbook (connection local, a key server on loopback): the
repository key is installed only when its fingerprint is pinned, a wrong one is refused naming the variable (nothing
written; a key on the node that fails the pin is removed), check mode downloads nothing. Keys are made by gpg and
the module's own fingerprints are checked against gpg's. Four runs in all (a module-scoped fixture): the cases are
hosts of the same runs, each with its own files, and each test reads its hosts' results (the tree callback's).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    """)
#: the refusals, each a host of the same run: (host, key served, pinned: None = the good key's fingerprint)
WRONG = [("evil_asc", "evil.asc", None), ("evil_gpg", "evil.gpg", None), ("both", "both.asc", None),
         ("empty", "good.asc", []), ("short_id", "good.asc", ["3BF863CC"])]


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


@dataclass
class Seen:
    rc: int  # the run's exit status (a run holds several hosts: each one's own outcome is `failed` and `res`)
    failed: bool  # the host's failed count in the run's recap
    res: dict[str, Any]  # the module's result on this host (the tree callback's file)
    key: bytes | None  # the key file on this host after the run


def _play(tmp_path: Path, url: str, hosts: dict[str, tuple[str, list[str]]], *args: str) -> dict[str, Seen]:
    """One ansible-playbook run over `hosts` ({name: (key served, pinned)}), each a local-connection host with a root
    of its own under tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and "proxy" not in k.lower()}
    tree = tmp_path / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    env.update(ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_PATH=str(PROJECT_ROOT / "collections"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_REMOTE_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"),
               ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.tree", ANSIBLE_CALLBACK_TREE_DIR=str(tree))
    (tmp_path / "play.yml").write_text(PLAY)
    inv = {"all": {"children": {"local": {"hosts": {
        h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "root": str(tmp_path / h),
            "key_url": f"{url}/{served}", "pinned": pinned} for h, (served, pinned) in hosts.items()}}}}}
    (tmp_path / "hosts.yml").write_text(json.dumps(inv))
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"),
                        *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "PLAY RECAP" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    recap = {m[1]: int(m[2]) for m in re.finditer(r"^(\S+)\s+: ok=\d+ .*?failed=(\d+)", r.stdout, re.M)}
    assert sorted(recap) == sorted(hosts), r.stdout[-3000:]
    out = {}
    for h in hosts:
        dest = tmp_path / h / "keyrings" / "repo.asc"
        res = json.loads((tree / h).read_text()) if (tree / h).is_file() else {}
        out[h] = Seen(r.returncode, recap[h] > 0, res, dest.read_bytes() if dest.is_file() else None)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, dict[str, str]],
         server: str) -> Iterator[tuple[Path, list[dict[str, Seen]]]]:
    """Four runs; host `pin` installs the pinned key, host `swap` starts with a stranger's key where apt reads it,
    and in the second run each refusal of WRONG is a host of its own."""
    d, fps = keys
    tmp = tmp_path_factory.mktemp("signing")
    good = fps["good"]
    dest = tmp / "swap" / "keyrings" / "repo.asc"
    dest.parent.mkdir(parents=True)
    shutil.copy(d / "evil.asc", dest)  # someone put another key where apt reads it
    spaced = " ".join(good[i:i + 4] for i in range(0, 40, 4)).lower()  # as `gpg -k` prints it
    seen = [_play(tmp, server, {"pin": ("good.asc", [good]), "swap": ("good.asc", [good])}, "--check"),
            _play(tmp, server, {"pin": ("good.asc", [spaced]), "swap": ("good.asc", [good]),
                                **{h: (served, [good] if pinned is None else pinned) for h, served, pinned in WRONG}})]
    shutil.copy(d / "evil.asc", dest)
    seen.append(_play(tmp, server, {"pin": ("good.asc", [good]), "swap": ("evil.asc", [good])}))
    seen.append(_play(tmp, server, {"pin": ("good.gpg", [good, fps["evil"]])}))  # binary key, either pin
    yield tmp, seen


def _ok(s: Seen) -> bool:
    return bool(s.res) and not s.failed


def test_pinned_key_is_installed_once_and_kept(keys: tuple[Path, dict[str, str]],
                                               runs: tuple[Path, list[dict[str, Seen]]]) -> None:
    d, fps = keys
    _, seen = runs
    check, first, again, binary = (r["pin"] for r in seen)
    assert _ok(check) and check.res["changed"] and check.key is None, check.res  # check mode: no download
    assert _ok(first) and first.res["changed"], first.res
    assert first.res["fingerprints"] == [fps["good"]]  # the module's parser agrees with gpg
    assert first.key == (d / "good.asc").read_bytes()
    assert (runs[0] / "pin" / "keyrings" / "repo.asc").stat().st_mode & 0o777 == 0o644
    assert _ok(again) and not again.res["changed"] and again.res["resources"] == []
    assert binary.rc == 0 and _ok(binary) and not binary.res["changed"]  # the file on the node passes: kept


def test_wrong_fingerprint_is_refused_naming_the_variable(keys: tuple[Path, dict[str, str]],
                                                          runs: tuple[Path, list[dict[str, Seen]]]) -> None:
    d, fps = keys
    run = runs[1][1]
    assert run["pin"].rc != 0  # the refusals fail the run
    for host in ("evil_asc", "evil_gpg", "both"):  # another key, or the right one with a stranger beside it
        s = run[host]
        assert s.failed, (host, s.res)
        assert "refusing the repository key" in s.res["msg"] and "nvidia_repo_key_fingerprints" in s.res["msg"]
        assert fps["evil"] in s.res["msg"] and s.key is None, (host, s.res["msg"])
    s = run["empty"]
    assert s.failed and "nvidia_repo_key_fingerprints is empty" in s.res["msg"] and s.key is None
    s = run["short_id"]  # a short key id is no pin
    assert s.failed and "expected a list of OpenPGP fingerprints" in s.res["msg"] and s.key is None


def test_a_swapped_key_on_the_node_is_replaced_or_removed(keys: tuple[Path, dict[str, str]],
                                                          runs: tuple[Path, list[dict[str, Seen]]]) -> None:
    d, fps = keys
    tmp, seen = runs
    check, fixed, refused = (r["swap"] for r in seen[:3])
    dest = tmp / "swap" / "keyrings" / "repo.asc"
    assert _ok(check) and check.res["changed"] and check.res["resources"] == [["file", str(dest)]], check.res
    assert check.key == (d / "evil.asc").read_bytes()  # check mode changes nothing
    assert _ok(fixed) and fixed.res["changed"] and fixed.key == (d / "good.asc").read_bytes()
    # the stranger's key put back, and the mirror serves it too: refused, removed
    assert refused.failed and "was removed" in refused.res["msg"] and refused.key is None
