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
#: what a held, observed or recommended action is said as
NOT_DONE = ("blocked", "observed", "recommended", "stale")


@dataclass
class Remediation:
    """What `remediate` did: ok (no step, mark or ledger write failed), the nodes under the policy, one dict per
    line said (host, action, ok, line), and `errors` (one line each: an invalid lifecycle_policy) when it did not
    start."""

    ok: bool
    hosts: list[str] = field(default_factory=list)
    lines: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: the alert key given was acted on already: nothing was done
    duplicate: bool = False

    @property
    def actions(self) -> int:
        return sum(ln["action"] in ACTING and ln.get("status", "done") not in NOT_DONE for ln in self.lines)


def fleet_rails(fleet: Any) -> Any:
    """The fleet's rails (`remediation_rails` of group all, else the value every host carries; defaults)."""
    from provisioner.day2.rails import VAR, rails_of

    value = (fleet.group_vars.get("all") or {}).get(VAR)
    if value is None:
        seen = [h.vars.get(VAR) for h in fleet.hosts.values() if h.vars.get(VAR) is not None]
        value = seen[0] if seen else None
    return rails_of(value)


def _recent(fleet: Any, ledger: Any, host: str, check: str | None, rails: Any, now: float, policy_nodes: int) -> Any:
    """The rails' view of the fleet, from the ledger."""
    from provisioner.day2.rails import TAKE_OUT, Recent, TakeOut
    from provisioner.ledger.view import cluster_model, serving_clusters

    models = {n: cluster_model(c, n) for n, c in fleet.clusters.items()}
    since = now - max(3600.0, rails.breaker_window_s, rails.cooldown_s)
    # executed take-outs count whether their steps on the nodes worked or not: the node left service either way
    done = tuple(TakeOut(a.at, a.host, a.cluster, a.model) for a in ledger.actions(
        since=since, kinds=TAKE_OUT, statuses=("done", "failed", "running"), limit=100_000))
    ev, closed = ledger.breaker()
    streak = 0
    if check is not None:
        for r in ledger.runs(host=host, limit=50):
            if r.command != "health":
                continue
            res = {x["check"]: x["result"] for x in ledger.health(host, r.id)}
            if res.get(check) != "fail":
                break
            streak += 1
    return Recent(now=now, nodes=policy_nodes, clusters=models, serving=frozenset(serving_clusters(fleet, ledger)),
                  done=done, breaker=None if ev is None else ev.why, closed_at=closed, streak=max(streak, 1))


class _Loop:
    """One remediation pass: decisions, rails, the mode, the executor, and the ledger's actions and incidents."""

    def __init__(self, inventory: Path, fleet: Any, ledger: Any, *, timeout: float, source: str,
                 alert_key: str | None, signal_at: float | None, policy_nodes: int) -> None:
        from provisioner.day2.executor import Runner

        self.fleet, self.ledger, self.source, self.alert_key = fleet, ledger, source, alert_key
        self.signal_at, self.policy_nodes = signal_at, policy_nodes
        self.approver: str | None = None
        self.rails = fleet_rails(fleet)
        self.rn = Runner(inventory, fleet, ledger, timeout)

    def say(self, host: str, kind: str, text: str, ok: bool = True, **extra: Any) -> None:
        self.rn.say(host, kind, text, ok=ok)
        self.rn.lines[-1].update(extra)

    def pending(self, host: str) -> list[Any]:
        return [a for a in self.ledger.actions(host=host, status="recommended")]

    def expire(self, host: str, a: Any) -> None:
        """Recommendations for `host` that the node no longer needs (another decision now) become stale."""
        for r in self.pending(host):
            if (r.kind, r.step) != (a.kind, a.step):
                self.ledger.action_done(r.id, "stale", detail=f"the node now needs: {a.line()}")

    def once(self, host: str, a: Any, f: Any, *, approved: int | None = None) -> bool:
        """Handle one decided action (not hold). True: it was executed (ask again)."""
        from provisioner.day2.rails import disposition, judge
        from provisioner.ledger.view import cluster_model, cluster_name

        cluster: str | None = a.cluster or cluster_name(self.fleet, host)
        model = cluster_model(self.fleet.clusters[cluster], cluster) if cluster is not None \
            and cluster in self.fleet.clusters else None
        now = f.now
        v = judge(a.kind, host, check=a.check, cluster=cluster, rails=self.rails,
                  recent=_recent(self.fleet, self.ledger, host, a.check, self.rails, now, self.policy_nodes))
        disp = disposition(self.rails.mode, v, approved=approved is not None)
        if a.kind in ("gate", "burnin") and disp == "recommended":
            disp = "act"  # a health pass or a burn-in on a quarantined node takes nothing out
        common = dict(reason=a.reason, source=self.source, mode=self.rails.mode, step=a.step, check=a.check,
                      cluster=cluster, model=model, alert_key=self.alert_key)
        if disp == "blocked":
            if v.opens:
                self.ledger.breaker_event("open", v.opens, actor="policy:remediate", source=self.source)
                self.say(host, "breaker", f"BREAKER OPEN: {v.opens}: automatic take-outs stop until "
                         "provision remediate --close-breaker", status="blocked")
            last = self.ledger.actions(host=host, limit=1)
            if not (last and last[-1].status == "blocked" and (last[-1].kind, last[-1].step, last[-1].rail) ==
                    (a.kind, a.step, v.rail) and not v.opens):
                self.ledger.record_action(host, a.kind, status="blocked", rail=v.rail, detail=v.why, **common)
            if approved is not None:
                self.ledger.action_done(approved, "recommended", detail=f"approved, but held: {v.why}")
            self.say(host, a.kind, f"{a.line()}: HELD by the rails: {v.why}", status="blocked", rail=v.rail)
            return False
        if disp in ("observed", "recommended"):
            same = [r for r in (self.pending(host) if disp == "recommended" else
                                self.ledger.actions(host=host, status="observed", since=f.since or 0.0))
                    if (r.kind, r.step) == (a.kind, a.step)]
            aid = same[-1].id if same else self.ledger.record_action(host, a.kind, status=disp, **common)
            tail = (f"recommended as #{aid} (mode recommend): provision remediate INVENTORY --approve {aid}"
                    if disp == "recommended" else f"observed as #{aid} (mode observe): nothing done")
            self.say(host, a.kind, f"{a.line()}: {tail}", status=disp, id=aid)
            return False
        aid = approved if approved is not None else self.ledger.record_action(host, a.kind, status="running",
                                                                                **common)
        inc = self.incident_before(host, a, f, cluster)
        start = len(self.rn.lines)
        self.rn.run(a)
        ok = all(ln["ok"] for ln in self.rn.lines[start:])
        self.incident_after(host, a, inc, ok)
        self.ledger.action_done(aid, "done" if ok else "failed", incident=inc,
                                decided_by=self.approver if approved is not None else None,
                                detail=None if ok else next((ln["line"] for ln in self.rn.lines[start:]
                                                             if not ln["ok"]), None))
        for ln in self.rn.lines[start:]:
            ln.setdefault("status", "done" if ok else "failed")
            ln.setdefault("id", aid)
        return True

    def incident_before(self, host: str, a: Any, f: Any, cluster: str | None) -> int | None:
        open_ = self.ledger.open_incident(host)
        if open_ is not None:
            return int(open_.id)
        if a.kind not in ("quarantine", "replace", "restart_cluster"):
            return None
        signal = self.signal_at if self.signal_at is not None else (f.health.started if f.health else f.now)
        return int(self.ledger.incident_opened(host, cluster=cluster, source=self.source, cause=a.reason,
                                               signal=min(signal, f.now), detected=f.now))

    def incident_after(self, host: str, a: Any, inc: int | None, ok: bool) -> None:
        """The incident's timestamps after `a` ran: drained only when every step of the take-out worked."""
        import time

        if inc is None:
            return
        state = self.ledger.state(host)[0]
        if a.kind in ("quarantine", "replace") and state == "quarantined":
            t = [x.at for x in self.ledger.transitions(host) if x.to_state == "quarantined"]
            self.ledger.incident_mark(inc, "quarantined", at=t[-1] if t else None)
            if ok:
                self.ledger.incident_mark(inc, "drained", at=time.time())
            if a.kind == "replace":
                self.ledger.incident_mark(inc, "replaced")
        elif a.kind == "remediate" and a.step:
            steps = [r for r in self.ledger.remediations(host) if r.step == a.step]
            self.ledger.incident_step(inc, a.step, steps[-1].outcome if steps else "unknown")
        elif a.kind == "restart_cluster":
            self.ledger.incident_step(inc, "restart_cluster", "done" if ok else "failed")
            if ok:
                self.ledger.incident_mark(inc, "returned")
        elif a.kind == "return" and state == "in-service":
            self.ledger.incident_mark(inc, "returned")


def remediate(inventory: Path, *, limit: str | None = None, dry_run: bool = False,
              app_faults: Mapping[str, str] | None = None, timeout: float = 900.0, source: str = "operator",
              alert_key: str | None = None, approve: int | None = None, signal_at: float | None = None,
              fleet: Any = None) -> Remediation:
    """Apply `lifecycle_policy` to the newest health results of the GPU nodes `limit` picks, through the rails
    (provisioner/day2/rails.py) and in the fleet's mode (observe: record; recommend: record, `approve` executes one
    recommendation by its id; act: execute). `source` (operator, timer, alert) is recorded with every action and
    incident; `alert_key`: the same key acts at most once (a second call does nothing: `duplicate`). `signal_at`:
    when the signal was seen (an alert's start), else the health pass's start. Raises LedgerError or Refused (one
    line each) when the ledger cannot be used; UsageError for bad arguments."""
    from provisioner.day2.executor import QUIET_TAIL, facts
    from provisioner.day2.policy import decide, policy_of
    from provisioner.errors import UsageError
    from provisioner.inventory import load_fleet, select_gpu_nodes
    from provisioner.ledger.site import site_of
    from provisioner.ledger.view import open_ledger, read_ledger
    from provisioner.rules import run_rules

    if timeout <= 0:
        raise UsageError("--timeout must be > 0")
    if source not in SOURCES:
        raise UsageError(f"--source {source!r}: one of {', '.join(SOURCES)}")
    if alert_key is not None and not (0 < len(alert_key) <= 200 and alert_key.isprintable()):
        raise UsageError("--alert-key must be 1 to 200 printable characters")
    if approve is not None and dry_run:
        raise UsageError("--approve executes a recommendation: it cannot be a --dry-run")
    fleet = fleet if fleet is not None else load_fleet(inventory)
    faults = dict(app_faults or {})
    for h in faults:
        if h not in fleet.hosts:
            raise UsageError(f"--app-fault: {h} is not a host of the inventory")
    under = [h for h in fleet.hosts if policy_of(fleet.hosts[h].vars.get("lifecycle_policy")) is not None]
    hosts = [h for h in select_gpu_nodes(fleet, limit) if h in under]
    bad = [f for f in run_rules(fleet) if (f.code.startswith("LC") and (f.host is None or f.host in hosts)
                                           or f.code.startswith("RL")) and f.severity == "error"]
    if bad:
        return Remediation(ok=False, hosts=hosts, errors=[f.line() for f in bad])
    out = Remediation(ok=True, hosts=hosts)
    if not hosts and approve is None:
        return out
    policies = {h: policy_of(fleet.hosts[h].vars.get("lifecycle_policy")) for h in under}
    quiet = ("healthy", "no health result")
    with (read_ledger(site=site_of(fleet)) if dry_run else open_ledger(fleet)) as ledger:
        if alert_key is not None and not dry_run and not ledger.claim_alert_key(alert_key, limit):
            seen = ledger.alert_key(alert_key) or {}
            out.duplicate = True
            out.lines.append({"host": "", "action": "duplicate", "ok": True, "status": "duplicate",
                              "line": f"alert key {alert_key!r} was acted on already ({seen.get('outcome')}): "
                                      "nothing done"})
            return out
        loop = _Loop(inventory, fleet, ledger, timeout=timeout, source=source, alert_key=alert_key,
                     signal_at=signal_at, policy_nodes=len(under))
        approved: int | None = None
        if approve is not None:
            rec = ledger.action(approve)
            if rec is None or rec.status != "recommended":
                raise UsageError(f"--approve {approve}: no recommended action #{approve} in the ledger of this site"
                                 + (f" (it is {rec.status})" if rec is not None else "") +
                                 " (provision status lists the open recommendations)")
            if rec.host not in policies:
                raise UsageError(f"--approve {approve}: {rec.host} is not under lifecycle_policy any more")
            hosts, approved = [rec.host], rec.id
            from provisioner.day2.executor import actor_user

            loop.approver = actor_user()
            out.hosts = hosts
        for h in hosts:
            first = True
            for _ in range(12):  # each step is tried once per quarantine: a few rounds always end it
                f = facts(fleet, ledger, h, faults.get(h))
                a = decide(f, policies[h])  # type: ignore[arg-type]
                if first and not dry_run:
                    loop.expire(h, a)
                if approved is not None and first:
                    rec = ledger.action(approved)
                    if rec is None or rec.status != "recommended":
                        loop.say(h, "stale", f"{h}: recommendation #{approved} is stale: the node now needs "
                                 f"{a.line()}", ok=False, status="stale")
                        break
                first = False
                if a.kind == "hold" or dry_run:
                    if a.kind != "hold" or not (a.reason in quiet or a.reason.endswith(QUIET_TAIL)):
                        loop.say(h, a.kind, a.line())
                    break
                if not loop.once(h, a, f, approved=approved):
                    break
                approved = None
        out.lines, out.ok = loop.rn.lines, not loop.rn.failed
        if alert_key is not None and not dry_run:
            ledger.alert_key_outcome(alert_key, "; ".join(ln["line"] for ln in out.lines)[:500] or "nothing to do")
    return out


def close_breaker(inventory: Path, *, reason: str, actor: str, fleet: Any = None) -> tuple[bool, str]:
    """Close the remediation circuit breaker (an operator's act, with a reason kept in the ledger). (was it open,
    the line to show)."""
    from provisioner.errors import UsageError
    from provisioner.inventory import load_fleet
    from provisioner.ledger.view import open_ledger

    if not reason.strip():
        raise UsageError("--close-breaker needs --reason (it is kept in the ledger)")
    fleet = fleet if fleet is not None else load_fleet(inventory)
    with open_ledger(fleet) as ledger:
        ev, _ = ledger.breaker()
        if ev is None:
            return False, "breaker: closed already: nothing to do"
        ledger.breaker_event("closed", reason.strip(), actor=actor, source="operator")
        return True, f"breaker closed by {actor} ({reason.strip()}); it had opened: {ev.why}"


def site_metrics(site: str) -> str:
    """The site's incidents (histograms), open incidents, breaker and waiting recommendations from the ledger, in
    the Prometheus text format: what `provision incidents --prometheus` writes and the alert receiver serves."""
    from provisioner.ledger.view import day2_view, read_ledger
    from provisioner.reports.incidents_prometheus import render

    with read_ledger(site=site) as ledger:
        view = day2_view(ledger)
    return render(view["incidents"], site=site, open_incidents=len(view["open_incidents"]),
                  breaker_open=view["breaker"]["open"], recommended=len(view["recommended"]))
