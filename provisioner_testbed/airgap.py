"""The air-gapped site on the simulated rack: hosts made an isolated site's image, every way out of the rack dropped
and counted on the controller, the rack's inventory pointed at a bundle (benchmarks/bundle_bench.py --rack; the same
steps as tests/vllm/test_airgap.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import yaml

#: What makes a host an isolated site's image: no apt source, no proxy (the rack's, or one an earlier run set), no
#: lists from before.
ISOLATE = ("rm -f /etc/apt/apt.conf.d/80testbed-proxy /etc/apt/apt.conf.d/90provisioner-proxy /etc/apt/sources.list.d/*"
           " && : > /etc/apt/sources.list"
           " && rm -rf /var/lib/apt/lists/* && apt-get clean")


def table_name(rack: str) -> str:
    return "provisioner_airgap_" + re.sub(r"[^A-Za-z0-9_]", "_", rack)


def drop_out_of(net: str, table: str, sources: Iterable[str] = ()) -> None:
    """An nftables table on the controller dropping and counting every packet from `net` that would leave it
    (forward, counter `leaving`) and every new connection from it to the controller (input, `to_controller`).
    `sources`: only packets from these addresses of `net` (the isolated site's hosts on a rack shared with others)."""
    src = f"{{ {', '.join(sources)} }}" if sources else net
    script = f"""table inet {table} {{
  chain out_of_rack {{
    type filter hook forward priority -5; policy accept;
    ip saddr {src} ip daddr != {net} counter drop comment "leaving"
  }}
  chain into_controller {{
    type filter hook input priority -5; policy accept;
    ip saddr {src} ct state new counter drop comment "to_controller"
  }}
}}
"""
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True, capture_output=True)


def counters(table: str) -> dict[str, int]:
    out = subprocess.run(["nft", "list", "table", "inet", table], capture_output=True, text=True, check=True).stdout
    return {name: int(pk) for pk, name in re.findall(r'counter packets (\d+) bytes \d+ drop comment "(\w+)"', out)}


def remove(table: str) -> None:
    subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, check=False)


def plain_inventory(rack_inventory: Path, dest: Path, mirror: str | None) -> Path:
    """A copy of the rack's inventory as `make demo` provisions it (the GPU nodes; no vLLM cluster, no other group
    vars), `mirror` also in group bundle_mirror. Returns the hosts file."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(rack_inventory.parent, dest)
    inv = dest / rack_inventory.name
    gpu = re.search(r"^\[gpu_nodes\]\n(?:.+\n)+", inv.read_text(), re.M)
    if not gpu:
        raise RuntimeError(f"{rack_inventory}: no [gpu_nodes] group")
    inv.write_text(gpu.group(0) + (f"\n[bundle_mirror]\n{mirror}\n" if mirror else ""))
    for gv in (dest / "group_vars").iterdir():
        if gv.stem not in ("all", "gpu_nodes"):
            gv.unlink()
    return inv


def vllm_site_inventory(rack_inventory: Path, dest: Path, host: str, cluster: str, mirror: str,
                        remove_packages: Iterable[str]) -> Path:
    """A copy of a vLLM rack's inventory cut to an isolated site of two of its hosts: `host` the only GPU node and
    the only member of its one-host `cluster` (the rack's cluster settings kept; no onboarding step, so the run
    launches it), `mirror` (another rack host, no GPU node here) in group bundle_mirror. Python packages from a
    site index: vLLM's closure as pip resolves it, `remove_packages` removed after (vllm_pip_remove_packages). The
    rack's other hosts, groups and group_vars are left out. Returns the hosts file."""
    text = rack_inventory.read_text()
    lines = {m.group(1): m.group(0) for m in re.finditer(r"^(\S+) ansible_host=.*$", text, re.M)}
    for h in (host, mirror):
        if h not in lines:
            raise RuntimeError(f"{rack_inventory}: no host {h}")
    if not re.search(rf"^\[{re.escape(cluster)}\]\n{re.escape(host)}\n(\n|\[|$)", text, re.M):
        raise RuntimeError(f"{rack_inventory}: {host} is not the only member of [{cluster}]")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(rack_inventory.parent, dest)
    inv = dest / rack_inventory.name
    mline = re.sub(r" node_rank=\S+", "", lines[mirror])
    inv.write_text(f"[gpu_nodes]\n{lines[host]}\n\n[{cluster}]\n{host}\n\n[bundle_mirror]\n{mline}\n")
    for gv in (dest / "group_vars").iterdir():
        if gv.stem not in ("all", "gpu_nodes", cluster):
            gv.unlink()
    hv_dir = dest / "host_vars"
    for f in hv_dir.iterdir() if hv_dir.is_dir() else ():
        if f.stem not in (host, mirror):
            f.unlink()
    all_yml = dest / "group_vars" / "all.yml"
    if re.search(r"^vllm_pip_remove_packages:", all_yml.read_text(), re.M):
        raise RuntimeError(f"{all_yml}: vllm_pip_remove_packages is set already")
    with open(all_yml, "a") as fh:
        fh.write(yaml.safe_dump({"vllm_pip_remove_packages": list(remove_packages)}))
    with open(dest / "group_vars" / f"{cluster}.yml", "a") as fh:  # no onboarding step: the run launches it
        fh.write(yaml.safe_dump({"vllm_launch_require_in_service": False}))
    return inv


def point_at_bundle(inv_dir: Path, bundle: Path) -> None:
    """group_vars/all.yml of an isolated site: no proxy, the rack's NVIDIA repo settings replaced by the bundle's
    site-vars.yml, the mirror role's source."""
    all_yml = inv_dir / "group_vars" / "all.yml"
    doc = all_yml.read_text()
    doc = re.sub(r"^apt_proxy: .*\n", "", doc, flags=re.M)
    doc = re.sub(r"^nvidia_repo_(url|key_url): .*\n", "", doc, flags=re.M)
    doc = re.sub(r"^nvidia_repo_key_fingerprints:\n(- .*\n)+", "", doc, flags=re.M)
    site_vars = yaml.safe_load((bundle / "site-vars.yml").read_text())
    all_yml.write_text(doc + yaml.safe_dump(site_vars) + yaml.safe_dump({"bundle_mirror_source": str(bundle)}))


def mirror_tls(inv_dir: Path, cert_pem: str, key_pem: str, password_file: Path) -> Path:
    """group_vars/bundle_mirror.yml: the mirror's certificate (issued by the rack's CA, which the rack's inventory
    already gives every node in site_ca_certificates) and its key, vaulted as a site vaults it. Returns the file."""
    from provisioner_testbed.inventory_writer import vault_encrypter

    vaulted = vault_encrypter(password_file)("bundle_mirror_tls_key", key_pem)
    f = inv_dir / "group_vars" / "bundle_mirror.yml"
    f.write_text("---\nbundle_mirror_tls_certificate: |\n" + "".join(f"  {line}\n" for line in cert_pem.splitlines())
                 + "bundle_mirror_tls_key: !vault |\n" + "".join(f"  {line}\n" for line in vaulted.splitlines()))
    return f


def isolate(ssh: object, hosts: Iterable[str]) -> None:
    """Each host as an isolated site's image (`ssh`: the rack handle's ssh(host, command))."""
    for host in hosts:
        r = ssh(host, ISOLATE)  # type: ignore[operator]
        if r.returncode != 0:
            raise RuntimeError(f"{host}: cannot isolate: {r.stderr.strip()[-500:]}")


#: What the rack's own inventory keeps over an example's: the connection, and the interface its simulated hosts have.
RACK_OWNS = ("bootstrap_interface",)


def gpu_node_lines(example: Path) -> list[str]:
    """The host lines of an INI inventory's [gpu_nodes] group (no comments, no blank lines)."""
    gpu = re.search(r"^\[gpu_nodes\]\n((?:[^\[\n].*\n|\s*\n)+)", example.read_text(), re.M)
    if not gpu:
        raise RuntimeError(f"{example}: no [gpu_nodes] group")
    return [ln.strip() for ln in gpu.group(1).splitlines() if ln.strip() and not ln.lstrip().startswith(("#", ";"))]


def shaped_like(example: Path, rack_inventory: Path, rack_hosts: dict[str, str], dest: Path, mirror: str) -> Path:
    """The hosts an example inventory's [gpu_nodes] describes, rewritten to the rack: each host's ansible_host is the
    rack host of the same name (the example's addresses are never used), the example's group_vars/gpu_nodes.yml over
    the rack's (RACK_OWNS kept from the rack), the rack's connection and site variables (group_vars/all.yml: its key,
    known_hosts, CA, repo), `mirror` in group bundle_mirror. The example's vLLM cluster groups are left out (as `make
    demo` leaves them: the CUDA build cannot serve on simulated GPUs). Returns the hosts file."""
    lines = []
    for line in gpu_node_lines(example):
        host, *hv = line.split()
        if host not in rack_hosts:
            raise RuntimeError(f"{example}: host {host} is not in the rack ({', '.join(sorted(rack_hosts))})")
        hv = [v for v in hv if not v.startswith("ansible_host=")]
        lines.append(" ".join([host, f"ansible_host={rack_hosts[host]}", *hv]))
    if mirror not in rack_hosts:
        raise RuntimeError(f"mirror {mirror} is not in the rack")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(rack_inventory.parent, dest)
    inv = dest / rack_inventory.name
    inv.write_text(f"# {example.name}'s [gpu_nodes], rewritten to the rack (benchmarks/bundle_bench.py --like)\n"
                   "[gpu_nodes]\n" + "\n".join(lines)
                   + f"\n\n[bundle_mirror]\n{mirror} ansible_host={rack_hosts[mirror]}\n")
    for gv in (dest / "group_vars").iterdir():
        if gv.stem not in ("all", "gpu_nodes"):
            gv.unlink()
    hv_dir = dest / "host_vars"
    for f in hv_dir.iterdir() if hv_dir.is_dir() else ():
        if f.stem not in {line.split()[0] for line in lines}:
            f.unlink()
    ours = dest / "group_vars" / "gpu_nodes.yml"
    rack_gpu = yaml.safe_load(ours.read_text()) or {}
    theirs = example.parent / "group_vars" / "gpu_nodes.yml"
    merged = {**rack_gpu, **(yaml.safe_load(theirs.read_text()) or {} if theirs.is_file() else {}),
              **{k: rack_gpu[k] for k in RACK_OWNS if k in rack_gpu}}
    ours.write_text(f"# {theirs} over the rack's; {', '.join(RACK_OWNS)} the rack's\n---\n"
                    + yaml.safe_dump(merged, sort_keys=False))
    return inv
