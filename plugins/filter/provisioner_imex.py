"""`provisioner_imex_nodes`: the addresses /etc/nvidia-imex/nodes_config.cfg lists on a tray (every tray of its
nvlink_domain), computed by provisioner.render.imex_nodes over the play's own inventory, so the imex role and
`provision render` write the same bytes.

    imex_nodes: "{{ hostvars | provisioner.gpu.provisioner_imex_nodes(inventory_hostname) }}"

The fleet is the play's inventory with its extra vars (provisioner.inventory.fleet_from_play), never the inventory
file read again (docs/development.md, "Data flow"). The `provisioner` package must be installed in the controller's
Python.
"""

from __future__ import annotations

from typing import Any


def provisioner_imex_nodes(hostvars: Any, host: str) -> list[str]:
    """Sorted by host name; [] when the host runs no IMEX or names no nvlink_domain."""
    from provisioner import render
    from provisioner.inventory import fleet_from_play

    return render.imex_nodes(fleet_from_play(hostvars), str(host))


class FilterModule:
    def filters(self):
        return {"provisioner_imex_nodes": provisioner_imex_nodes}
