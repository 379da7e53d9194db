"""The quarantine/remediation policy (`lifecycle_policy`) and the pure decision it drives (issue 25).

`decide(facts, policy)` turns one node's state, its newest health results and its quarantine/remediation history
into the next `Action`; the command (`provision remediate`) executes it, records it, gathers the facts again and
asks again. No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: health checks (roles/node_health/files/node_health.py) that are hardware signals, and what they catch
HARD_CHECKS: Mapping[str, str] = {
    "ecc": "uncorrectable ECC errors, a pending row remap or a failed one",
    "xid": "an XID of a fatal class in the kernel log",
    "fabricmanager": "the NVLink fabric not Completed/Success, or Fabric Manager down",
    "nvlink": "inactive NVLinks",
    "ib": "an InfiniBand port of NCCL_IB_HCA down",
}
#: checks a policy acts on only when `quarantine_on` names them (off by default)
OPT_IN_CHECKS: Mapping[str, str] = {
    "slow": "a slow node: a burn-in figure at least burnin_slow_fraction below its GPU model's fleet median (BRN018)",
}
#: remediation steps, in the order they usually escalate
STEPS: tuple[str, ...] = ("gpu_reset", "reboot", "power_cycle")
POLICY_KEYS: tuple[str, ...] = ("quarantine_on", "remediation", "replace_after")
REPLACE_KEYS: tuple[str, ...] = ("quarantines", "window_days")
DEFAULT_REMEDIATION: tuple[str, ...] = ("gpu_reset", "reboot")
DEFAULT_REPLACE = (3, 30)
#: the states the policy acts on (a node being built, in maintenance or retired is someone else's)
WATCHED = ("burn-in", "in-service", "quarantined")


@dataclass(frozen=True)
class Policy:
    quarantine_on: tuple[str, ...] = tuple(HARD_CHECKS)
    remediation: tuple[str, ...] = DEFAULT_REMEDIATION
    replace_quarantines: int = DEFAULT_REPLACE[0]
    replace_window_days: float = DEFAULT_REPLACE[1]


def policy_of(value: Any) -> Policy | None:
    """The Policy of a `lifecycle_policy` value (None: not set, the policy is off). Assumes the LC rules passed;
    whatever they would report falls back to the default here."""
    if not isinstance(value, Mapping):
        return None
    q = value.get("quarantine_on")
    r = value.get("remediation")
    ra_raw = value.get("replace_after")
    ra: Mapping[str, Any] = ra_raw if isinstance(ra_raw, Mapping) else {}
    n, days = ra.get("quarantines", DEFAULT_REPLACE[0]), ra.get("window_days", DEFAULT_REPLACE[1])
    return Policy(
        quarantine_on=tuple(c for c in q if c in HARD_CHECKS or c in OPT_IN_CHECKS) if isinstance(q, list)
        else tuple(HARD_CHECKS),
        remediation=tuple(dict.fromkeys(s for s in r if s in STEPS)) if isinstance(r, list) else DEFAULT_REMEDIATION,
        replace_quarantines=n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else DEFAULT_REPLACE[0],
        replace_window_days=days if isinstance(days, (int, float)) and not isinstance(days, bool) and days > 0
        else DEFAULT_REPLACE[1])


@dataclass(frozen=True)
class Health:
    """A node's newest health pass: when it began, its outcome (ok, failed, unreachable), {check: (result,
    detail)}."""

    run: int
    started: float
    outcome: str
    checks: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)

    def failed(self) -> list[str]:
        return [c for c, (r, _) in self.checks.items() if r == "fail"]


@dataclass(frozen=True)
class Step:
    """A remediation record: a step tried (gpu_reset, reboot, power_cycle: outcome done / failed / skipped) or the
    node marked for replacement (`replace`)."""

    step: str
    at: float
    outcome: str


@dataclass(frozen=True)
class Facts:
    """One node, as the ledger and the inventory tell it. quarantines: when it entered `quarantined` (every time).
    steps: its remediation records, oldest first. app_fault: an application fault seen on it (a vLLM crash).
    health_runs: its health passes, oldest first."""

    host: str
    state: str
    since: float | None
    now: float
    health: Health | None = None
    quarantines: tuple[float, ...] = ()
    steps: tuple[Step, ...] = ()
    cluster: str | None = None
    has_bmc: bool = False
    app_fault: str | None = None
    #: its health passes (run, started, outcome), oldest first: at least those since the state was entered (what
    #: tells the gate after a step, the first pass after it, from a later pass)
    health_runs: tuple[tuple[int, float, str], ...] = ()
    #: why it is a slow node (provisioner.burnin.slow_nodes on the newest burn-ins), None when it is not
    slow: str | None = None
    #: the burn-in gate (on unless the site sets burnin_gate: false) and whether the node runs a tier on its way back
    #: (burnin_return_tier); its newest burn-in since it entered its state: (passed, ended, the failed checks)
    burnin_gate: bool = False
    burnin_return: bool = True
    burnin: tuple[bool, float, str] | None = None


@dataclass(frozen=True)
class Action:
    """What to do with a node. kind: quarantine, remediate (step), gate (run the health gate), burnin (its return
    tier: the health gate passed, the burn-in gate waits), return, replace, restart_cluster, hold (nothing to do but
    say why). reason: the check or the cause, for the ledger and output."""

    kind: str
    host: str
    reason: str
    step: str | None = None
    check: str | None = None
    cluster: str | None = None

    def line(self) -> str:
        what = {"quarantine": "quarantine", "remediate": f"remediate: {self.step}", "gate": "health gate",
                "burnin": "return burn-in", "return": "return to service", "replace": "mark for hardware replacement",
                "restart_cluster": f"restart cluster {self.cluster}", "hold": "no action"}[self.kind]
        return f"{self.host}: {what} ({self.reason})"


def _hard_failures(h: Health, checks: Sequence[str]) -> list[str]:
    return [c for c in h.failed() if c in checks]


def _reason(h: Health, check: str) -> str:
    detail = (h.checks[check][1] or "").strip()
    return f"{check}: {detail}" if detail else f"{check} failed"


def quarantines_in_window(f: Facts, p: Policy) -> int:
    start = f.now - p.replace_window_days * 86400
    return sum(1 for t in f.quarantines if t >= start)


def decide(f: Facts, p: Policy) -> Action:
    """The next action for one node under policy `p`. Pure."""
    if f.state not in WATCHED:
        return Action("hold", f.host, f"{f.state}: not watched by the policy")
    h = f.health
    if f.state == "quarantined":
        entered = f.since or 0.0
        episode = [s for s in f.steps if s.at >= entered]
        if any(s.step == "replace" for s in episode):
            return Action("hold", f.host, "marked for hardware replacement: stays quarantined")
        tried = [s for s in episode if s.step in STEPS]
        passed = h is not None and h.outcome == "ok" and not h.failed() \
            and not ("slow" in p.quarantine_on and f.slow)
        # after a step only a newer pass counts; before any, the failing pass that quarantined it is the baseline
        if h is None or (tried and h.started < tried[-1].at) or (passed and h.started < entered):
            return Action("gate", f.host, "no health pass since " + (f"{tried[-1].step}" if tried else "quarantine"))
        still = None
        if passed and f.burnin_gate:  # into in-service needs a passed burn-in since the quarantine (and the step)
            after = tried[-1].at if tried else entered
            b = f.burnin
            if b is None or b[1] < after:
                if not f.burnin_return:
                    return Action("hold", f.host, "health passed, no burn-in since "
                                  f"{tried[-1].step if tried else 'quarantine'} and burnin_return_tier is off: run "
                                  f"provision burn-in INVENTORY {f.host} --tier quick")
                return Action("burnin", f.host, "no burn-in since " + (f"{tried[-1].step}" if tried else "quarantine"))
            if not b[0]:
                passed, still = False, f"burn-in failed ({b[2] or 'see provision history'})"
        if passed:
            return Action("return", f.host, _passed(f, h, tried[-1] if tried else None))
        done = {s.step for s in tried}
        for step in p.remediation:
            if step in done:
                continue
            if step == "power_cycle" and not f.has_bmc:
                continue
            return Action("remediate", f.host, still or _still(h), step=step)
        return Action("hold", f.host, f"remediation exhausted ({', '.join(s.step for s in tried) or 'none'}): "
                                      f"stays quarantined ({still or _still(h)})")
    if h is None:
        return Action("hold", f.host, "no health result")
    if h.outcome == "unreachable":
        return Action("hold", f.host, "unreachable in the last health pass: no hardware signal to act on")
    hard = _hard_failures(h, p.quarantine_on)
    if hard:
        n = quarantines_in_window(f, p) + 1
        if n >= p.replace_quarantines:
            return Action("replace", f.host, f"{_reason(h, hard[0])}; quarantine {n} in "
                          f"{p.replace_window_days:g} days (replace_after {p.replace_quarantines})", check=hard[0])
        return Action("quarantine", f.host, _reason(h, hard[0]), check=hard[0])
    if "slow" in p.quarantine_on and f.slow and f.state == "in-service":
        return Action("quarantine", f.host, f.slow, check="slow")
    other_hw = _hard_failures(h, tuple(HARD_CHECKS))
    if other_hw:
        return Action("hold", f.host, f"{', '.join(other_hw)} failed: not in quarantine_on")
    if f.app_fault and f.state == "in-service":
        if f.cluster is None:
            return Action("hold", f.host, f"application fault ({f.app_fault}) on a node in no vLLM cluster")
        return Action("restart_cluster", f.host, f"application fault without a hardware signal: {f.app_fault}",
                      cluster=f.cluster)
    if h.failed():
        return Action("hold", f.host, f"{', '.join(h.failed())} failed: not a hardware check (provision run / "
                                      "drift fixes it)")
    return Action("hold", f.host, "healthy")


def _passed(f: Facts, h: Health, step: Step | None) -> str:
    """Why a quarantined node returns, naming the health run that passed: the gate right after the last step, or a
    later pass when that gate did not pass (the fault cleared by other means), which the reason then says."""
    if step is None:
        return f"health gate passed since the quarantine (health run #{h.run})"
    gates = [r for r in f.health_runs if r[1] >= step.at]
    if not gates or gates[0][0] == h.run:
        return f"health gate passed after {step.step} (health run #{h.run})"
    gate, _, outcome = gates[0]
    return f"health run #{h.run} passed; the gate after {step.step} did not (health run #{gate}: {outcome})"


def _still(h: Health) -> str:
    bad = [c for c in h.failed() if c in HARD_CHECKS] or h.failed()
    return "; ".join(_reason(h, c) for c in bad) if bad else f"health {h.outcome}"
