"""A site with its own mirror, CA and credentialed proxy, on a real rack host (roles site_trust + vllm's venv steps).

On the controller (tests/testbed/site_mirror.py): a fresh site CA; an HTTPS PEP 503 index `https://mirror.site.test/`
with a certificate signed by it, bound to 127.0.0.1 only (the host cannot reach it directly, and has no DNS); a
CONNECT-only proxy on the rack's bridge address that wants credentials, logs each CONNECT target with the client
address and maps `mirror.site.test:443` to the index. Two tiny wheels built here are the packages.

Why not vLLM itself: the plain rack has no vLLM, and a stand-in `vllm` wheel would then meet vLLM's own parser
(argcheck). The vllm role's download steps live in `tasks/venv.yml` (OS packages, venv, the pinned package from
`vllm_pip_index_url`, `vllm_pip_extra_packages`), so a play runs exactly those tasks (include_role tasks_from: venv,
which pulls in site_trust as the role's dependency) with `vllm_package: sitepkg`, `vllm_version: 1.0.0`,
`vllm_pip_extra_packages: [siteextra==1.0.0]`: the real pip step, pinned, against the site mirror.

Order (one fresh host, rack PROVISIONER_TRUST_RACK, default `trust`, reset first):
1. proxy but no CA variable: pip fails with a certificate error (the proxy did carry the CONNECT): the CA is what
   makes it work;
2. CA but no proxy: pip fails (mirror.site.test cannot be resolved from the host);
3. both: sitepkg/siteextra installed; CONNECT mirror.site.test:443 from the host's address; the CA file in
   /usr/local/share/ca-certificates and in /etc/ssl/certs/ca-certificates.crt; the proxy password in no output and
   in no file on the host; second run changed=0; --check --diff changed=0;
4. `provision run` (site.yml without the vLLM area) with the site variables in the inventory, then `provision drift`:
   nothing;
5. the CA dropped from the inventory: its file and bundle entry are removed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import PROJECT_ROOT

pytestmark = pytest.mark.testbed

BIN = Path(sys.executable).parent
RACK = os.environ.get("PROVISIONER_TRUST_RACK", "trust")
USER, PASSWORD = "sitebuild", "pr0xy-s3cret-7f2a"
VENV = "/opt/site-trust-test/venv"
PLAY = """\
- name: Site trust and the vllm role's download steps
  hosts: gpu_nodes
  gather_facts: false
  become: true
  roles:
    - role: site_trust
  tasks:
    - name: The vllm role's venv and pinned pip install (tasks/venv.yml)
      ansible.builtin.include_role:
        name: vllm
        tasks_from: venv
"""


@dataclass
class Site:
    h: Any  # rack.Handle
    host: str
    addr: str
    inv: Path  # a copy of the rack's inventory with the site variables
    work: Path
    ca_pem: str
    proxy: Any
    mirror: Any
    outputs: list[str]

    def play(self, *extra: str, **overrides: Any) -> subprocess.CompletedProcess[str]:
        evars = {"vllm_package": "sitepkg", "vllm_version": "1.0.0", "vllm_venv": VENV,
                 "vllm_pip_extra_packages": ["siteextra==1.0.0"], **overrides}
        ef = self.work / "extra.json"
        ef.write_text(json.dumps(evars))
        pb = self.work / "play.yml"
        pb.write_text(PLAY)
        env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_CACHE_PLUGIN_CONNECTION=str(self.work / "facts"))
        r = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(self.inv), str(pb), "-e", f"@{ef}", *extra],
                           capture_output=True, text=True, env=env, cwd=PROJECT_ROOT, timeout=900)
        self.outputs.append(r.stdout + r.stderr)
        return r

    def provision(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PROVISION_RUNS_DIR=str(self.work / "runs"))
        r = subprocess.run([str(BIN / "provision"), *args], capture_output=True, text=True, env=env,
                           cwd=PROJECT_ROOT, timeout=1800)
        self.outputs.append(r.stdout + r.stderr)
        return r

    def ssh(self, cmd: str) -> subprocess.CompletedProcess[str]:
        return self.h.ssh(self.host, cmd)

    def connects(self) -> list[str]:
        return [x for x in self.proxy.log if x.startswith(f"CONNECT mirror.site.test:443 from {self.addr} ")]


def _recap(out: str, host: str) -> dict[str, int]:
    m = re.search(rf"^{host}\s*:\s*(.*)$", out, re.M)
    assert m, out[-3000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


class _NoVault(yaml.SafeLoader):
    """Reads the rack's group_vars/all.yml without its vaulted values."""


_NoVault.add_constructor("!vault", lambda loader, node: None)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root")
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make the site CA")
    from provisioner_testbed import rack
    from site_mirror import ConnectProxy, SiteMirror, make_ca, make_wheel

    existed = rack.RackState.load(RACK) is not None
    rack.ensure(RACK, 1, log=lambda m: print(f"testbed: {m}"))
    rack.reset(RACK, log=lambda m: print(f"testbed: {m}"))  # a fresh disk: no CA, no venv
    h = rack.ensure(RACK, 1)
    host, addr = next(iter(h.hosts.items()))
    work = tmp_path_factory.mktemp("site")
    pki = make_ca(work / "pki")
    wheels = [make_wheel(work / "wheels", "sitepkg", "1.0.0"), make_wheel(work / "wheels", "siteextra", "1.0.0")]
    mirror = SiteMirror(pki, wheels)
    proxy = ConnectProxy(h.gateway, {"mirror.site.test:443": ("127.0.0.1", mirror.port)}, USER, PASSWORD)
    # a copy of the rack's inventory with the site's variables added to its group_vars/all.yml
    inv_dir = work / "inventory"
    shutil.copytree(Path(h.inventory).parent, inv_dir)
    ca_pem = pki.ca_pem.read_text().strip()
    all_yml = inv_dir / "group_vars/all.yml"
    # the rack's own CA (its HTTPS stand-in repo) stays beside the site's: the appended key replaces the rack's
    rack_cas = (yaml.load(all_yml.read_text(), Loader=_NoVault) or {}).get("site_ca_certificates") or []
    all_yml.write_text(all_yml.read_text() + yaml.safe_dump({
        "site_ca_certificates": [*rack_cas, ca_pem],
        "site_https_proxy": proxy.url.replace("http://", f"http://{USER}:{PASSWORD}@"),
        "site_no_proxy": [h.gateway, "localhost", "127.0.0.1"],
        "vllm_pip_index_url": "https://mirror.site.test/simple/",
    }, explicit_start=False))
    s = Site(h=h, host=host, addr=addr, inv=inv_dir / Path(h.inventory).name, work=work, ca_pem=ca_pem,
             proxy=proxy, mirror=mirror, outputs=[])
    try:
        yield s
    finally:
        proxy.close()
        mirror.close()
        if not existed and os.environ.get("PROVISIONER_TESTBED_TEARDOWN") == "1":
            rack.down(RACK)


# one retry: pip prints the connection error of the first try as a warning (with none it only says "no version")
FAST_FAIL = {"vllm_pip_extra_args": "--retries 1 --timeout 10"}


def test_without_the_ca_variable_pip_fails_on_the_certificate(site: Site) -> None:
    r = site.play(**FAST_FAIL, site_ca_certificates=[])
    assert r.returncode != 0, r.stdout[-3000:]
    assert "Pinned vLLM from the configured index" in r.stdout
    assert re.search(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed", r.stdout), r.stdout[-3000:]
    assert site.connects(), f"no CONNECT from {site.addr}: {site.proxy.log}"  # the proxy did its part
    assert site.ssh("ls /usr/local/share/ca-certificates/").stdout.strip() == ""


def test_without_the_proxy_pip_cannot_reach_the_mirror(site: Site) -> None:
    before = len(site.connects())
    r = site.play(**FAST_FAIL, site_https_proxy="")
    assert r.returncode != 0, r.stdout[-3000:]
    assert "Pinned vLLM from the configured index" in r.stdout
    assert re.search(r"name resolution|Name or service not known|NameResolutionError|Failed to establish a new connection",
                     r.stdout), r.stdout[-3000:]
    assert "CERTIFICATE_VERIFY_FAILED" not in r.stdout
    assert len(site.connects()) == before


def test_with_ca_and_proxy_the_package_installs_and_stays_converged(site: Site) -> None:
    r = site.play()
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert _recap(r.stdout, site.host)["changed"] >= 2
    v = site.ssh(f"{VENV}/bin/python -c 'import sitepkg, siteextra; print(sitepkg.VERSION, siteextra.VERSION)'")
    assert v.stdout.split() == ["1.0.0", "1.0.0"], v.stdout + v.stderr
    assert any(x.endswith(" 200") for x in site.connects()), site.proxy.log
    assert "/files/sitepkg-1.0.0-py3-none-any.whl" in site.mirror.requests
    # the CA: its own file (0644 root) and an entry in the system bundle
    files = site.ssh("stat -c '%n %a %U' /usr/local/share/ca-certificates/*.crt").stdout.split("\n")
    files = [f for f in files if f]
    # the site's CA and the rack's own (its HTTPS stand-in repo), one file each
    assert len(files) == 2 and all(re.fullmatch(r"\S+/provisioner-site-[0-9a-f]{16}\.crt 644 root", f)
                                   for f in files), files
    assert site.ca_pem in [site.ssh(f"cat {f.split()[0]}").stdout.strip() for f in files]
    body = "".join(site.ca_pem.splitlines()[1:-1])
    bundle = "".join(site.ssh("cat /etc/ssl/certs/ca-certificates.crt").stdout.split())
    assert body in bundle
    # idempotent, and check mode sees nothing to do
    again = site.play()
    assert again.returncode == 0 and _recap(again.stdout, site.host)["changed"] == 0, again.stdout[-4000:]
    check = site.play("--check", "--diff")
    assert check.returncode == 0 and _recap(check.stdout, site.host)["changed"] == 0, check.stdout[-4000:]


def test_site_run_and_drift_are_clean_with_the_site_variables(site: Site) -> None:
    r = site.provision("run", str(site.inv), "--skip-tags", "vllm")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    d = site.provision("drift", str(site.inv), "--skip-tags", "vllm")
    assert d.returncode == 0, d.stdout[-4000:] + d.stderr[-2000:]


def test_a_ca_dropped_from_the_inventory_leaves_the_host(site: Site) -> None:
    r = site.play(site_ca_certificates=[])
    assert r.returncode == 0, r.stdout[-4000:]
    assert _recap(r.stdout, site.host)["changed"] == 2  # the file removed, the bundle rebuilt
    assert site.ssh("ls /usr/local/share/ca-certificates/").stdout.strip() == ""
    body = "".join(site.ca_pem.splitlines()[1:-1])
    assert body not in "".join(site.ssh("cat /etc/ssl/certs/ca-certificates.crt").stdout.split())


def test_the_proxy_password_is_in_no_output_and_no_file_on_the_host(site: Site) -> None:
    assert site.outputs, "no runs"
    for out in site.outputs:
        assert PASSWORD not in out
    for runs in (site.work / "runs").glob("**/*"):
        if runs.is_file() and runs.suffix in (".json", ".txt", ".log", ".xml", ""):
            assert PASSWORD not in runs.read_text(errors="replace"), runs
    r = site.ssh(f"grep -rlsF {PASSWORD} /etc /opt /usr/local /var/lib /var/log /root /tmp /var/tmp; true")
    assert r.stdout.strip() == "", r.stdout
