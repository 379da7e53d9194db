"""Load a tmp inventory and run the rules in-process (the same code the CLI runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inventory_factory import write_inventory
from provisioner.inventory import load_fleet
from provisioner.rules import Finding, build_context, run_rules


def findings(tmp_path: Path, code: str | None = None, **spec: Any) -> list[Finding]:
    fleet = load_fleet(write_inventory(tmp_path, **spec))
    out = run_rules(fleet, build_context(fleet))
    return [f for f in out if code is None or f.code == code]
