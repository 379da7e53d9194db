"""`provisioner_fleet_targets`: the inventory's vLLM cluster heads, GPU nodes and balancers, computed by the suite's
own Python (provisioner.monitoring.fleet_targets over the Fleet model), so the roles and the CLI
(`provision monitoring`, provisioner.monitoring.render_lb_config) cannot disagree on clusters, models or addresses.

    serving_lb_fleet: "{{ hostvars | provisioner.gpu.provisioner_fleet_targets }}"   (monitoring: monitoring_fleet)

The fleet is the play's own inventory as Ansible resolved it (`hostvars`, with the `-e` extra vars on top;
provisioner.inventory.fleet_from_play), never the inventory file read again. The `provisioner` package must be
installed in the controller's Python (pip; an execution environment installs it).
"""

from __future__ import annotations

from typing import Any


def provisioner_fleet_targets(hostvars: Any) -> Any:
    from provisioner.inventory import fleet_from_play
    from provisioner.monitoring import fleet_targets

    return fleet_targets(fleet_from_play(hostvars))


class FilterModule:
    def filters(self):
        return {"provisioner_fleet_targets": provisioner_fleet_targets}
