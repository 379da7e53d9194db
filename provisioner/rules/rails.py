"""Remediation rails rules (RL0xx): the `remediation_rails` variable (docs/lifecycle.md#rails), inventory only. One
value for the whole fleet (group all): the rails count across the fleet."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from provisioner.day2.policy import HARD_CHECKS
from provisioner.day2.rails import DEFAULTS, KEYS, MODES, VAR
from provisioner.model import Fleet
from provisioner.rules import Finding, rule
from provisioner.rules._util import is_int, is_number, mapping_places, mapping_shape, same, show, suggest
from provisioner.rules.context import RuleContext

EXAMPLE = "{mode: act, breaker_share: 0.25, actions_per_hour: 3, min_serving_clusters: 1}"
#: key -> (lowest, highest or None, integer)
NUMBERS: Mapping[str, tuple[float, float | None, bool]] = {
    "breaker_share": (0.0, 1.0, False), "breaker_model_share": (0.0, 1.0, False),
    "breaker_window_s": (1.0, None, False), "actions_per_hour": (1.0, None, True), "cooldown_s": (0.0, None, False),
    "persist": (1.0, None, True)}


@rule("RL001", "remediation_rails is not a rails mapping, or is not one value for the fleet")
def rails_shape(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """remediation_rails is a mapping of the rails' keys, set once for the whole fleet (group all)."""
    for g, h, v, problems in mapping_shape(fleet, VAR, KEYS, what="a rails key", example=EXAMPLE):
        yield from (Finding("RL001", "error", m, host=h, group=g, var=VAR) for m in problems)
        if not isinstance(v, Mapping):
            continue
        # one value for the fleet: a group other than all, or a host whose value is not every host's (the Ansible
        # face sees group all's value on every host, with no group to name: that is one value)
        if g not in (None, "all") or (h is not None and not _fleet_wide(fleet, v)):
            yield Finding("RL001", "error", f"{VAR} is set on {'group ' + g if g else 'host ' + str(h)}: set it once "
                          "for the whole fleet (group all): the rails count across the fleet", host=h, group=g,
                          var=VAR)


def _fleet_wide(fleet: Fleet, v: Any) -> bool:
    """Whether every host of the fleet has `v` as its remediation_rails."""
    return all(VAR in host.vars and same(host.vars[VAR], v) for host in fleet.hosts.values())


@rule("RL002", "remediation_rails.mode is not observe, recommend or act")
def rails_mode(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """mode: observe (record what it would do), recommend (record; provision remediate --approve ID acts; the
    default), act (execute)."""
    for g, h, v in mapping_places(fleet, VAR):
        if "mode" in v and v["mode"] not in MODES:
            yield Finding("RL002", "error", f"{VAR}.mode = {show(v['mode'])}: one of {', '.join(MODES)} (default "
                          f"{DEFAULTS['mode']}){suggest(v['mode'], MODES)}", host=h, group=g, var=VAR)


@rule("RL003", "a remediation_rails number is out of range")
def rails_numbers(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Shares are 0..1, windows and cool-downs seconds >= 0, actions_per_hour and persist integers >= 1."""
    for g, h, v in mapping_places(fleet, VAR):
        for k, (lo, hi, integer) in NUMBERS.items():
            if k not in v:
                continue
            x = v[k]
            ok = (is_int(x) if integer else is_number(x)) and x >= lo and (hi is None or x <= hi)
            if not ok:
                rng = f"{lo:g}..{hi:g}" if hi is not None else f">= {lo:g}"
                yield Finding("RL003", "error", f"{VAR}.{k} = {show(x)}: expected {'an integer' if integer else 'a '
                              'number'} {rng} (default {DEFAULTS[k]})", host=h, group=g, var=VAR)


@rule("RL004", "remediation_rails.soft_checks or min_serving_clusters is malformed")
def rails_lists(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """soft_checks is a list of hardware checks (flap-damped); min_serving_clusters an integer >= 0 or a mapping
    model -> integer >= 0."""
    for g, h, v in mapping_places(fleet, VAR):
        if "soft_checks" in v:
            s = v["soft_checks"]
            if not isinstance(s, list) or any(c not in HARD_CHECKS for c in s):
                yield Finding("RL004", "error", f"{VAR}.soft_checks = {show(s)}: expected a list of hardware checks "
                              f"({', '.join(HARD_CHECKS)})", host=h, group=g, var=VAR)
        if "min_serving_clusters" in v:
            m = v["min_serving_clusters"]
            good = (is_int(m) and m >= 0) or (isinstance(m, Mapping) and all(
                isinstance(k, str) and is_int(n) and n >= 0 for k, n in m.items()))
            if not good:
                yield Finding("RL004", "error", f"{VAR}.min_serving_clusters = {show(m)}: expected an integer >= 0 or "
                              "a mapping model -> integer >= 0", host=h, group=g, var=VAR)
