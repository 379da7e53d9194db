"""Variable-type rules (VAR0xx): values INI literal-evaluation (or unquoted YAML) has visibly mangled."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from provisioner.model import Fleet
from provisioner.rules import Finding, rule
from provisioner.rules._util import is_number, type_name
from provisioner.rules.context import RuleContext


def _versionish(name: Any) -> bool:
    return isinstance(name, str) and (name == "version" or name.endswith("_version") or name.endswith("_pin"))


def _msg(var: str, v: Any) -> str:
    return (f"{var} arrived as the {type_name(v)} {v!r}: INI [group:vars] and host lines evaluate values as Python "
            f"literals and YAML reads an unquoted 12.10 the same way (12.10 becomes 12.1); quote it "
            f"({var}=\"...\" in INI, {var}: \"...\" in YAML)")


@rule("VAR001", "version string mangled into a number")
def version_as_number(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """A `*_version` variable that is a number was almost always a version string an INI file converted."""
    for g, gv in fleet.group_vars.items():
        for k, v in gv.items():
            if _versionish(k) and is_number(v):
                yield Finding("VAR001", "error", _msg(k, v), group=g, var=k)
    for h in fleet.hosts.values():
        for k, v in h.vars.items():
            if not (_versionish(k) and is_number(v)):
                continue
            # reported above when it comes from one of the host's groups
            if any(fleet.group_vars.get(g, {}).get(k) == v for g in (*h.groups, "all")):
                continue
            yield Finding("VAR001", "error", _msg(k, v), host=h.name, var=k)
