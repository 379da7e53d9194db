"""Validation rules: small pure functions `(fleet, ctx) -> findings`, each with a stable code.

A rule never does I/O: `build_context` (provisioner/rules/context.py) resolves what needs files (model_config) or
vLLM (its argument parser) up front. `run_rules(fleet, ctx)` runs every registered rule in code order.
Codes are documented in docs/inventory.md; never reuse or renumber one.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from provisioner.model import Fleet
from provisioner.rules.context import RuleContext, build_context

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Finding:
    """One problem: `code` (e.g. HW003), where it is (host and/or group, the variable) and what to do about it."""

    code: str
    severity: Severity
    message: str
    host: str | None = None
    group: str | None = None
    var: str | None = None

    def line(self) -> str:
        """One line: code, where (group/host, or fleet), the variable, what to fix (the CLI and the plugin print it)."""
        where = "/".join(x for x in (self.group, self.host) if x) or "fleet"
        var = f" ({self.var})" if self.var else ""
        return f"{self.code} {where}{var}: {self.message}"

    def as_dict(self) -> dict[str, str | None]:
        d = asdict(self)
        d.pop("severity")
        return {k: d[k] for k in ("code", "host", "group", "var", "message")}


RuleFn = Callable[[Fleet, RuleContext], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    code: str
    title: str  # one line: the violation
    fn: RuleFn


RULES: dict[str, Rule] = {}


def rule(code: str, title: str) -> Callable[[RuleFn], RuleFn]:
    """Register `fn` under `code` (unique)."""

    def deco(fn: RuleFn) -> RuleFn:
        assert code not in RULES, f"duplicate rule code {code}"
        RULES[code] = Rule(code, title, fn)
        return fn

    return deco


def _load_all() -> None:
    from provisioner.rules import cluster, env, firmware, flags, hardware, memory, nccl, nvlink, supply, text, types  # noqa: F401,E501
    from provisioner.rules import lifecycle as _lifecycle  # noqa: F401
    from provisioner.rules import rails as _rails  # noqa: F401


def run_rules(fleet: Fleet, ctx: RuleContext | None = None) -> list[Finding]:
    """Every rule's findings, errors and warnings, in rule-code order; each message ends with where the offending
    value was set (file:line) when Ansible recorded it."""
    _load_all()
    ctx = ctx or build_context(fleet)
    out: list[Finding] = []
    for code in sorted(RULES):
        out.extend(_with_origin(fleet, f) for f in RULES[code].fn(fleet, ctx))
    return out


def origin(value: Any) -> str | None:
    """'path:line' of a value Ansible loaded (inventory/origin.py), relative to the working directory, else None."""
    from provisioner.inventory.origin import where

    w = where(value)
    if w is None:
        return None
    path = _shown(w[0], os.getcwd())
    return f"{path}:{w[1]}" if w[1] else path


@functools.lru_cache(maxsize=4096)
def _shown(path: str, cwd: str) -> str:
    """`path` relative to `cwd` when under it (one pathlib walk per distinct file: 90,000 origins at 10,000 hosts)."""
    try:
        return str(Path(path).relative_to(cwd))
    except ValueError:
        return str(Path(path))


def _with_origin(fleet: Fleet, f: Finding) -> Finding:
    if not f.var:
        return f
    value: Any = None
    if f.var.startswith("vllm_cluster") and f.group:
        vc = fleet.group_vars.get(f.group, {}).get("vllm_cluster")
        key = f.var.partition(".")[2]
        value = vc.get(key, vc) if isinstance(vc, dict) and key else vc
    elif f.host and f.host in fleet.hosts:
        value = fleet.hosts[f.host].vars.get(f.var)
    elif f.group:
        value = fleet.group_vars.get(f.group, {}).get(f.var)
    where = origin(value)
    return replace(f, message=f"{f.message} (set in {where})") if where else f


def split_findings(findings: Iterable[Finding], targeted: Iterable[str] | None = None,
                   ) -> tuple[list[Finding], list[Finding]]:
    """(errors that block a run, warnings): an error on a host outside `targeted` (the hosts a run touches; None:
    all) is only a warning there. `provision run`/`drift` and the validate action plugin decide the same way."""
    scope = None if targeted is None else set(targeted)
    errors: list[Finding] = []
    warnings: list[Finding] = []
    for f in findings:
        if f.severity == "error" and (scope is None or f.host is None or f.host in scope):
            errors.append(f)
        else:
            warnings.append(f)
    return errors, warnings


def all_rules() -> dict[str, Rule]:
    _load_all()
    return dict(sorted(RULES.items()))


__all__ = ["Finding", "Rule", "RULES", "RuleContext", "build_context", "rule", "run_rules", "split_findings",
           "all_rules"]
