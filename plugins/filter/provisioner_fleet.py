"""`provisioner_fleet_targets`: the inventory's vLLM cluster heads, GPU nodes and balancers, computed by the suite's
own Python (provisioner.monitoring.fleet_targets over the Fleet model), so the roles and the CLI
(`provision monitoring`, provisioner.monitoring.render_lb_config) cannot disagree on clusters, models or addresses.

    serving_lb_fleet: "{{ inventory_file | provisioner.gpu.provisioner_fleet_targets }}"   (monitoring: monitoring_fleet)

The fleet is read from the inventory file with the suite's loader (as provisioner_vllm.py does). The `provisioner`
package must be installed in the controller's Python (pip; an execution environment installs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_CACHE: dict[str, Any] = {}


def provisioner_fleet_targets(inventory_file: str) -> Any:
    from provisioner.inventory import load_fleet
    from provisioner.monitoring import fleet_targets

    key = str(Path(inventory_file).resolve())
    if key not in _CACHE:
        _CACHE[key] = fleet_targets(load_fleet(key))
    return _CACHE[key]


class FilterModule:
    def filters(self):
        return {"provisioner_fleet_targets": provisioner_fleet_targets}
