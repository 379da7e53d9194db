"""The process cases of tests/unit/test_inventory.py (the unit lane runs in-process);
their data and helpers are tests/support/inventory_shared.py."""

from __future__ import annotations

from pathlib import Path

from inventory_factory import write_inventory
from inventory_shared import TRICKY_INI, _play_fleet, _same

from provisioner.inventory import load_fleet


def test_script_inventory_loads_like_its_ini_twin(tmp_path: Path) -> None:
    from inventory_factory import script_twin

    ini = write_inventory(tmp_path, ini=TRICKY_INI, base=False,
                          group_vars={"c1": {"vllm_cluster": {"model": "/m", "model_arch": "Qwen2-72B"}}})
    script = script_twin(ini, tmp_path / "dynamic.py")
    _same(load_fleet(script), load_fleet(ini))
    _same(_play_fleet(script)[0], load_fleet(ini))
