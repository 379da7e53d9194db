"""Helpers more than one command needs, so that commands never import each other. Light at import time (no CLI
framework): `provision preflight`'s fast path imports this."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from provisioner.errors import UsageError


def validate(fleet: Any, targeted: set[str] | None = None) -> tuple[list[Any], list[Any]]:
    """(errors that block, warnings) from provisioner.rules. Errors on hosts outside `targeted` become warnings."""
    from provisioner.rules import run_rules, split_findings

    return split_findings(list(run_rules(fleet)), targeted)


def finding_line(f: Any) -> str:
    """`Finding.line()` (the same line the validate action plugin prints); tolerant of other objects."""
    line = getattr(f, "line", None)
    return line() if callable(line) else str(f)


def select(fleet: Any, inventory: Path, limit: Optional[str]) -> list[str]:
    """The GPU nodes `--limit` picks (retry files and regexes are resolved by Ansible itself)."""
    from provisioner.probes.preflight import select_hosts

    if limit and any(c in limit for c in "@~"):
        from provisioner.runner import resolve_limit, target_hosts

        allowed = set(target_hosts(inventory, resolve_limit(limit)))
        return [h for h in select_hosts(fleet, None) if h in allowed]
    return select_hosts(fleet, limit)


def load_targets(inventory: Path, limit: str | None, fmt: str, timeout: float, forks: int) -> tuple[Any, list[Any]]:
    """Check the options shared by `preflight` and `health`, load the fleet and pick the GPU nodes to reach."""
    from provisioner.inventory import load_fleet

    if fmt not in ("text", "json"):
        raise UsageError(f"--format must be text or json, got {fmt!r}")
    if timeout <= 0 or forks < 1:
        raise UsageError("--timeout must be > 0 and --forks >= 1")
    fleet = load_fleet(inventory)
    hosts = select(fleet, inventory, limit)
    if not hosts:
        raise UsageError(f"no GPU nodes match{' --limit ' + limit if limit else ''}", path=str(inventory))
    return fleet, hosts
