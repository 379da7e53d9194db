"""The rack's network: a Linux bridge of its own in 198.18.0.0/15, one /24 per rack, no NAT and no route out.

Rack index K (0..511) owns 198.18.K.0/24 (K >= 256: 198.19.(K-256).0/24); the controller is .1 on the bridge,
host i (1-based) is .(10+i). Bridge names: `pvbr<K>` (the default rack, K=0, gets `pvbr0`).
"""

from __future__ import annotations

import ipaddress
import subprocess

BASE = ipaddress.IPv4Network("198.18.0.0/15")
MAX_RACKS = 512
FIRST_HOST_OCTET = 11
MAX_HOSTS = 254 - FIRST_HOST_OCTET + 1


def subnet(index: int) -> ipaddress.IPv4Network:
    if not 0 <= index < MAX_RACKS:
        raise ValueError(f"rack index {index} outside 0..{MAX_RACKS - 1}")
    return ipaddress.IPv4Network((int(BASE.network_address) + index * 256, 24))


def gateway(index: int) -> str:
    return str(subnet(index).network_address + 1)


def host_address(index: int, host: int) -> str:
    """Address of host number `host` (1-based) in rack `index`."""
    if not 1 <= host <= MAX_HOSTS:
        raise ValueError(f"host number {host} outside 1..{MAX_HOSTS}")
    return str(subnet(index).network_address + FIRST_HOST_OCTET - 1 + host)


def bridge_name(index: int) -> str:
    return f"pvbr{index}"


def machine_name(index: int, host: int) -> str:
    """nspawn machine name; its veth is `vb-<name>` (at most 15 chars), so keep it short and unique across racks."""
    return f"pv{index}-{host:02d}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def ensure_bridge(index: int) -> str:
    """Create the rack's bridge with the controller address (idempotent); return its name."""
    br = bridge_name(index)
    if not link_exists(br):
        _ip("link", "add", "name", br, "type", "bridge")
    cidr = f"{gateway(index)}/24"
    have = _ip("-o", "-4", "addr", "show", "dev", br).stdout
    if f" {cidr} " not in have:
        _ip("addr", "add", cidr, "dev", br)
    # No IPv6 autoconfiguration chatter on the rack network.
    subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{br}.disable_ipv6=1"], capture_output=True)
    _ip("link", "set", br, "up")
    return br


def delete_link(name: str) -> None:
    if link_exists(name):
        _ip("link", "del", name, check=False)


def bridges() -> list[str]:
    """Every pvbr* bridge on this machine."""
    out = _ip("-o", "link", "show", "type", "bridge", check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            n = parts[1].strip().split("@")[0]
            if n.startswith("pvbr") and n[4:].isdigit():
                names.append(n)
    return names


def veths_of(index: int) -> list[str]:
    """Host-side veths nspawn made for this rack's machines (normally removed with the container)."""
    out = _ip("-o", "link", "show", check=False).stdout
    prefix = f"vb-pv{index}-"
    names = []
    for line in out.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            n = parts[1].strip().split("@")[0]
            if n.startswith(prefix):
                names.append(n)
    return names


#: Every host's systemd takes several inotify instances; the kernel default (128 per user, and all hosts run as
#: root) runs out at ~20 hosts on one machine ("Failed to allocate manager object: Too many open files").
HOST_LIMITS: dict[str, int] = {
    "fs.inotify.max_user_instances": 8192,
    "fs.inotify.max_user_watches": 1048576,
}


def ensure_host_limits() -> list[str]:
    """Raise the controller's limits that many booted hosts need (never lowers them); return what changed."""
    from pathlib import Path

    changed = []
    for key, want in HOST_LIMITS.items():
        p = Path("/proc/sys") / key.replace(".", "/")
        try:
            have = int(p.read_text().split()[0])
            if have < want:
                p.write_text(str(want))
                changed.append(f"{key} {have} -> {want}")
        except (OSError, ValueError):
            continue
    return changed
