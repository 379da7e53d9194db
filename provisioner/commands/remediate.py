"""`provision remediate INVENTORY`: apply `lifecycle_policy` to the newest health results (the nightly timer's
step after `provision health`): quarantine, remediate, return, mark for replacement, restart a cluster."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

import provisioner.probes  # noqa: F401  (keeps the SSH key variables in the fleet model)
from provisioner.commands.common import VAULT_HELP, Format, unwrap, use_vault
from provisioner.errors import Exit, UsageError
from provisioner.reports import count

HELP = unwrap("""Apply the quarantine/remediation policy (lifecycle_policy) to the newest health results.

For every GPU node with lifecycle_policy: a failed hard check (ecc, xid, fabricmanager, nvlink, ib: quarantine_on)
quarantines it with the check as reason (the ledger's transitions, the in-service mark removed); a quarantined node
gets the next remediation step (gpu_reset when no process holds a GPU, reboot, power_cycle through its BMC), each
followed by the health gate; a pass returns it (burn-in, in-service, the mark written); N quarantines in
replace_after's window mark it for replacement. --app-fault HOST=WHY reports an application fault (a vLLM crash):
with no hardware signal its cluster is restarted (the vLLM roles), the node is not quarantined. Run `provision
health` first: its results are the ledger's.

--dry-run prints the next action per node and changes nothing (neither the nodes nor the ledger). One line per
action; docs/lifecycle.md has the table of decisions.

Exit codes: 0 done (nodes staying quarantined included), 1 a step, a mark or the ledger failed, or lifecycle_policy
is invalid, 2 usage.""")

ACTOR = "policy:remediate"
QUIET_TAIL = "not watched by the policy"  # holds not worth a line


def _slow(fleet: Any, ledger: Any, host: str) -> str | None:
    """Why `host` is a slow node among its GPU model's nodes (burn-in figures), None when it is not."""
    from provisioner.ledger.view import burnin_slow

    msgs = [x.message for x in burnin_slow(fleet, ledger) if x.host == host]
    return "slow node: " + "; ".join(msgs) if msgs else None


def _facts(fleet: Any, ledger: Any, host: str, app_fault: str | None) -> Any:
    from provisioner.ledger.view import cluster_name
    from provisioner.remediation import Facts, Health, Step

    state, since = ledger.state(host)
    last = ledger.last_run_for(host, "health")
    health = None
    if last is not None:
        checks = {r["check"]: (r["result"], r["detail"]) for r in ledger.health(host, last[0].id)}
        health = Health(run=last[0].id, started=last[0].started, outcome=last[1], checks=checks)
    runs = [r for r in ledger.runs(host=host, limit=50) if r.command == "health" and r.started >= (since or 0.0)]
    health_runs = tuple((r.id, r.started, str(ledger.host_outcomes(r.id).get(host, {}).get("status") or r.status))
                        for r in reversed(runs))
    return Facts(host=host, state=state, since=since, now=time.time(), health=health, health_runs=health_runs,
                 quarantines=tuple(t.at for t in ledger.transitions(host) if t.to_state == "quarantined"),
                 steps=tuple(Step(r.step, r.at, r.outcome) for r in ledger.remediations(host)),
                 cluster=cluster_name(fleet, host), has_bmc=bool(fleet.hosts[host].vars.get("bmc_address")),
                 app_fault=app_fault, slow=_slow(fleet, ledger, host))


class Runner:
    """Executes actions: the ledger writes, the marks and steps on the nodes; `lines` what it said."""

    def __init__(self, inventory: Path, fleet: Any, ledger: Any, timeout: float) -> None:
        self.inventory, self.fleet, self.ledger, self.timeout = inventory, fleet, ledger, timeout
        self.lines: list[dict[str, Any]] = []
        self.failed = False
        self.restarted: set[str] = set()
        self._ops: Any = None

    def ops(self) -> Any:
        """The drain/return steps (provisioner/serving_ops.py), quiet: their lines are relayed into ours."""
        from provisioner.serving_ops import Ops

        if self._ops is None:
            self._ops = Ops(self.inventory, self.fleet, self.ledger, actor=ACTOR, quiet=True, command="remediate")
        return self._ops

    def relay(self, host: str, start: int) -> None:
        for ln in self.ops().lines[start:]:
            self.say(host, ln["action"], ln["line"], ok=ln["ok"])

    def say(self, host: str, kind: str, text: str, ok: bool = True) -> None:
        self.lines.append({"host": host, "action": kind, "ok": ok, "line": text})
        self.failed |= not ok

    def move(self, host: str, to: str, reason: str, *, health_passed: bool = False) -> None:
        from provisioner.ledger.view import lifecycle_context
        from provisioner.lifecycle import transition

        ctx = lifecycle_context(self.fleet, self.ledger, host)
        if health_passed:
            from dataclasses import replace

            ctx = replace(ctx, health_passed=True)
        with self.ledger.atomic():
            res = transition(self.ledger.state(host)[0], to, reason=reason, host=host, force=True, context=ctx)
            self.ledger.record_transition(host, res.from_state, res.to_state, reason=res.reason, actor=ACTOR,
                                          forced=res.forced)
        self.say(host, "transition", f"{host}: {res.from_state} -> {res.to_state} ({res.reason})")
        for n in res.notes:
            self.say(host, "note", f"  note: {n}")

    def mark(self, host: str, on: bool, why: str) -> None:
        from provisioner.probes.health import IN_SERVICE, mark_command
        from provisioner.probes.ssh import run_one, target_for

        t = target_for(self.fleet.hosts[host])
        note = {"since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "by": "provision remediate",
                "passed": ["health"], "why": why}
        r = run_one(t, mark_command(on, note, sudo=(t.user or "root") != "root"), timeout=60.0)
        if not (r.ok and r.rc == 0):
            what = "written" if on else "removed"
            self.say(host, "mark", f"{host}: {IN_SERVICE} not {what}: {r.error or r.stderr.strip()[:200]}", ok=False)

    def gate(self, host: str) -> None:
        from provisioner.ledger.record import record_health
        from provisioner.paths import ledger_path
        from provisioner.probes.health import run_health

        t0, started = time.monotonic(), time.time()
        res = run_health(self.fleet, [host], timeout=self.timeout)
        record_health(res, self.inventory, started, time.monotonic() - t0, path=ledger_path(), site=self.ledger.site)
        h = res[host]
        self.say(host, "gate", f"{host}: health gate: {'pass' if h.ok else 'fail'}" +
                 ("" if h.ok else f" ({h.message[:200]})"))
        if h.ok:  # the burn-in on the way back (burnin_return_tier); with burnin_gate on, in-service needs it passed
            from provisioner.burnin_return import return_burnin

            for _, (_ok, line) in return_burnin(self.fleet, self.inventory, [host], path=ledger_path()).items():
                self.say(host, "gate", f"{host}: {line}", ok=_ok)

    def quarantine(self, a: Any) -> None:
        from provisioner.ledger.view import cluster_name, serving_clusters

        state = self.ledger.state(a.host)[0]
        if state == "in-service" and cluster_name(self.fleet, a.host) in serving_clusters(self.fleet, self.ledger):
            self.drain_cluster(a)
            return
        if state == "in-service":
            self.move(a.host, "draining", f"quarantine: {a.reason}")
        if self.ledger.state(a.host)[0] != "quarantined":
            self.move(a.host, "quarantined", a.reason)
        self.mark(a.host, False, a.reason)

    def drain_cluster(self, a: Any) -> None:
        """The node's whole vLLM cluster out as `provision drain` takes it (balancer, in flight, stop, marks): the
        node quarantined, the other members to maintenance. Every step is tried; a failed one is reported."""
        from provisioner.drain import plan

        ops, start = self.ops(), len(self.ops().lines)
        p = plan(self.fleet, [a.host])
        why = f"quarantine: {a.reason}"
        ops.move([(h, "draining") for h in p.hosts if ops.state(h) == "in-service"], why, force=True)
        for n in p.notes:
            ops.say("note", f"  note: {n}")
        if p.heads and ops.balancer(add=[h.server for h in p.heads]):
            ops.wait_inflight(p.heads, 60.0)
        for c in p.clusters:
            ops.stop(c, p.members[c])
        ops.mark(p.hosts, False, why)
        ops.move([(a.host, "quarantined")], a.reason, force=True)
        ops.move([(h, "maintenance") for h in p.hosts if h != a.host and ops.state(h) == "draining"],
                 f"cluster out: {a.host} quarantined ({a.reason})", force=True)
        self.relay(a.host, start)

    def cluster_out(self, host: str) -> bool:
        """`host`'s cluster went out with it (its other members drained or back already): return it as a whole.
        A cluster with a member never brought into service (new, provisioning) was not serving: the node alone."""
        from provisioner.ledger.view import cluster_name

        c = cluster_name(self.fleet, host)
        ok = ("draining", "maintenance", "quarantined", "burn-in", "in-service")
        return c is not None and all(self.ledger.state(m)[0] in ok for m in self.fleet.clusters[c].members
                                     if m != host)

    def return_cluster(self, a: Any) -> None:
        """The node's cluster back as `provision return` brings it (the members not gated since they left service
        are gated now), launched and put back into the balancer."""
        from provisioner.commands.drain import return_clusters
        from provisioner.drain import plan
        from provisioner.ledger.view import health_passed
        from provisioner.lifecycle import Refused

        ops, start = self.ops(), len(self.ops().lines)
        p = plan(self.fleet, [a.host])
        passed = [h for h in p.hosts if health_passed(self.ledger, h, self.ledger.state(h)[1])]
        try:
            return_clusters(ops, p, reason=a.reason, wait_healthy=self.timeout, gate_timeout=self.timeout,
                            passed=passed)
        except Refused as exc:
            ops.say("refused", f"{a.host}: return refused: {exc}", ok=False)
        self.relay(a.host, start)

    def run(self, a: Any) -> None:
        from provisioner.probes.remedy import STEP_FUNCS

        if a.kind == "quarantine":
            self.say(a.host, a.kind, a.line())
            self.quarantine(a)
        elif a.kind == "replace":
            self.say(a.host, a.kind, a.line())
            self.quarantine(a)
            self.ledger.record_step(a.host, "replace", "marked", actor=ACTOR, detail=a.reason)
        elif a.kind == "remediate":
            self.say(a.host, a.kind, a.line())
            r = STEP_FUNCS[a.step](self.fleet, a.host)
            self.ledger.record_step(a.host, a.step, "done" if r.ok else "failed", actor=ACTOR, detail=r.detail)
            self.say(a.host, "step", f"{a.host}: {a.step}: {'done' if r.ok else 'failed'} ({r.detail})", ok=r.ok)
            self.gate(a.host)
        elif a.kind == "gate":
            self.gate(a.host)
        elif a.kind == "return" and self.cluster_out(a.host):
            self.say(a.host, a.kind, a.line())
            self.return_cluster(a)
        elif a.kind == "return":
            self.say(a.host, a.kind, a.line())
            self.move(a.host, "burn-in", a.reason)
            self.move(a.host, "in-service", a.reason, health_passed=True)
            self.mark(a.host, True, a.reason)
        elif a.kind == "restart_cluster":
            if a.cluster in self.restarted:
                return
            self.restarted.add(a.cluster)
            self.say(a.host, a.kind, a.line())
            self.restart(a)

    def restart(self, a: Any) -> None:
        from provisioner.runner import make_progress, run_playbook

        members = self.fleet.clusters[a.cluster].members
        r = run_playbook(self.inventory, command="remediate-restart", limit=",".join(members), tags="vllm",
                         progress=make_progress("none"), fleet=self.fleet)
        ok = not r.error and not r.failed_hosts and not r.unreachable_hosts and r.rc in (0, None)
        self.say(a.host, "restart", f"{a.cluster}: vLLM relaunch on {', '.join(members)}: "
                 f"{'ok' if ok else 'FAILED ' + (r.error or ', '.join(r.failed_hosts + r.unreachable_hosts))}",
                 ok=ok)


def _app_faults(fleet: Any, given: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in given:
        host, sep, why = item.partition("=")
        if not sep or not why.strip():
            raise UsageError(f"--app-fault {item!r}: expected HOST=WHY (e.g. n1='vLLM exited 1')")
        if host not in fleet.hosts:
            raise UsageError(f"--app-fault: {host} is not a host of the inventory")
        out[host] = why.strip()
    return out


def run(inventory: Path, *, limit: str | None = None, dry_run: bool = False, app_fault: list[str] | None = None,
        fmt: Format = Format.text, timeout: float = 900.0) -> int:
    from provisioner.commands.common import select
    from provisioner.inventory import load_fleet
    from provisioner.ledger import LedgerError
    from provisioner.ledger.site import site_of
    from provisioner.ledger.view import open_ledger, read_ledger
    from provisioner.lifecycle import Refused
    from provisioner.remediation import decide, policy_of
    from provisioner.rules import run_rules

    if timeout <= 0:
        raise UsageError("--timeout must be > 0")
    fleet = load_fleet(inventory)
    faults = _app_faults(fleet, app_fault or [])
    hosts = [h for h in select(fleet, limit) if policy_of(fleet.hosts[h].vars.get("lifecycle_policy")) is not None]
    bad = [f for f in run_rules(fleet) if f.code.startswith("LC") and f.severity == "error"
           and (f.host is None or f.host in hosts)]
    if bad:
        for f in bad:
            sys.stderr.write(f"error: {f.line()}\n")
        return int(Exit.FAIL)
    if not hosts:
        sys.stdout.write("remediate: no GPU node has lifecycle_policy (docs/lifecycle.md): nothing to do\n")
        return int(Exit.OK)
    policies = {h: policy_of(fleet.hosts[h].vars.get("lifecycle_policy")) for h in hosts}
    quiet = ("healthy", "no health result")
    try:
        with (read_ledger(site=site_of(fleet)) if dry_run else open_ledger(fleet)) as ledger:
            rn = Runner(inventory, fleet, ledger, timeout)
            for h in hosts:
                for _ in range(12):  # each step is tried once per quarantine: a few rounds always end it
                    a = decide(_facts(fleet, ledger, h, faults.get(h)), policies[h])  # type: ignore[arg-type]
                    if a.kind == "hold" or dry_run:
                        if a.kind != "hold" or not (a.reason in quiet or a.reason.endswith(QUIET_TAIL)):
                            rn.say(h, a.kind, a.line())
                        break
                    rn.run(a)
    except (LedgerError, Refused) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return int(Exit.FAIL)
    if fmt is Format.json:
        sys.stdout.write(json.dumps({"ok": not rn.failed, "dry_run": dry_run, "actions": rn.lines}, indent=2) + "\n")
    else:
        for ln in rn.lines:
            sys.stdout.write(ln["line"] + "\n")
        n = sum(ln["action"] in ("quarantine", "replace", "remediate", "return", "restart_cluster") for ln in rn.lines)
        sys.stdout.write(f"remediate: {count(len(hosts), 'node')} under the policy, {count(n, 'action')}"
                         f"{' (dry run: nothing changed)' if dry_run else ''}\n")
    return int(Exit.FAIL if rn.failed else Exit.OK)


def register(app: typer.Typer) -> None:
    @app.command("remediate", help=HELP)
    def remediate_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        limit: Annotated[str | None, typer.Option("--limit", "-l", help="Hosts/groups/globs, Ansible style.")] = None,
        dry_run: Annotated[bool, typer.Option(
            "--dry-run", help="Print the next action per node; change nothing.")] = False,
        app_fault: Annotated[list[str] | None, typer.Option(
            "--app-fault", help="HOST=WHY: an application fault seen on HOST (repeat).", show_default=False)] = None,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Text or JSON.")] = Format.text,
        timeout: Annotated[float, typer.Option("--timeout", help="Seconds per health gate.")] = 900.0,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, limit=limit, dry_run=dry_run, app_fault=app_fault, fmt=fmt, timeout=timeout))
