"""The firmware a node reports itself (GPU VBIOS from nvidia-smi, the InfiniBand HCAs' fw_ver): one SSH exec per
host with the preflight's connection settings; the parsing is provisioner/bmc/firmware.py's `items_from_node`."""

from __future__ import annotations

from provisioner.bmc.firmware import NODE_COMMAND, Item, items_from_node
from provisioner.model import Fleet
from provisioner.probes.ssh import run_many, target_for


def read_nodes(fleet: Fleet, hosts: list[str], timeout: float = 30.0) -> dict[str, tuple[list[Item], str | None]]:
    """host -> (its node-reported items, None) or ([], why it could not be read: one line)."""
    out: dict[str, tuple[list[Item], str | None]] = {}
    if not hosts:
        return out
    results = run_many([target_for(fleet.hosts[h]) for h in hosts], NODE_COMMAND, timeout=timeout)
    for h in hosts:
        r = results[h]
        if not r.ok:
            out[h] = ([], f"unreachable over SSH: {r.error}")
        elif r.rc != 0:
            out[h] = ([], f"the firmware read exited {r.rc}: {(r.stderr.strip() or 'no output')[:200]}")
        else:
            out[h] = (items_from_node(r.stdout), None)
    return out
