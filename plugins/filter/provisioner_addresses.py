"""Host addresses for the firewall's sets. Pure function, no Ansible imports:

    cluster_firewall_members | provisioner.gpu.provisioner_addresses(hostvars)
        -> each host's ansible_host, else its inventory name, in the given order

Replaces a `lookup('template', ...)` per reference: each forked worker compiled that template again.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping


def provisioner_addresses(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> list[str]:
    """`ansible_host` of each host of `hosts` (its name when unset); a host the inventory lacks is an error."""
    out = []
    for h in hosts:
        if h not in hostvars:
            raise ValueError(f"provisioner_addresses: {h!r} is not a host of the inventory")
        addr = hostvars[h].get("ansible_host")
        out.append(str(addr) if addr not in (None, "") else str(h))
    return out


class FilterModule:
    def filters(self):
        return {"provisioner_addresses": provisioner_addresses}
