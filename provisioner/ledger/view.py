"""What `provision status / history / node` read from the ledger and the inventory, as plain rows (no CLI here)."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.ledger.store import Ledger

if TYPE_CHECKING:
    from provisioner.day2.lifecycle import Context
    from provisioner.model import Fleet


def read_ledger(path: Path | None = None, *, site: str = "") -> Ledger:
    """The ledger of `site` for reading: an empty in-memory one when the file does not exist yet (reading creates
    nothing)."""
    from provisioner.paths import ledger_path

    p = path or ledger_path()
    return Ledger.open(p if p.exists() else ":memory:", site=site)


def open_ledger(fleet: Fleet, *, lifecycle: bool = True) -> Ledger:
    """The ledger of the inventory's site (provisioner/ledger/site.py) for a command that writes; `lifecycle`: one
    that moves lifecycle states, refused while records from before sites are unowned (Ledger.require_owned)."""
    from provisioner.ledger.site import site_of
    from provisioner.paths import ledger_path

    ledger = Ledger.open(ledger_path(), site=site_of(fleet))
    if lifecycle:
        try:
            ledger.require_owned()
        except BaseException:
            ledger.close()
            raise
    return ledger


def unowned_warning(ledger: Ledger) -> str | None:
    """The one line a reading command prints while the ledger holds records from before sites."""
    n = ledger.unowned() if ledger.site else 0
    return (f"warning: the ledger {ledger.where} holds {n} record(s) from before sites, shown for no inventory: "
            "`provision ledger adopt INVENTORY` gives them to theirs (docs/lifecycle.md, Sites)") if n else None


def when(ts: float | None) -> str:
    """UTC, to the second; `-` for none."""
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts)) if ts is not None else "-"


def cluster_name(fleet: Fleet, host: str) -> str | None:
    from provisioner.plan import cluster_of

    c = cluster_of(fleet, host)
    return c.name if c is not None else None


def status_rows(fleet: Fleet, ledger: Ledger, now: float | None = None) -> list[dict[str, Any]]:
    """One row per GPU node (inventory order; balancers and other service hosts have no lifecycle): state, since
    and the reason of the transition into it (None for `new`), cluster, the last run's outcome for it, its last
    health pass (when, result, failed checks) and last drift check (when, outcome, items), and what the ledger knows
    of its in-service mark, driver and vLLM (`mark`, `driver`, `vllm`: see recorded_seen).

    Read in bulk (a year of a 10,000-node fleet: issue 47): the site's runs newest first, each run's outcomes once,
    until every node has its last run, health pass, drift check and driver (or 20 runs looked at, as recorded_seen)."""
    states = ledger.states()
    nodes = [h.name for h in fleet.gpu_nodes]
    records = ledger.records(nodes)
    now = time.time() if now is None else now
    slow = burnin_slow(fleet, ledger)
    latest = _latest(ledger, nodes)
    reasons = {str(r[0]): str(r[1]) for r in ledger._db.execute(
        "SELECT host, reason FROM transitions WHERE site = ? ORDER BY id", (ledger.site,))}
    burned = ledger.burnin_hosts()
    slow_of: dict[str, list[Any]] = {}
    for x in slow:
        slow_of.setdefault(x.host, []).append(x)
    rows = []
    for host in nodes:
        state, since = states.get(host, ("new", None))
        lt = latest[host]
        last, health, drift = lt.last, lt.health, lt.drift
        rows.append({
            "host": host, "state": state, "since": since, "reason": reasons.get(host) if host in states else None,
            "cluster": cluster_name(fleet, host),
            "last_run": None if last is None else {
                "id": last[0].id, "command": last[0].command, "started": last[0].started,
                "status": last[0].status, "outcome": last[1], "run_dir": last[0].run_dir},
            "health": None if health is None else {
                "run": health[0].id, "started": health[0].started, "result": health[1], "failed": lt.failed},
            "drift": None if drift is None else {
                "run": drift[0].id, "started": drift[0].started, "outcome": drift[1], "items": lt.items},
            "burnin": burnin_row(ledger, host) if host in burned else None,
            "slow": [{"metric": x.metric, "value": x.value, "median": x.median, "gap": x.gap, "message": x.message}
                     for x in slow_of.get(host, ())],
            **_seen(lt.driver, records.get(host), now),
        })
    return rows


_LINK_CHECKS = ("ib_link", "ib_pair", "nccl_cluster")


def burnin_label(r: Mapping[str, Any]) -> str:
    """A failed burn-in row as `check[gpuN] CODE`, or `check[link] CODE` for a link check (its detail starts with
    the link it names: `mlx5_2:1: ...`, `node01/mlx5_2:1-node02/mlx5_2:1: ...`)."""
    where = "" if r["gpu"] < 0 else f"[gpu{r['gpu']}]"
    if r["check"] in _LINK_CHECKS and r.get("detail") and ": " in str(r["detail"]):
        where = f"[{str(r['detail']).split(': ', 1)[0][:160]}]"
    return r["check"] + where + (" " + r["code"] if r["code"] else "")


def burnin_row(ledger: Ledger, host: str) -> dict[str, Any] | None:
    """The newest burn-in of `host`: run, tier, when, outcome, failed checks as `check[gpuN] CODE`."""
    last = ledger.burnin_last(host)
    if last is None:
        return None
    failed = [burnin_label(r) for r in ledger.burnin(host, int(last["run"])) if r["result"] == "fail"]
    return {"run": last["run"], "tier": last["tier"], "ended": last["ended"], "result": last["status"],
            "failed": failed}


def burnin_distribution(fleet: Fleet, ledger: Ledger) -> list[dict[str, Any]]:
    """Per GPU model and fleet metric: the median and every node's figure (its slowest GPU, newest burn-in), slowest
    first, the slow ones marked with their gap (the page's distribution)."""
    from provisioner.burnin import FLEET_METRICS

    figures = ledger.burnin_figures()
    slow = {(x.host, x.metric): x.gap for x in burnin_slow(fleet, ledger)}
    models = {h.name: str(h.gpu_model) for h in fleet.gpu_nodes}
    out = []
    for model in dict.fromkeys(models.values()):
        for metric in FLEET_METRICS:
            vals = sorted((figures[h][metric], h) for h, m in models.items() if m == model and metric in
                          figures.get(h, {}))
            if not vals:
                continue
            out.append({"model": model, "metric": metric, "median": statistics.median(v for v, _ in vals),
                        "nodes": [{"host": h, "value": v, "slow_gap": slow.get((h, metric))} for v, h in vals]})
    return out


def burnin_slow(fleet: Fleet, ledger: Ledger) -> list[Any]:
    """The slow nodes (provisioner.burnin.slow_nodes) among the fleet's GPU nodes, from each node's newest burn-in:
    its slowest GPU's figure per metric against its GPU model's fleet median."""
    from provisioner.burnin import slow_nodes, slow_settings

    figures = ledger.burnin_figures()
    nodes = {h.name: h for h in fleet.gpu_nodes}
    have = {h: (str(nodes[h].gpu_model), f) for h, f in figures.items() if h in nodes}
    if not have:
        return []
    first = next(iter(nodes.values()))
    fraction, min_sample = slow_settings(first.vars, first.name)
    return slow_nodes(have, fraction=fraction, min_sample=min_sample)


class _Latest:
    """What status_rows needs of one host's newest runs (filled by _latest)."""

    def __init__(self) -> None:
        self.last: tuple[Any, str] | None = None
        self.health: tuple[Any, str] | None = None
        self.drift: tuple[Any, str] | None = None
        self.failed: list[str] = []
        self.items = 0
        self.looked = 0  # runs that touched the host, looked at for a driver (recorded_seen looks at 20)
        self.driver: tuple[str, str, Any] | None = None  # (version, check, health run)

    def done(self) -> bool:
        return (self.last is not None and self.health is not None and self.drift is not None
                and (self.driver is not None or self.looked >= 20))


def _latest(ledger: Ledger, hosts: list[str]) -> dict[str, _Latest]:
    """Per host: its newest outcome, health pass and drift check (as Ledger.last_outcome / last_run_for give them),
    the failed checks and drift items of those, and the driver of the newest of its last 20 runs that reported one."""
    db = ledger._db
    out = {h: _Latest() for h in hosts}
    todo = set(hosts)
    for row in db.execute("SELECT * FROM runs WHERE site = ? ORDER BY id DESC", (ledger.site,)).fetchall():
        if not todo:
            break
        run = ledger._run(row)
        outcomes = {str(r[0]): str(r[1]) for r in db.execute(
            "SELECT host, status FROM host_outcomes WHERE run = ?", (run.id,)) if r[0] in todo}
        checks: dict[str, list[dict[str, Any]]] = {}
        if run.command == "health" or not outcomes:
            # only what the row shows (failed checks) and what health_driver reads: not a pass's 8 rows per host
            for r in db.execute('SELECT host, "check", result, detail FROM health_results WHERE run = ? AND '
                                '(result = \'fail\' OR "check" IN (?, ?))', (run.id, *_DRIVER_CHECKS)):
                if r[0] in todo:
                    checks.setdefault(str(r[0]), []).append({"check": r[1], "result": r[2], "detail": r[3]})
        items: dict[str, int] | None = None
        for h in set(outcomes) | set(checks):
            lt = out[h]
            if h in outcomes:
                o = outcomes[h]
                outcome = "interrupted" if o == "running" and run.status == "interrupted" else o
                if lt.last is None:
                    lt.last = (run, outcome)
                if run.command == "health" and lt.health is None:
                    lt.health = (run, outcome)
                    lt.failed = sorted(str(c["check"]) for c in checks.get(h, []) if c["result"] == "fail")
                if run.command == "drift" and lt.drift is None:
                    if items is None:
                        items = {str(r[0]): int(r[1]) for r in db.execute(
                            "SELECT host, COUNT(*) FROM drift_items WHERE run = ? GROUP BY host", (run.id,))}
                    lt.drift = (run, outcome)
                    lt.items = items.get(h, 0)
            if lt.driver is None and lt.looked < 20:
                lt.looked += 1
                found = health_driver(checks.get(h, [])) if run.command == "health" else None
                if found:
                    lt.driver = (found[0], found[1], run)
            if lt.done():
                todo.discard(h)
    return out


#: The driver packages whose installed version stands for the driver, most telling first (roles/nvidia_driver).
DRIVER_PACKAGES = ("nvidia-kernel-open-", "nvidia-open-", "nvidia-driver-", "nvidia-utils-")
#: The health checks whose message names the driver (health_driver reads these, in this order).
_DRIVER_CHECKS = ("driver", "reboot")
_HEALTH_DRIVER = re.compile(r"^driver (\d+\.\d+(?:\.\d+)?(?:,\d+\.\d+(?:\.\d+)?)*)\b")
_HEALTH_LOADED = re.compile(r"loaded kernel module (\d+\.\d+(?:\.\d+)?)\b")


def health_driver(rows: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(driver version, the check it came from) from one health pass's results: the `driver` check's message
    (nvidia-smi's driver version on the node), else the `reboot` check's loaded kernel module."""
    for check, rx in zip(_DRIVER_CHECKS, (_HEALTH_DRIVER, _HEALTH_LOADED), strict=True):
        for r in rows:
            m = rx.search(str(r.get("detail") or "")) if r.get("check") == check else None
            if m:
                return m.group(1), check
    return None


def record_driver(state: Any) -> tuple[str, str] | None:
    """(driver version, what it is) from a recorded host state: the loaded module's version (a node fact), else
    the installed driver package's version."""
    from provisioner.drift.state import FACTS
    from provisioner.probes.nodeparse import parse_nvrm_version, upstream_version

    for f in FACTS:
        v = parse_nvrm_version(state.get(f"other:fact {f}"))
        if v:
            return v, f"loaded module ({f})"
    for prefix in DRIVER_PACKAGES:
        for key in sorted(k for k in state if k.startswith(f"package:{prefix}")):
            version, _, status = str(state[key]).partition(" ")
            if version and status.endswith(" installed"):
                return upstream_version(version), f"package {key.removeprefix('package:')}"
    return None


def recorded_seen(ledger: Ledger, host: str, record: Any, now: float) -> dict[str, dict[str, Any]]:
    """`mark`, `driver`, `vllm` as the ledger knows them, without asking the node (`provision status --nodes` does):
    the driver from the newest of its last health pass that reported one and its recorded state (the last complete
    `provision run`); the mark `recorded` when that recorded state holds the in-service file (else unknown); vLLM
    unknown (a recorded state keeps only a digest of the venv)."""
    found = None
    for r in ledger.runs(host=host, limit=20):
        hit = health_driver(ledger.health(host, r.id)) if r.command == "health" else None
        if hit:
            found = (hit[0], hit[1], r)
            break
    return _seen(found, record, now)


def _seen(found: tuple[str, str, Any] | None, record: Any, now: float) -> dict[str, dict[str, Any]]:
    """recorded_seen's fields from the driver a health pass reported ((version, check, run) or None) and the record."""
    from provisioner.drift.state import Record
    from provisioner.probes.seen import IN_SERVICE, UNKNOWN, field

    driver, mark = dict(UNKNOWN), dict(UNKNOWN)
    if found:
        version, check, r = found
        driver = field(version, "health", detail=f"{check} check of health #{r.id}", run=r.id, at=r.started, now=now)
    if isinstance(record, Record):
        rec = record_driver(record.state)
        if rec and (driver["at"] is None or record.recorded > driver["at"]):
            driver = field(rec[0], "recorded", detail=f"{rec[1]}, recorded state of run #{record.run}",
                           run=record.run, at=record.recorded, now=now)
        if f"file:{IN_SERVICE}" in record.state:
            mark = field("recorded", "recorded", detail=f"{IN_SERVICE} in the recorded state of run #{record.run}",
                         run=record.run, at=record.recorded, now=now)
    return {"mark": mark, "driver": driver, "vllm": dict(UNKNOWN)}


def health_passed(ledger: Ledger, host: str, since: float | None) -> bool:
    """The health gate: the newest `provision health` pass that covered `host` passed it and began after `since`
    (when the host entered its present state)."""
    last = ledger.last_run_for(host, "health")
    return last is not None and last[1] == "ok" and (since is None or last[0].started >= since)


def cluster_model(cluster: Any, name: str) -> str:
    """The model a vLLM cluster serves, as the lifecycle rules compare clusters (its architecture, else its model)."""
    return str(cluster.get("model_arch") or cluster.get("model") or name)


def serving_clusters(fleet: Fleet, ledger: Ledger) -> set[str]:
    """The clusters whose members are all in service."""
    states = ledger.states()
    return {n for n, c in fleet.clusters.items()
            if c.members and all(states.get(m, ("new", None))[0] == "in-service" for m in c.members)}


def lifecycle_context(fleet: Fleet, ledger: Ledger, host: str) -> Context:
    """The lifecycle rules' context for `host`: its health gate, its burn-in gate, its cluster, every cluster's model
    and members, every host's state."""
    from provisioner.day2.lifecycle import ClusterInfo, Context

    states = ledger.states()
    since = states.get(host, ("new", None))[1]
    clusters = {name: ClusterInfo(model=cluster_model(c, name), members=c.members)
                for name, c in fleet.clusters.items()}
    return Context(health_passed=health_passed(ledger, host, since), cluster=cluster_name(fleet, host),
                   clusters=clusters, states={h: s for h, (s, _) in states.items()},
                   burnin_required=burnin_gate(fleet, host),
                   burnin_passed=burnin_passed(ledger, host, burnin_since(ledger, host)),
                   inventory=str(fleet.source), burnin_tier=burnin_hint_tier(fleet, host))


def burnin_gate(fleet: Fleet, host: str) -> bool:
    """The site's burn-in gate (`burnin_gate`, default ON): into in-service needs a passed burn-in newer than the
    state the node comes from. Only false/no/0/off turn it off: a misspelt value keeps it on (it fails closed)."""
    from provisioner.day2.lifecycle import burnin_gate_on

    h = fleet.hosts.get(host)
    return burnin_gate_on(h.vars.get("burnin_gate", True) if h is not None else True)


def burnin_hint_tier(fleet: Fleet, host: str) -> str:
    """The tier a refusal tells the operator to run: the host's `burnin_return_tier`, quick when that is off."""
    h = fleet.hosts.get(host)
    v = str((h.vars if h is not None else {}).get("burnin_return_tier", "quick")).strip().lower()
    return v if v in ("quick", "standard", "soak") else "quick"


def burnin_since(ledger: Ledger, host: str) -> float | None:
    """From when a burn-in counts for `host`'s way into service: when it entered the state it comes from. For a
    node in `burn-in` that is the state before it (maintenance, quarantined, provisioning: a return tier runs there,
    after the node left service, or while the node sits in burn-in); a tier that ran before the node left service,
    or before a rebuild, never counts. None: the ledger never moved the host (any burn-in counts)."""
    ts = ledger.transitions(host)
    if not ts:
        return None
    if ts[-1].to_state == "burn-in" and len(ts) > 1:
        return float(ts[-2].at)
    return float(ts[-1].at)


def burnin_passed(ledger: Ledger, host: str, since: float | None) -> bool:
    """`host`'s newest `provision burn-in` (any tier) passed and ended after `since`: a pass followed by a failed
    tier does not count."""
    last = ledger.burnin_last(host)
    return last is not None and last["status"] == "ok" and (since is None or float(last["ended"] or 0) >= since)


def history(ledger: Ledger, host: str) -> dict[str, Any]:
    """A host's transitions (oldest first), its runs (newest first, with its outcome) and failed health checks, and
    the daily summaries retention left of older runs (newest day first)."""
    from provisioner.ledger.retention import days as retention_days

    runs = []
    for r in ledger.runs(host=host, limit=100):
        outcome = ledger.host_outcomes(r.id).get(host)
        if outcome and outcome["status"] == "running" and r.status == "interrupted":
            outcome = {**outcome, "status": "interrupted"}
        failed = [h["check"] for h in ledger.health(host, r.id) if h["result"] == "fail"]
        if r.command == "burn-in":
            failed = [burnin_label(b) for b in ledger.burnin(host, r.id) if b["result"] == "fail"]
        runs.append({"id": r.id, "command": r.command, "started": r.started, "ended": r.ended, "status": r.status,
                     "outcome": outcome["status"] if outcome else None, "run_dir": r.run_dir,
                     "failed_checks": failed, "drift": [i for _, i in ledger.drift_items(r.id, host)]})
    return {"host": host, "state": ledger.state(host)[0], "since": ledger.state(host)[1],
            "transitions": [{"from": t.from_state, "to": t.to_state, "reason": t.reason, "at": t.at,
                             "actor": t.actor, "run": t.run, "forced": t.forced} for t in ledger.transitions(host)],
            "runs": runs,
            "remediations": [{"step": s.step, "outcome": s.outcome, "detail": s.detail, "at": s.at, "actor": s.actor}
                             for s in ledger.remediations(host)],
            "days": retention_days(ledger, host)}


def day2_view(ledger: Ledger) -> dict[str, Any]:
    """The day-2 automation as status shows it: the breaker, open incidents (with their durations so far), the
    recommendations waiting for --approve, and every incident's row (provisioner/day2/incidents.py)."""
    from provisioner.day2.incidents import rows

    ev, closed = ledger.breaker()
    table = rows(ledger.incidents())
    rec = [{"id": a.id, "at": a.at, "host": a.host, "kind": a.kind, "step": a.step, "reason": a.reason,
            "source": a.source} for a in ledger.actions(status="recommended")]
    return {"breaker": {"open": ev is not None, "why": ev.why if ev else None, "since": ev.at if ev else None,
                        "closed_at": closed or None},
            "open_incidents": [r for r in table if r["status"] == "open"], "recommended": rec, "incidents": table}
