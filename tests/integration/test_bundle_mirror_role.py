"""Role bundle_mirror without a rack: its checks refuse a mirror with no usable certificate before touching the host
(and never print the key), and its nginx server block, rendered by Ansible's templar from the role's defaults, is
HTTPS with the site's certificate, plain HTTP (the signed apt repository only) only where the site asks. The role
serving a bundle on a real host: tests/vllm/test_airgap.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from provisioner import PROJECT_ROOT, ROLES

ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
ROLE = ROLES / "bundle_mirror"
SECRET = "-----BEGIN PRIVATE KEY-----x\nTOPSECRETKEYBODY\n"  # a key of the wrong shape: never shown


def _play(tmp: Path, extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    bundle = tmp / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "manifest.json").write_text("{}\n")
    (tmp / "inventory.ini").write_text("[bundle_mirror]\nmirror01 ansible_connection=local\n")
    (tmp / "play.yml").write_text(textwrap.dedent(f"""\
        ---
        - name: Bundle mirror checks
          hosts: bundle_mirror
          gather_facts: false
          roles:
            - role: bundle_mirror
              vars:
                bundle_mirror_source: {bundle}
                bundle_mirror_release: debian12
                bundle_mirror_dir: {tmp}/srv
        """))
    args = [str(ANSIBLE_PLAYBOOK), "-i", str(tmp / "inventory.ini"), str(tmp / "play.yml")]
    for k, v in extra.items():
        args += ["-e", f"{k}={v}"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROLES),
               ANSIBLE_LOCAL_TEMP=str(tmp / ".tmp"), ANSIBLE_REMOTE_TEMP=str(tmp / ".tmp"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, cwd=PROJECT_ROOT)


@pytest.mark.parametrize(("extra", "found"), [
    ({}, "found certificate empty, key empty"),
    ({"bundle_mirror_tls_certificate": "not a cert", "bundle_mirror_tls_key": SECRET},
     "found certificate not PEM, key not PEM (not shown)"),
    ({"bundle_mirror_tls": "false"}, "bundle_mirror_tls: false with bundle_mirror_http_port"),
])
def test_a_mirror_without_a_usable_certificate_is_refused_before_the_host_is_touched(
        tmp_path: Path, extra: dict[str, str], found: str) -> None:
    r = _play(tmp_path, extra)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0, out
    assert "mirror01: the mirror serves HTTPS (bundle_mirror_tls, the default): bundle_mirror_tls_certificate" in out
    assert found in out and "site_ca_certificates" in out
    assert "TOPSECRETKEYBODY" not in r.stdout + r.stderr
    assert not (tmp_path / "srv").exists()  # stopped before the bundle directory


def _render(**extra: object) -> str:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    loader = DataLoader()
    variables = dict(loader.load_from_file(str(ROLE / "defaults/main.yml"), trusted_as_template=True))
    variables.update(extra)
    variables["ansible_facts"] = {"distribution": "Debian", "distribution_major_version": "12"}
    text = (ROLE / "templates/provisioner-bundle.conf.j2").read_text()
    return str(Templar(loader=loader, variables=variables).template(trust_as_template(text)))


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_the_server_block_is_https_with_the_site_certificate_by_default() -> None:
    got = _lines(_render())
    assert got[:5] == ["server {", "listen 8091 ssl;", "ssl_certificate /etc/nginx/provisioner-bundle-tls/server.pem;",
                       "ssl_certificate_key /etc/nginx/provisioner-bundle-tls/server.key;",
                       "ssl_protocols TLSv1.2 TLSv1.3;"]
    assert sum(line.startswith("listen") for line in got) == 1  # no plain HTTP


def test_plain_http_only_where_the_site_asks_and_only_for_the_signed_apt_repository() -> None:
    both = _render(bundle_mirror_http_port=8090, bundle_mirror_listen_address="198.18.9.11")
    listens = [line for line in _lines(both) if line.startswith("listen")]
    assert listens == ["listen 198.18.9.11:8091 ssl;", "listen 198.18.9.11:8090;"]
    http = both.split("listen 198.18.9.11:8090;")[1]
    assert "location /apt/ {" in http and "return 403;" in http and "ssl_" not in http
    only_http = _lines(_render(bundle_mirror_tls=False, bundle_mirror_http_port=8090))
    assert [line for line in only_http if line.startswith(("listen", "ssl_"))] == ["listen 8090;"]
