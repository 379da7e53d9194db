"""The day-2 entry points that `provision remediate`, the nightly timer and the alert receiver all call."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: what started a remediation (recorded with every action and incident)
SOURCES = ("operator", "timer", "alert")
#: action kinds that change something (the others only say why not)
ACTING = ("quarantine", "replace", "remediate", "return", "restart_cluster")


@dataclass
class Remediation:
    """What `remediate` did: ok (no step, mark or ledger write failed), the nodes under the policy, one dict per
    line said (host, action, ok, line), and `errors` (one line each: an invalid lifecycle_policy) when it did not
    start."""

    ok: bool
    hosts: list[str] = field(default_factory=list)
    lines: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def actions(self) -> int:
        return sum(ln["action"] in ACTING for ln in self.lines)


def remediate(inventory: Path, *, limit: str | None = None, dry_run: bool = False,
              app_faults: Mapping[str, str] | None = None, timeout: float = 900.0, fleet: Any = None) -> Remediation:
    """Apply `lifecycle_policy` to the newest health results of the GPU nodes `limit` picks. Raises LedgerError or
    Refused (one line each) when the ledger cannot be used; UsageError for a bad `app_faults` host."""
    from provisioner.commands.common import select
    from provisioner.day2.executor import QUIET_TAIL, Runner, facts
    from provisioner.day2.policy import decide, policy_of
    from provisioner.errors import UsageError
    from provisioner.inventory import load_fleet
    from provisioner.ledger.site import site_of
    from provisioner.ledger.view import open_ledger, read_ledger
    from provisioner.rules import run_rules

    if timeout <= 0:
        raise UsageError("--timeout must be > 0")
    fleet = fleet if fleet is not None else load_fleet(inventory)
    faults = dict(app_faults or {})
    for h in faults:
        if h not in fleet.hosts:
            raise UsageError(f"--app-fault: {h} is not a host of the inventory")
    hosts = [h for h in select(fleet, limit) if policy_of(fleet.hosts[h].vars.get("lifecycle_policy")) is not None]
    bad = [f for f in run_rules(fleet) if f.code.startswith("LC") and f.severity == "error"
           and (f.host is None or f.host in hosts)]
    if bad:
        return Remediation(ok=False, hosts=hosts, errors=[f.line() for f in bad])
    out = Remediation(ok=True, hosts=hosts)
    if not hosts:
        return out
    policies = {h: policy_of(fleet.hosts[h].vars.get("lifecycle_policy")) for h in hosts}
    quiet = ("healthy", "no health result")
    with (read_ledger(site=site_of(fleet)) if dry_run else open_ledger(fleet)) as ledger:
        rn = Runner(inventory, fleet, ledger, timeout)
        for h in hosts:
            for _ in range(12):  # each step is tried once per quarantine: a few rounds always end it
                a = decide(facts(fleet, ledger, h, faults.get(h)), policies[h])  # type: ignore[arg-type]
                if a.kind == "hold" or dry_run:
                    if a.kind != "hold" or not (a.reason in quiet or a.reason.endswith(QUIET_TAIL)):
                        rn.say(h, a.kind, a.line())
                    break
                rn.run(a)
    out.lines, out.ok = rn.lines, not rn.failed
    return out
