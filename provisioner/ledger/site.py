"""Which site an inventory's ledger records belong to: the inventory variable `provision_site` (set for the whole
inventory: group `all`), else the inventory's resolved absolute path. Two inventories in one checkout (two racks that
both have a `node01`) are two sites: each sees its own hosts' states, runs and recorded states only."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from provisioner.errors import UsageError

VAR = "provision_site"
#: a site name: printable, no control characters, bounded
NAME = re.compile(r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]{1,200}")


def site_name(value: Any, where: str = "") -> str:
    """A `provision_site` value checked: a non-empty string of at most 200 printable characters."""
    if not isinstance(value, str) or not NAME.fullmatch(value) or not value.strip():
        raise UsageError(f"{VAR} must be a non-empty string of at most 200 printable characters, not {value!r}",
                         path=where or None)
    return value.strip()


def site_of(fleet: Any) -> str:
    """The site of a loaded inventory (a `model.Fleet`): `provision_site` of group `all`, else the value every host
    carries (set on a group above them all), else the resolved path of the inventory source."""
    where = str(fleet.source)
    value = (fleet.group_vars.get("all") or {}).get(VAR)
    if value is None:
        seen = {h.vars.get(VAR) for h in fleet.hosts.values()}
        if len(seen) == 1 and None not in seen:
            value = seen.pop()
        elif len(seen - {None}) > 1:
            values = ", ".join(sorted(map(str, seen - {None})))
            raise UsageError(f"{VAR} differs between hosts ({values}): set it once for the whole inventory "
                             "(group all)", path=where)
    if value is not None:
        return site_name(value, where)
    return path_site(fleet.source)


def path_site(inventory: str | os.PathLike[str]) -> str:
    """The site of an inventory without `provision_site`: its resolved absolute path."""
    return str(Path(os.path.abspath(inventory)).resolve())


def site_for(inventory: str | os.PathLike[str], fleet: Any = None) -> str:
    """The site of the inventory at `inventory` (loaded here unless `fleet` is given)."""
    if fleet is None:
        from provisioner.inventory import load_fleet

        fleet = load_fleet(inventory)
    return site_of(fleet)
