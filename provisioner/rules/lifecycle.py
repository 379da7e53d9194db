"""Quarantine/remediation policy rules (LC0xx): the `lifecycle_policy` variable of docs/lifecycle.md, inventory
only (what the nodes report is `provision health`'s; what is done about it, `provision remediate`'s)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from provisioner.day2.policy import HARD_CHECKS, OPT_IN_CHECKS, POLICY_KEYS, REPLACE_KEYS, STEPS
from provisioner.model import Fleet
from provisioner.rules import Finding, rule
from provisioner.rules._util import is_int, mapping_places, mapping_shape, places, quoted_hint, show, suggest
from provisioner.rules.context import RuleContext

VAR = "lifecycle_policy"
EXAMPLE = ("{quarantine_on: [ecc, xid], remediation: [gpu_reset, reboot], "
           "replace_after: {quarantines: 3, window_days: 30}}")


@rule("LC001", "lifecycle_policy is not a policy mapping")
def policy_shape(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """lifecycle_policy is a mapping of quarantine_on / remediation / replace_after, nothing else."""
    for g, h, _v, problems in mapping_shape(fleet, VAR, POLICY_KEYS, what="a policy key",
                                            example=EXAMPLE):
        yield from (Finding("LC001", "error", m, host=h, group=g, var=VAR) for m in problems)


@rule("LC002", "lifecycle_policy.quarantine_on names a check that is not a hardware check")
def quarantine_on(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """quarantine_on is a list of the hard health checks (ecc, xid, fabricmanager, nvlink, ib), and `slow` (opt-in: the
    burn-in slow node); a soft check
    (driver, persistence, allreduce...) is fixed by a run, not by quarantining the node."""
    for g, h, v in mapping_places(fleet, VAR):
        if "quarantine_on" not in v:
            continue
        q = v["quarantine_on"]
        if not isinstance(q, list) or not q:
            yield Finding("LC002", "error", f"{VAR}.quarantine_on = {show(q)}: expected a non-empty list of "
                          f"checks ({', '.join(HARD_CHECKS)}); leave it out for all of them", host=h, group=g,
                          var=VAR)
            continue
        for c in q:
            if c not in HARD_CHECKS and c not in OPT_IN_CHECKS:
                yield Finding("LC002", "error", f"{VAR}.quarantine_on: {show(c)} is not a hardware health check "
                              f"(one of {', '.join(HARD_CHECKS)}){suggest(c, HARD_CHECKS)}; other checks are "
                              "fixed by provision run, not by quarantine", host=h, group=g, var=VAR)


@rule("LC003", "lifecycle_policy.remediation is not a list of known steps")
def remediation_steps(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """remediation is a non-empty list of gpu_reset / reboot / power_cycle, each once (tried in that order)."""
    for g, h, v in mapping_places(fleet, VAR):
        if "remediation" not in v:
            continue
        r = v["remediation"]
        if not isinstance(r, list) or not r:
            yield Finding("LC003", "error", f"{VAR}.remediation = {show(r)}: expected a non-empty list of steps "
                          f"({', '.join(STEPS)}), tried in order", host=h, group=g, var=VAR)
            continue
        seen: set[Any] = set()
        for s in r:
            if s not in STEPS:
                yield Finding("LC003", "error", f"{VAR}.remediation: {show(s)} is not a step (one of "
                              f"{', '.join(STEPS)}){suggest(s, STEPS)}", host=h, group=g, var=VAR)
            elif s in seen:
                yield Finding("LC003", "error", f"{VAR}.remediation lists {s} twice: each step is tried once per "
                              "quarantine; remove the repeat", host=h, group=g, var=VAR)
            if isinstance(s, str):
                seen.add(s)


@rule("LC004", "lifecycle_policy.replace_after is not {quarantines: N, window_days: D}")
def replace_after(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """replace_after is a mapping with quarantines (an int >= 1) and window_days (an int >= 1)."""
    for g, h, v in mapping_places(fleet, VAR):
        if "replace_after" not in v:
            continue
        ra = v["replace_after"]
        if not isinstance(ra, Mapping):
            yield Finding("LC004", "error", f"{VAR}.replace_after = {show(ra)}: expected a mapping, e.g. "
                          "{quarantines: 3, window_days: 30}", host=h, group=g, var=VAR)
            continue
        for k in ra:
            if k not in REPLACE_KEYS:
                yield Finding("LC004", "error", f"{VAR}.replace_after.{k} is not a key (one of "
                              f"{', '.join(REPLACE_KEYS)}){suggest(k, REPLACE_KEYS)}", host=h, group=g, var=VAR)
        for k in REPLACE_KEYS:
            if k in ra and not (is_int(ra[k]) and ra[k] >= 1):
                yield Finding("LC004", "error", f"{VAR}.replace_after.{k} = {show(ra[k])}: expected an int >= 1"
                              f"{quoted_hint(ra[k], 'int')}", host=h, group=g, var=VAR)


@rule("LC005", "lifecycle_policy.remediation has power_cycle on a host without a BMC")
def power_cycle_without_bmc(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """power_cycle goes through the host's BMC (bmc_address, docs/bmc.md): without one the step is skipped."""
    for h in fleet.gpu_nodes:
        v = h.vars.get(VAR)
        if isinstance(v, Mapping) and isinstance(v.get("remediation"), list) and "power_cycle" in v["remediation"] \
                and not h.vars.get("bmc_address"):
            yield Finding("LC005", "warning", f"{VAR}.remediation has power_cycle but the host has no bmc_address: "
                          "the step is skipped there (set bmc_address and its credentials, docs/bmc.md)",
                          host=h.name, var=VAR)


@rule("LC006", "provision_site is not a site name, or differs between hosts")
def site_name(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """provision_site names the inventory's site in the ledger (docs/lifecycle.md, Sites): one non-empty printable
    string of at most 200 characters, the same for every host (set it in group all)."""
    from provisioner.ledger.site import NAME
    from provisioner.ledger.site import VAR as SITE

    for g, h, v in places(fleet, SITE):
        if v is not None and not (isinstance(v, str) and NAME.fullmatch(v) and v.strip()):
            yield Finding("LC006", "error", f"{SITE} = {show(v)}: expected a non-empty string of at most 200 "
                          "printable characters (no control characters)", host=h, group=g, var=SITE)
    seen = sorted({repr(h.vars.get(SITE)) for h in fleet.hosts.values()})
    if len(seen) > 1:
        yield Finding("LC006", "error", f"{SITE} differs between hosts ({', '.join(seen)}): one inventory is one "
                      "site; set it once, in group all", group="all", var=SITE)


GATE = "burnin_gate"
GATE_WORDS = ("true", "yes", "1", "on", "false", "no", "0", "off")


@rule("LC007", "burnin_gate is not a boolean, or a burn-in tier is off while the gate is on")
def burnin_gate(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """The burn-in gate (docs/burn-in.md, on by default) holds every node out of service without a passed tier: a
    misspelt value keeps it on (said here), and a tier turned off with the gate on leaves nodes out (onboarding) or
    stops their returns until a person runs `provision burn-in`."""
    from provisioner.day2.lifecycle import burnin_gate_on

    for g, h, v in places(fleet, GATE):
        if str(v).strip().lower() not in GATE_WORDS:
            yield Finding("LC007", "warning", f"{GATE} = {show(v)}: not a boolean; the burn-in gate stays on "
                          "(false turns it off)", host=h, group=g, var=GATE)
    for node in fleet.gpu_nodes:
        if not burnin_gate_on(node.vars.get(GATE, True)):
            continue
        for var, default, what in (("burnin_onboard_tier", "standard", "onboarding leaves the host out at burn-in"),
                                   ("burnin_return_tier", "quick", "its returns stop at the gate until a person "
                                    "runs provision burn-in")):
            if str(node.vars.get(var, default)).strip().lower() == "off":
                yield Finding("LC007", "warning", f"{var} is off and {GATE} is on (the default): {what} (set a "
                              f"tier, or {GATE}: false to weaken acceptance)", host=node.name, var=var)
