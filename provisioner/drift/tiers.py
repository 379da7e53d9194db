"""The two-tier drift's controller side: each host's input digest, the probe over SSH, recording a host's state after
a complete run, and sorting hosts into tier 1 (the probe matched the record: clean) and tier 2 (Ansible check+diff).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.drift import state as hoststate

#: Threads for the probe's fan-out (each host's work is waited on: bounded by SSH handshakes, not by the controller).
PROBE_FORKS = 64
PROBE_TIMEOUT = 60.0


def _content(code: bool = True) -> str:
    from provisioner import paths

    return hoststate.content_hash(paths.DATA_ROOT, *([paths.PACKAGE_DIR] if code else []))


def host_inputs(fleet: Any, hosts: Iterable[str], *, playbook: Any = None, tags: str | None = None,
                skip_tags: str | None = None, extra: Mapping[str, Any] | None = None,
                code: bool = True, key: bytes) -> dict[str, str]:
    """{host: input digest} for `hosts` of a fleet that passed the rules (the plan is computed once for all), keyed
    with `key` (the ledger's: Ledger.digest_key, the one key of the digests it records).

    code=False: only what the roles apply (variables, plan, playbooks/roles/templates), without the run's options,
    the suite's Python or its version: a rollout's spec, which a CLI fix between a stop and its rerun keeps."""
    from provisioner import __version__, plan

    computed = plan.compute(fleet)
    content = _content(code)
    options = {"playbook": str(Path(playbook).resolve()) if playbook else "site.yml", "tags": tags or "",
               "skip_tags": ",".join(sorted(t for t in (skip_tags or "").split(",") if t.strip())),
               "extra": dict(extra or {})} if code else {}
    # the fleet-wide part lists every host: digested once here, not serialized again for each host (O(hosts^2))
    fleet_part = hoststate.plain_digest({"clusters": computed.get("clusters"), "targets": computed.get("targets")})
    return {h: hoststate.inputs_digest(host_vars=fleet.hosts[h].vars, host_plan=computed["hosts"].get(h),
                                       fleet_plan=fleet_part, run_options=options, content=content,
                                       version=__version__ if code else "", key=key)
            for h in hosts}


@dataclass
class Probed:
    """One host's probe: its state map, or why there is none (unreachable, no python3, ...)."""

    host: str
    state: dict[str, str] | None = None
    error: str | None = None
    seconds: float = 0.0


def via_nodes(fleet: Any, hosts: list[str], nodes: list[str] | None) -> dict[str, str]:
    """{host: execution node} for a sharded drift or run (the shard plan's): the probe reaches each host through the
    execution node that runs its shard, the network path Ansible takes. Empty without execution nodes."""
    if not nodes or not hosts:
        return {}
    from provisioner.runner.shards import plan as shard_plan

    return {h: s.node for s in shard_plan(fleet, hosts, nodes) for h in s.hosts}


def probe(fleet: Any, hosts: Iterable[str], *, forks: int = PROBE_FORKS, timeout: float = PROBE_TIMEOUT,
          via: Mapping[str, str] | None = None) -> dict[str, Probed]:
    """Run the probe on every host (one SSH exec each, the preflight's connection settings and host-key policy;
    through the host's execution node when `via` names one)."""
    from dataclasses import replace

    from provisioner.probes import ssh

    via = via or {}
    jump = {n: ssh.target_for(fleet.hosts[n]) for n in set(via.values())}
    targets = [replace(ssh.target_for(fleet.hosts[h]), via=jump[via[h]]) if h in via
               else ssh.target_for(fleet.hosts[h]) for h in hosts]
    cmd = hoststate.probe_command()

    def command(t: Any) -> str:
        return cmd if (t.user or "root") == "root" else "sudo -n " + cmd

    out: dict[str, Probed] = {}
    for name, r in ssh.run_many(targets, command, timeout=timeout, forks=forks).items():
        if not r.ok:
            out[name] = Probed(name, error=f"unreachable: {r.error}", seconds=r.seconds)
            continue
        try:
            out[name] = Probed(name, state=hoststate.parse_probe(r.stdout), seconds=r.seconds)
        except hoststate.StateError as exc:
            tail = (r.stderr.strip().splitlines() or [""])[-1][:200]
            out[name] = Probed(name, error=f"{exc}{': ' + tail if tail else ''}", seconds=r.seconds)
    return out


def _ledger_path(run_dir: str | None) -> Path:
    from provisioner.paths import ledger_path

    return ledger_path(Path(run_dir).parent) if run_dir else ledger_path()


def record_run(fleet: Any, result: Any, *, playbook: Any = None, tags: str | None = None,
               skip_tags: str | None = None, extra: Mapping[str, Any] | None = None,
               exec_nodes: list[str] | None = None) -> str | None:
    """After `provision run`: the state of every host the run completed (ok/changed) is probed and recorded with its
    input digest; hosts that failed or were unreachable lose their record. Not for check runs or --tags runs (a
    partial run is not a converged state). Best effort: returns a warning line, never raises."""
    from provisioner.ledger.store import Ledger

    if result.check or tags or result.error:
        return None
    done = [n for n, h in result.hosts.items() if h.state in ("ok", "changed") and n in fleet.hosts]
    drop = [n for n, h in result.hosts.items() if h.state in ("failed", "unreachable")]
    try:
        from provisioner.ledger.site import site_of

        with Ledger.open(_ledger_path(result.run_dir), site=site_of(fleet)) as ledger:
            key = ledger.digest_key()
        inputs = host_inputs(fleet, done, playbook=playbook, tags=tags, skip_tags=skip_tags, extra=extra, key=key)
        probed = probe(fleet, done, via=via_nodes(fleet, done, exec_nodes))
        drop += [h for h in done if probed[h].state is None]
        with Ledger.open(_ledger_path(result.run_dir), site=site_of(fleet)) as ledger:
            run = _run_id(ledger, result.run_dir)
            ledger.put_states([(h, run, inputs[h], st, result.hosts[h].roles) for h in done
                               if (st := probed[h].state) is not None], drop=drop)
    except Exception as exc:  # noqa: BLE001 (the run is done; its record is an optimisation of the next drift)
        return f"warning: host states not recorded ({type(exc).__name__}: {exc}); the next drift checks with Ansible"
    missed = [h for h in done if probed[h].state is None]
    if missed:
        return (f"warning: state not recorded for {', '.join(sorted(missed))} ({probed[missed[0]].error}); "
                "their next drift checks with Ansible")
    return None


def _run_id(ledger: Any, run_dir: str | None) -> int | None:
    if not run_dir:
        return None
    row = ledger._db.execute("SELECT id FROM runs WHERE run_dir = ? AND site = ? ORDER BY id DESC LIMIT 1",
                             (run_dir, ledger.site)).fetchone()
    return int(row[0]) if row else None


@dataclass
class Tiers:
    """The sorting of a drift's hosts: tier 1 = the probe matched the record (clean), tier 2 = Ansible checks them,
    with the reason per host; `changes` = what the probe found per host; `probed` = the probes."""

    tier1: list[str] = field(default_factory=list)
    tier2: dict[str, str] = field(default_factory=dict)
    changes: dict[str, list[hoststate.Change]] = field(default_factory=dict)
    probed: dict[str, Probed] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    records: dict[str, hoststate.Record] = field(default_factory=dict)
    via: dict[str, str] = field(default_factory=dict)
    probe_seconds: float = 0.0


def sort_hosts(fleet: Any, hosts: list[str], *, full: bool, playbook: Any = None, tags: str | None = None,
               skip_tags: str | None = None, extra: Mapping[str, Any] | None = None,
               ledger_path: Path | None = None, exec_nodes: list[str] | None = None) -> Tiers:
    """Decide each host's tier (see Tiers). `full`: every host to tier 2 (the weekly run). --tags drifts go to tier 2
    as well (records are of whole runs)."""
    import time

    from provisioner.ledger.store import Ledger

    t = Tiers()
    if full:
        t.tier2 = {h: "--full" for h in hosts}
        return t
    if tags:
        t.tier2 = {h: "--tags given (records are of whole runs)" for h in hosts}
        return t
    from provisioner.ledger.site import site_of
    from provisioner.paths import ledger_path as default_path

    seal: Any = None
    try:
        with Ledger.open(ledger_path or default_path(), site=site_of(fleet)) as ledger:
            records = ledger.records(hosts)
            key = ledger.digest_key()  # the one key: inputs, and the probe's file digests to compare (sealer)
            seal = ledger.sealer()
    except Exception as exc:  # noqa: BLE001 (no ledger: everyone is checked by Ansible)
        sys.stderr.write(f"warning: ledger not readable ({exc}): every host is checked with Ansible\n")
        import secrets

        records, key = {}, secrets.token_bytes(hoststate.KEY_BYTES)  # matches no record; none is written either
    t.inputs = host_inputs(fleet, hosts, playbook=playbook, tags=tags, skip_tags=skip_tags, extra=extra, key=key)
    t.records = records
    candidates = []
    for h in hosts:
        why = hoststate.tier2_reason(records.get(h), t.inputs[h])
        if why:
            t.tier2[h] = why
        else:
            candidates.append(h)
    t0 = time.monotonic()
    t.via = via_nodes(fleet, hosts, exec_nodes)
    t.probed = probe(fleet, candidates, via=t.via) if candidates else {}
    t.probe_seconds = time.monotonic() - t0
    for h in candidates:
        p = t.probed[h]
        if p.state is None:
            t.tier2[h] = f"probe failed: {p.error}"
            continue
        changes = hoststate.compare(records[h].state, seal(p.state))
        if changes:
            t.changes[h] = changes
            t.tier2[h] = f"probe found {len(changes)} change(s): " + "; ".join(c.text for c in changes[:3]) + (
                f"; ... ({len(changes) - 3} more)" if len(changes) > 3 else "")
        else:
            t.tier1.append(h)
    return t


def refresh(fleet: Any, tiers: Tiers, result: Any, ledger_path: Path) -> None:
    """After tier 2: a host that Ansible found clean (reached, no drift, no failure) gets a fresh record with its
    current inputs (check mode would change nothing, so its state is a converged one for them; hosts not probed yet
    are probed now), so the next drift checks it with the probe alone. Best effort."""
    from provisioner.ledger.store import Ledger

    clean = [h for h in tiers.tier2 if h in tiers.inputs and h in result.hosts
             and result.hosts[h].state in ("ok", "changed") and not result.hosts[h].drift
             and not result.hosts[h].failures]
    if not clean:
        return
    try:
        missing = [h for h in clean if tiers.probed.get(h) is None or tiers.probed[h].state is None]
        probed = {**tiers.probed, **(probe(fleet, missing, via=tiers.via) if missing else {})}
        rows = [(h, None, tiers.inputs[h], st, result.hosts[h].roles) for h in clean
                if (st := probed[h].state) is not None]
        from provisioner.ledger.site import site_of

        with Ledger.open(ledger_path, site=site_of(fleet)) as ledger:
            ledger.put_states(rows)
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"warning: refreshed host states not recorded ({exc})\n")


def full_due(inventory: str, days: float, ledger_path: Path) -> bool:
    """Is the last full drift of `inventory` older than `days` (or none on record, or no ledger)?"""
    import time

    from provisioner.ledger.store import Ledger

    try:
        with Ledger.open(ledger_path) as ledger:
            last = ledger.last_full_drift(str(Path(inventory).resolve()))
    except Exception:  # noqa: BLE001 (no ledger: a full check is the safe side)
        return True
    return last is None or time.time() - last > days * 86400


def full_done(inventory: str, ledger_path: Path) -> None:
    from provisioner.ledger.store import Ledger

    try:
        with Ledger.open(ledger_path) as ledger:
            ledger.full_drift_done(str(Path(inventory).resolve()))
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"warning: ledger not updated with this full drift ({exc})\n")


#: A tier-2 reason's kind (the summary counts hosts per kind).
REASON_KINDS = (("--full", "full"), ("--tags", "tags"), ("no recorded state", "no record"),
                ("recorded state corrupted", "record corrupted"), ("inputs changed", "inputs changed"),
                ("probe failed", "probe failed"), ("probe found", "probe found changes"))


def reason_kind(reason: str) -> str:
    return next((k for prefix, k in REASON_KINDS if reason.startswith(prefix)), "other")


def _caught(item: Any, changes: list[hoststate.Change]) -> bool:
    """Did the probe see this drift item's resource change (the same file or a file under it, package, unit)?"""
    for c in changes:
        if item.kind == "file" and c.kind == "file" and (c.resource == item.resource
                                                         or c.resource.startswith(item.resource.rstrip("/") + "/")):
            return True
        if item.kind == "package" and c.kind == "package" and c.resource == item.resource:
            return True
        if item.kind == "service" and c.kind == "service" and c.resource.split(".")[0] == item.resource.split(".")[0]:
            return True
    return False


def merge(tiers: Tiers, result: Any, targeted: list[str]) -> None:
    """Fold the tiers into a drift result: tier-1 hosts as clean hosts, each host's tier and reason, each item's
    tier, and the summary counts."""
    from provisioner.results import HostResult

    for h in tiers.tier1:
        rec = tiers.records.get(h)
        result.hosts[h] = HostResult(name=h, seen=True, tier=1, tier_reason="the probe matched the recorded state",
                                     roles=list(rec.roles) if rec else [])
    for h, why in tiers.tier2.items():
        hr = result.host(h)
        hr.tier, hr.tier_reason = 2, why
        changes = tiers.changes.get(h, [])
        hr.probe_changes = [c.text for c in changes]
        for d in hr.drift:
            d.tier = 1 if _caught(d, changes) else 2
    result.targeted = list(targeted)
    reasons: dict[str, int] = {}
    for why in tiers.tier2.values():
        k = reason_kind(why)
        reasons[k] = reasons.get(k, 0) + 1
    result.tiers = {"tier1": len(tiers.tier1), "tier2": len(tiers.tier2), "reasons": reasons,
                    "probe_seconds": round(tiers.probe_seconds, 3)}


def probe_only_result(inventory: Any, playbook: Any, limit: str | None, started: float, *, site: str | None = None,
                      targeted: list[str] | None = None) -> Any:
    """The RunResult of a drift in which no host needed Ansible (its own run directory, indexed in the ledger)."""
    import time

    from provisioner import paths
    from provisioner.ledger.record import Recorder
    from provisioner.results import RunResult
    from provisioner.runner.config import new_run_dir

    run_dir = new_run_dir("drift")
    rec = Recorder("drift", inventory, targeted=targeted, limit=limit, site=site)
    rec.on_run_dir(run_dir)
    result = RunResult(command="drift", inventory=str(inventory),
                       playbook=str(playbook or paths.PLAYBOOKS / "site.yml"), run_dir=str(run_dir),
                       artifact_dir="", started=started, check=True, limit=limit, status="successful", rc=0)
    result.duration = time.time() - started
    return result, rec
