"""Validation rules: small pure functions `(fleet, ctx) -> findings`, each with a stable code.

A rule never does I/O: `build_context` (provisioner/rules/context.py) resolves what needs files (model_config) or
vLLM (its argument parser) up front. `run_rules(fleet, ctx)` runs every registered rule in code order.
Codes are documented in docs/inventory.md; never reuse or renumber one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Literal

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
    from provisioner.rules import cluster, flags, hardware, memory, nccl, types  # noqa: F401


def run_rules(fleet: Fleet, ctx: RuleContext | None = None) -> list[Finding]:
    """Every rule's findings, errors and warnings, in rule-code order."""
    _load_all()
    ctx = ctx or build_context(fleet)
    out: list[Finding] = []
    for code in sorted(RULES):
        out.extend(RULES[code].fn(fleet, ctx))
    return out


def all_rules() -> dict[str, Rule]:
    _load_all()
    return dict(sorted(RULES.items()))


__all__ = ["Finding", "Rule", "RULES", "RuleContext", "build_context", "rule", "run_rules", "all_rules"]
