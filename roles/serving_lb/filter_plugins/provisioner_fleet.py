"""`provisioner_fleet_targets`: the inventory's vLLM cluster heads, GPU nodes and balancers, computed by the suite's
own Python (provisioner.monitoring.fleet_targets over the Fleet model), so the roles and the CLI
(`provision monitoring`, provisioner.monitoring.render_lb_config) cannot disagree on clusters, models or addresses.

    serving_lb_fleet: "{{ hostvars | provisioner_fleet_targets }}"   (monitoring: monitoring_fleet)

The fleet is the play's own inventory as Ansible resolved it (`hostvars`, with the `-e` extra vars on top;
provisioner.inventory.fleet_from_play, as roles/vllm's plugin), never the inventory file read again. The project
root (installed: the site-packages holding provisioner/_data/) is put on sys.path when the `provisioner` package is
not importable (AWX-style checkouts).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# The directory holding the `provisioner` package: the repository root (<root>/roles/R/filter_plugins/this.py), or,
# for an installed wheel, site-packages (<site-packages>/provisioner/_data/roles/R/filter_plugins/this.py).
_HERE = Path(__file__).resolve()
_ROOT = _HERE.parents[5] if _HERE.parents[3].name == "_data" else _HERE.parents[3]


def provisioner_fleet_targets(hostvars: Any) -> Any:
    try:
        import provisioner.monitoring  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(_ROOT))
    from provisioner.inventory import fleet_from_play
    from provisioner.monitoring import fleet_targets

    return fleet_targets(fleet_from_play(hostvars))


class FilterModule:
    def filters(self):
        return {"provisioner_fleet_targets": provisioner_fleet_targets}
