"""The day-2 executor: the one module that acts on nodes, balancers, BMCs and the ledger. Drain and return (the
balancer's drained list, in-flight requests, stopping and launching vLLM, the in-service mark, the health gate),
the remediation actions, the onboarding's lifecycle records and the rolling upgrade's batches. The decisions it
carries out are the pure modules beside it (lifecycle, policy, rails, rollout, drain)."""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from provisioner import PROJECT_ROOT
from provisioner.day2.drain import Head, Plan, inflight
from provisioner.model import Fleet
from provisioner.probes.ssh import as_root

BALANCER_PLAYBOOK = PROJECT_ROOT / "playbooks" / "balancer.yml"
VLLM_UNITS = ("vllm.service", "vllm-ray.service")
SPLIT = "--- provisioner: drained list above, nginx config below ---"


def http_get_command(url: str) -> str:
    """Shell for the node: GET `url`, print `STATUS` then the body (python3 is on every managed node)."""
    code = ("import sys,urllib.request,urllib.error\n"
            "try:\n r=urllib.request.urlopen(sys.argv[1],timeout=5);print(r.status);print(r.read().decode())\n"
            "except urllib.error.HTTPError as e:\n print(e.code)\n"
            "except Exception as e:\n print(0);print(e)\n")
    return f"python3 -c {shlex.quote(code)} {shlex.quote(url)}"


def stop_command(user: str | None) -> str:
    """Stop vLLM's units (those that exist) on a member."""
    parts = [f'if [ "$(systemctl show -p LoadState --value {u})" = loaded ]; then systemctl stop {u}; fi'
             for u in VLLM_UNITS]
    return as_root("; ".join(parts), user)


class Ops:
    """One command's steps on `fleet`; `say` prints each line as it happens (text) or keeps it (json)."""

    def __init__(self, inventory: Path, fleet: Fleet, ledger: Any, *, actor: str, quiet: bool = False,
                 extravars: Mapping[str, Any] | None = None, command: str = "drain") -> None:
        self.inventory, self.fleet, self.ledger, self.actor = inventory, fleet, ledger, actor
        self.quiet, self.command = quiet, command
        from provisioner.runner.config import copy_extra

        self.extravars = copy_extra(dict(extravars) if extravars is not None and not isinstance(extravars, dict)
                                    else extravars)
        self.lines: list[dict[str, Any]] = []
        self.failed = False

    # --- output --------------------------------------------------------------------------------------------
    def say(self, kind: str, text: str, ok: bool = True, **extra: Any) -> None:
        self.lines.append({"action": kind, "ok": ok, "line": text, **extra})
        self.failed |= not ok
        if not self.quiet:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    # --- lifecycle -----------------------------------------------------------------------------------------
    def check(self, moves: Iterable[tuple[str, str]], reason: str, *, force: bool = False,
              health_passed: bool = False) -> list[Any]:
        """Every (host, target) move checked in order against the states as they would be (Refused for the first
        that is not allowed): nothing is recorded until all pass."""
        from provisioner.day2.lifecycle import transition
        from provisioner.ledger.view import lifecycle_context

        sim = {h: s for h, (s, _) in self.ledger.states().items()}
        out = []
        for host, target in moves:
            ctx = replace(lifecycle_context(self.fleet, self.ledger, host), states=dict(sim))
            if health_passed:
                ctx = replace(ctx, health_passed=True)
            res = transition(sim.get(host, "new"), target, reason=reason, host=host, force=force, context=ctx)
            sim[host] = target
            out.append(res)
        return out

    def move(self, moves: Iterable[tuple[str, str]], reason: str, *, force: bool = False,
             health_passed: bool = False, before: Callable[[], None] | None = None) -> list[Any]:
        """`check` the moves and record them in one ledger transaction (Ledger.atomic): another controller's check
        and write cannot come between (two drains of the two clusters of one model: the second one sees the first
        one's and is refused). Refused: nothing recorded. `before` says what comes ahead of the transitions' lines."""
        moves = list(moves)
        with self.ledger.atomic():
            results = self.check(moves, reason, force=force, health_passed=health_passed)
            for res in results:
                self.ledger.record_transition(res.host, res.from_state, res.to_state, reason=res.reason,
                                              actor=self.actor, forced=res.forced)
        if before is not None:
            before()
        for res in results:
            self.say("transition", f"{res.host}: {res.from_state} -> {res.to_state} ({res.reason})", host=res.host)
            for n in res.notes:
                if "drains as a whole" not in n:
                    self.say("note", f"  note: {n}", host=res.host)
        return results

    def state(self, host: str) -> str:
        return str(self.ledger.state(host)[0])

    # --- the balancer --------------------------------------------------------------------------------------
    def lbs(self) -> list[str]:
        return [n for n, h in self.fleet.hosts.items() if "lb" in h.groups]

    def balancer(self, *, add: Iterable[str] = (), remove: Iterable[str] = ()) -> bool:
        """The heads' servers into / out of every balancer's drained list, nginx re-rendered and reloaded."""
        from provisioner.runner import make_progress, run_playbook

        add, remove = sorted(add), sorted(remove)
        lbs = self.lbs()
        what = ("out of" if add else "back into") + " the balancer"
        if not lbs:
            self.say("balancer", f"balancer: no host in group lb: nothing to take {what.split()[0]}")
            return True
        t0 = time.monotonic()
        servers = ", ".join(add or remove)
        if self._direct(lbs, add, remove):
            self.say("balancer", f"balancer ({', '.join(lbs)}): {servers} {what}: nginx reloaded over SSH "
                     f"({time.monotonic() - t0:.1f} s)", seconds=round(time.monotonic() - t0, 1))
            return True
        r = run_playbook(self.inventory, command=f"{self.command}-balancer", playbook=BALANCER_PLAYBOOK,
                         limit=",".join(lbs), extravars={"lb_drain_add": add, "lb_drain_remove": remove},
                         progress=make_progress("none"), fleet=self.fleet)
        bad = r.failed_hosts + r.unreachable_hosts
        ok = not r.error and not bad and r.rc in (0, None)
        self.say("balancer", f"balancer ({', '.join(lbs)}): {servers} {what}: " +
                 (f"nginx reloaded ({time.monotonic() - t0:.1f} s)" if ok else
                  f"FAILED ({r.error or ', '.join(bad)}; run dir {r.run_dir})"), ok=ok,
                 seconds=round(time.monotonic() - t0, 1))
        return ok

    def _direct(self, lbs: list[str], add: list[str], remove: list[str]) -> bool:
        """The drained list changed on every balancer over SSH, without the playbook: the list file and the servers'
        `down` in the nginx config written as serving_lb renders them (drain.rewrite_conf), `nginx -t` (the old
        config put back if it fails), a graceful `systemctl reload nginx`. With the active health check the `down`s go
        into its rendered source and its own command (drain.LbPaths.checker) writes the live file, checks and
        reloads. False (the caller runs the playbook) when a balancer has templated paths or a server line this
        cannot find."""
        from provisioner.day2.drain import balancer_script, direct_paths
        from provisioner.probes.ssh import run_one, target_for

        for h in lbs:
            paths = direct_paths(self.fleet, h)
            if paths is None:
                return False
            t = target_for(self.fleet.hosts[h])
            d, c = shlex.quote(paths.drained), shlex.quote(paths.conf)
            r = run_one(t, as_root(f"cat {d} 2>/dev/null; echo '{SPLIT}'; cat {c}", t.user), timeout=30.0)
            if not (r.ok and r.rc == 0 and SPLIT in r.stdout):
                return False
            now, _, text = r.stdout.partition(SPLIT + "\n")
            script = balancer_script(paths, now.split(), text, add=add, remove=remove)
            if script is None:
                return False
            w = run_one(t, as_root(script, t.user), timeout=60.0)
            if not (w.ok and w.rc == 0):
                return False
        return True

    # --- vLLM on the heads ---------------------------------------------------------------------------------
    def _get(self, head: Head, path: str) -> tuple[int, str]:
        from provisioner.probes.ssh import run_one, target_for

        t = target_for(self.fleet.hosts[head.host])
        r = run_one(t, http_get_command(f"http://{head.server}{path}"), timeout=30.0)
        if not (r.ok and r.rc == 0):
            return 0, r.error or r.stderr.strip()[:200]
        status, _, body = r.stdout.partition("\n")
        return (int(status) if status.strip().isdigit() else 0), body

    def wait_inflight(self, heads: Iterable[Head], wait_s: float, poll: float = 1.0) -> int:
        """Wait (at most `wait_s`) until no request runs or waits on the heads; returns the number cut."""
        heads = list(heads)
        t0 = time.monotonic()
        first: dict[str, int | None] = {}
        left: dict[str, int | None] = {}
        while True:
            for h in heads:
                code, text = self._get(h, "/metrics")
                n = inflight(text) if code == 200 else None
                first.setdefault(h.cluster, n)
                left[h.cluster] = n
            if all(not n for n in left.values()) or time.monotonic() - t0 >= wait_s:
                break
            time.sleep(poll)
        cut = sum(n or 0 for n in left.values())
        for h in heads:
            f, n = first[h.cluster], left[h.cluster]
            if f is None:
                self.say("inflight", f"{h.cluster}: in flight: not readable at {h.server} (vLLM not serving)",
                         cluster=h.cluster)
            else:
                self.say("inflight", f"{h.cluster}: in flight: {f} when taken out, {n or 0} left after "
                         f"{time.monotonic() - t0:.1f} s" + (f" (cut: {n}, --wait {wait_s:g} s)" if n else ""),
                         cluster=h.cluster, at_drain=f, cut=n or 0)
        return cut

    def _generates(self, head: Head) -> Any:
        """The generation probe on the head, judged against its launch record (provisioner/probes/serving.py)."""
        from provisioner.probes.serving import probe_head

        return probe_head(self.fleet, head.cluster, head.host, head.port)

    def wait_healthy(self, heads: Iterable[Head], timeout: float, poll: float = 3.0) -> bool:
        """Wait until every head GENERATES (the generation probe with its launch answer; /health is only a hint)."""
        pending = {h.cluster: h for h in heads}
        why: dict[str, str] = {}
        t0 = time.monotonic()
        while pending and time.monotonic() - t0 < timeout:
            for c, h in list(pending.items()):
                if self._get(h, "/health")[0] != 200:
                    why[c] = "no /health 200"
                    continue
                v = self._generates(h)
                if v.ok:
                    self.say("healthy", f"{c}: generates at {h.server} (launch answer, {v.latency_s:.1f} s) after "
                             f"{time.monotonic() - t0:.1f} s", cluster=c)
                    del pending[c]
                else:
                    why[c] = f"/health 200 but the generation probe failed: {v.reason}"
            if pending:
                time.sleep(poll)
        for c, h in pending.items():
            self.say("healthy", f"{c}: not serving at {h.server} within {timeout:g} s ({why.get(c, 'not probed')})",
                     ok=False, cluster=c)
        return not pending

    # --- members -------------------------------------------------------------------------------------------
    def _each(self, hosts: Iterable[str], cmd: Callable[[str | None], str], what: str,
              timeout: float = 300.0) -> dict[str, str | None]:
        """Run cmd(user) on every host in parallel: {host: None when it worked, else why not}."""
        from concurrent.futures import ThreadPoolExecutor

        from provisioner.probes.ssh import run_one, target_for

        def one(h: str) -> tuple[str, str | None]:
            t = target_for(self.fleet.hosts[h])
            r = run_one(t, cmd(t.user), timeout=timeout)
            if not r.ok:
                return h, f"unreachable: {r.error}"
            if r.rc != 0:
                return h, f"{what} exited {r.rc}: {(r.stderr.strip() or r.stdout.strip() or 'no output')[-200:]}"
            return h, None

        hosts = list(hosts)
        with ThreadPoolExecutor(max_workers=min(16, len(hosts) or 1)) as pool:
            return dict(pool.map(one, hosts))

    def stop(self, cluster: str, members: Iterable[str]) -> bool:
        members = list(members)
        t0 = time.monotonic()
        res = self._each(members, stop_command, "systemctl stop")
        bad = {h: e for h, e in res.items() if e}
        self.say("stop", f"{cluster}: vLLM stopped on {', '.join(members)} ({time.monotonic() - t0:.1f} s)" if not bad
                 else f"{cluster}: vLLM not stopped: " + "; ".join(f"{h}: {e}" for h, e in bad.items()),
                 ok=not bad, cluster=cluster)
        return not bad

    def mark(self, hosts: Iterable[str], on: bool, why: str) -> bool:
        from provisioner.probes.health import IN_SERVICE, mark_command

        note = {"since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "by": f"provision {self.command}",
                "passed": ["health"], "why": why}
        hosts = list(hosts)
        res = self._each(hosts, lambda user: mark_command(on, note, sudo=(user or "root") != "root"), "mark",
                         timeout=60.0)
        bad = {h: e for h, e in res.items() if e}
        verb = "written" if on else "removed"
        self.say("mark", f"{IN_SERVICE} {verb} on {', '.join(hosts)}" if not bad else
                 f"{IN_SERVICE} not {verb}: " + "; ".join(f"{h}: {e}" for h, e in bad.items()), ok=not bad)
        return not bad

    def gate(self, hosts: Iterable[str], timeout: float = 900.0) -> bool:
        from provisioner.ledger.record import record_health
        from provisioner.paths import ledger_path
        from provisioner.probes.health import run_health

        hosts = list(hosts)
        t0, started = time.monotonic(), time.time()
        res = run_health(self.fleet, hosts, timeout=timeout)
        record_health(res, self.inventory, started, time.monotonic() - t0, path=ledger_path(), site=self.ledger.site)
        bad = [h for h in hosts if not res[h].ok]
        for h in hosts:
            self.say("gate", f"{h}: health gate: {'pass' if res[h].ok else 'fail (' + res[h].message[:200] + ')'}",
                     ok=res[h].ok, host=h)
        return self.burnin([h for h in hosts if res[h].ok]) and not bad

    def burnin(self, hosts: Iterable[str]) -> bool:
        """The burn-in on the way back (each host's burnin_return_tier; off: nothing runs), one line per host."""
        from provisioner.day2.burnin_return import return_burnin
        from provisioner.paths import ledger_path

        ok = True
        for h, (passed, line) in return_burnin(self.fleet, self.inventory, list(hosts), path=ledger_path()).items():
            self.say("gate", f"{h}: {line}", ok=passed, host=h)
            ok &= passed
        return ok

    def unburnt(self, hosts: Iterable[str]) -> list[str]:
        """The hosts the burn-in gate holds: gate on and no passed burn-in since they left service."""
        from provisioner.ledger.view import burnin_gate, burnin_passed, burnin_since

        return [h for h in hosts if burnin_gate(self.fleet, h)
                and not burnin_passed(self.ledger, h, burnin_since(self.ledger, h))]

    def holders(self, hosts: Iterable[str]) -> bool:
        """No process holds /dev/nvidia* on any of `hosts` (else each one is named: pid and command)."""
        from provisioner.probes.remedy import HELD, HOLDERS, holder_names

        hosts = list(hosts)
        res = self._each(hosts, lambda user: as_root(f'h=$({HOLDERS}); [ -z "$h" ] || {{ echo "$h"; exit {HELD}; }}',
                                                   user), "holders", timeout=60.0)
        for h, e in res.items():
            if e and f"exited {HELD}:" in e:
                procs = holder_names(e.split(":", 1)[1])
                self.say("holders", f"{h}: /dev/nvidia* held by " + ", ".join(procs) +
                         ": not unloading the driver under it", ok=False, host=h, processes=procs)
            elif e:
                self.say("holders", f"{h}: /dev/nvidia* holders not readable: {e}", ok=False, host=h)
        if not any(res.values()):
            self.say("holders", f"no process holds /dev/nvidia* on {', '.join(hosts)}")
        return not any(res.values())

    def launch(self, members: Mapping[str, Iterable[str]]) -> bool:
        """Launch the clusters of `members` ({cluster: its hosts}) in ONE run of the playbook: the role starts every
        cluster that is not serving at once and waits for them together (one cluster after the other was the sum of
        their start-up times). One line per cluster; a cluster failed when the run failed on one of its members."""
        from provisioner.runner import make_progress, run_playbook

        members = {c: list(m) for c, m in members.items()}
        hosts = list(dict.fromkeys(h for m in members.values() for h in m))
        if not hosts:
            return True
        t0 = time.monotonic()
        r = run_playbook(self.inventory, command=f"{self.command}-launch", limit=",".join(hosts), tags="vllm",
                         extravars=self.extravars or None, progress=make_progress("none"), fleet=self.fleet)
        bad = r.failed_hosts + r.unreachable_hosts
        ok = not r.error and not bad and r.rc in (0, None)
        for cluster, m in members.items():
            why = r.error or ", ".join([h for h in bad if h in m] or bad) or f"rc {r.rc}"
            self.say("launch", f"{cluster}: vLLM launched on {', '.join(m)} ({time.monotonic() - t0:.1f} s)" if ok
                     else f"{cluster}: vLLM launch FAILED ({why}; run dir {r.run_dir})", ok=ok, cluster=cluster)
        return ok


def drain_moves(ops: Ops, p: Plan) -> tuple[list[tuple[str, str]], list[str]]:
    """(host, draining) for every in-service member; the members that are not in service (left in their state)."""
    moves, others = [], []
    for h in p.hosts:
        s = ops.state(h)
        if s == "in-service":
            moves.append((h, "draining"))
        elif s not in ("draining", "maintenance"):
            others.append(f"{h} ({s})")
    return moves, others


def dumps(ops: Ops, **extra: Any) -> str:
    return json.dumps({"ok": not ops.failed, **extra, "actions": ops.lines}, indent=2) + "\n"


def actor_user() -> str:
    import getpass

    try:
        return f"user:{getpass.getuser()}"
    except (KeyError, OSError):
        return "user:?"


# --- drain and return ------------------------------------------------------------------------------------
def drain_clusters(ops: Any, p: Any, *, reason: str, force: bool, wait: float) -> bool:
    """The drain of plan `p` with `ops` (also the rolling upgrade's first step). False: a step failed."""

    t0 = time.monotonic()
    moves, others = drain_moves(ops, p)
    def notes() -> None:
        for n in p.notes:
            ops.say("note", f"note: {n}")
        for o in others:
            ops.say("note", f"note: {o} is not in service: its lifecycle state stays")

    ops.move(moves, reason, force=force, before=notes)  # checked and recorded at once; Refused: nothing changed
    if p.heads and not ops.balancer(add=[h.server for h in p.heads]):
        return False
    t_lb = time.monotonic()
    if p.heads:
        ops.wait_inflight(p.heads, wait)
    t_wait = time.monotonic()
    for c in p.clusters:
        if not ops.stop(c, p.members[c]):
            return False
    if not ops.mark(p.hosts, False, f"drained: {reason}"):
        return False
    finish = [(h, "maintenance") for h in p.hosts if ops.state(h) == "draining"]
    ops.move(finish, reason)
    ops.say("drained", f"drained {', '.join(p.clusters) or ', '.join(p.hosts)} in {time.monotonic() - t0:.1f} s "
            f"(balancer {t_lb - t0:.1f} s, in flight {t_wait - t_lb:.1f} s, stop {time.monotonic() - t_wait:.1f} s)",
            seconds=round(time.monotonic() - t0, 1))
    return True


def return_clusters(ops: Any, p: Any, *, reason: str, wait_healthy: float, gate_timeout: float = 900.0,
                    passed: Collection[str] = ()) -> bool:
    """The return of plan `p`: burn-in, health gate, in-service + mark, launch, /health, balancer. Hosts in `passed`
    passed a health gate since they left service (remediation's): they are not gated again."""
    from provisioner.day2.lifecycle import Refused, path_to

    t0 = time.monotonic()
    moves = []
    for h in p.hosts:
        s = ops.state(h)
        if s == "in-service":
            continue
        if s not in ("draining", "maintenance", "quarantined", "burn-in"):
            raise Refused(f"{h} is {s}: return brings back drained, maintenance, quarantined or burn-in nodes "
                          f"(onboard a new one with provision onboard)")
        moves += [(h, t) for t in path_to(s, "burn-in")]
    ops.move(moves, reason)
    back = [h for h in p.hosts if ops.state(h) != "in-service"]
    gated = [h for h in back if h not in passed]
    if gated and not ops.gate(gated, timeout=gate_timeout):
        ops.say("stopped", f"return stopped: the health gate or the burn-in failed; {', '.join(gated)} stay in "
                "burn-in, out of the balancer", ok=False)
        return False
    unburnt = ops.unburnt([h for h in back if h not in gated])  # gated elsewhere (remediation's) but no tier since
    if unburnt and not ops.burnin(unburnt):
        ops.say("stopped", f"return stopped: the burn-in failed; {', '.join(unburnt)} stay in burn-in, out of the "
                "balancer", ok=False)
        return False
    ops.move([(h, "in-service") for h in back], reason, health_passed=True)
    if not ops.mark(p.hosts, True, f"returned: {reason}"):
        return False
    if p.clusters and not ops.launch({c: p.members[c] for c in p.clusters}):
        return False
    if p.heads and not ops.wait_healthy(p.heads, wait_healthy):
        return False
    if p.heads and not ops.balancer(remove=[h.server for h in p.heads]):
        return False
    ops.say("returned", f"returned {', '.join(p.clusters) or ', '.join(p.hosts)} in {time.monotonic() - t0:.1f} s",
            seconds=round(time.monotonic() - t0, 1))
    return True


# --- remediation actions -------------------------------------------------------------------------------
ACTOR = "policy:remediate"
QUIET_TAIL = "not watched by the policy"  # holds not worth a line


def _slow(fleet: Any, ledger: Any, host: str) -> str | None:
    """Why `host` is a slow node among its GPU model's nodes (burn-in figures), None when it is not."""
    from provisioner.ledger.view import burnin_slow

    msgs = [x.message for x in burnin_slow(fleet, ledger) if x.host == host]
    return "slow node: " + "; ".join(msgs) if msgs else None


def facts(fleet: Any, ledger: Any, host: str, app_fault: str | None) -> Any:
    from provisioner.day2.policy import Facts, Health, Step
    from provisioner.ledger.view import cluster_name

    state, since = ledger.state(host)
    last = ledger.last_run_for(host, "health")
    health = None
    if last is not None:
        checks = {r["check"]: (r["result"], r["detail"]) for r in ledger.health(host, last[0].id)}
        health = Health(run=last[0].id, started=last[0].started, outcome=last[1], checks=checks)
    runs = [r for r in ledger.runs(host=host, limit=50) if r.command == "health" and r.started >= (since or 0.0)]
    health_runs = tuple((r.id, r.started, str(ledger.host_outcomes(r.id).get(host, {}).get("status") or r.status))
                        for r in reversed(runs))
    from provisioner.day2.burnin_return import return_tier
    from provisioner.ledger.view import burnin_gate, burnin_label

    b = ledger.burnin_last(host)
    burnin = None
    if b is not None and float(b["ended"] or 0) >= (since or 0.0):
        failed = [] if b["status"] == "ok" else \
            [burnin_label(r) for r in ledger.burnin(host, b["run"]) if r["result"] == "fail"]
        burnin = (b["status"] == "ok", float(b["ended"] or 0), ", ".join(failed[:4]))
    return Facts(host=host, state=state, since=since, now=time.time(), health=health, health_runs=health_runs,
                 burnin_gate=burnin_gate(fleet, host), burnin_return=return_tier(fleet, host) is not None,
                 burnin=burnin,
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
        """The drain/return steps (provisioner/day2/executor.py), quiet: their lines are relayed into ours."""
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
        from provisioner.day2.lifecycle import transition
        from provisioner.ledger.view import lifecycle_context

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
            from provisioner.day2.burnin_return import return_burnin

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
        from provisioner.day2.drain import plan

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
        from provisioner.day2.drain import plan
        from provisioner.day2.lifecycle import Refused
        from provisioner.ledger.view import health_passed

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
        elif a.kind == "burnin":  # the health gate passed already: the return tier alone
            from provisioner.day2.burnin_return import return_burnin
            from provisioner.paths import ledger_path

            self.say(a.host, a.kind, a.line())
            for _, (ok, line) in return_burnin(self.fleet, self.inventory, [a.host], path=ledger_path()).items():
                self.say(a.host, "gate", f"{a.host}: {line}", ok=ok)
        elif a.kind == "return" and self.cluster_out(a.host):
            self.say(a.host, a.kind, a.line())
            self.return_cluster(a)
        elif a.kind == "return":
            from provisioner.day2.lifecycle import Refused

            self.say(a.host, a.kind, a.line())
            try:  # both moves checked before either is written (the burn-in gate refuses: it stays where it is)
                self.ops().check([(a.host, "burn-in"), (a.host, "in-service")], a.reason, force=True,
                                 health_passed=True)
            except Refused as exc:
                self.say(a.host, "refused", f"{a.host}: return refused: {exc}", ok=False)
                return
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


# --- onboarding ---------------------------------------------------------------------------------------
def record_onboarding(fleet: Fleet, out: Mapping[str, Any], warn: Any) -> None:
    """Move each onboarded node through the lifecycle to where `lifecycle_target` says, one ledger transition per
    step (reason: the gates passed, or the stage it was left out at). A ledger that cannot be written is a warning."""
    from dataclasses import replace

    from provisioner.day2.lifecycle import Refused, lifecycle_target, path_to, transition
    from provisioner.ledger import LedgerError
    from provisioner.ledger.view import lifecycle_context, open_ledger

    try:
        with open_ledger(fleet) as ledger:  # the inventory's site: another rack's node01 is not this one
            for h, o in out.items():
                state = ledger.state(h)[0]
                target = lifecycle_target(state, o.in_service)
                why = (f"onboard: {', '.join(o.passed)} passed" if o.in_service
                       else f"onboard: left out at {o.stage}: {'; '.join(o.problems)[:300] or 'failed'}")
                try:
                    for to in path_to(state, target) if target != state else ():
                        # this onboarding's own gates: its health pass, and the tier it passed (recorded before
                        # these transitions, so the ledger's "newer than the state" cannot tell it)
                        ctx = replace(lifecycle_context(fleet, ledger, h), health_passed=o.in_service,
                                      burnin_passed=o.in_service and o.burnin is not None)
                        res = transition(state, to, reason=why, host=h, force=True, context=ctx)
                        ledger.record_transition(h, state, to, reason=res.reason, actor="onboard", forced=res.forced)
                        state = to
                except Refused as exc:
                    warn(f"{h}: lifecycle not moved: {exc}")
                o.lifecycle = state
    except LedgerError as exc:
        warn(f"the ledger was not written: {exc}")


# --- the rolling upgrade ------------------------------------------------------------------------------
def with_extra(xv: Any, **more: Any) -> Any:
    """-e values plus `more` (a vaulted -e @FILE stays a file for ansible-playbook: runner.ExtraVars)."""
    from provisioner.runner.config import copy_extra

    out = copy_extra(xv)
    out.update(more)
    return out


def last_failure(ops: Any, default: str) -> str:
    bad = [ln["line"] for ln in ops.lines if not ln["ok"]]
    return bad[-1] if bad else default


def upgrade_batch(ops: Any, ledger: Any, rid: int, fleet: Any, batch: list[str], statuses: dict[str, tuple[str, str]],
                   *, reason: str, force: bool, wait: float, wait_healthy: float, xv: dict[str, Any]) -> bool:
    """One batch: drain, holders, the roles, return. False (after recording the cluster failed) when a step fails."""
    from provisioner.day2.drain import plan
    from provisioner.day2.lifecycle import Refused
    from provisioner.runner import make_progress, run_playbook

    t0 = time.monotonic()
    full = [c for c in batch if statuses[c][0] != "returning" and statuses[c][1] != "returning"]
    step = "draining"

    def failed(what: str, clusters: list[str]) -> bool:
        ledger.rollout_step(rid, clusters, "failed", step=step, detail=what)
        return False

    try:
        if full:
            p = plan(fleet, full)
            members = list(p.hosts)
            ledger.rollout_step(rid, full, "draining")
            if not drain_clusters(ops, p, reason=reason, force=force, wait=wait):
                return failed(last_failure(ops, "the drain failed"), full)
            step = "holders"
            if not ops.holders(members):
                return failed(last_failure(ops, "a process holds /dev/nvidia*"), full)
            step = "upgrading"
            ledger.rollout_step(rid, full, "upgrading")
            t1 = time.monotonic()
            r = run_playbook(ops.inventory, command="upgrade", limit=",".join(members), skip_tags="vllm",
                             extravars=with_extra(xv, provision_allow_reboot=True), progress=make_progress("none"),
                             fleet=fleet)
            bad = r.failed_hosts + r.unreachable_hosts
            ok = not r.error and not bad and r.rc in (0, None)
            changed = sorted(n for n, h in r.hosts.items() if h.state == "changed")
            rebooted = sorted(n for n, h in r.hosts.items() if h.rebooted)
            ops.say("upgrade", f"{', '.join(full)}: roles applied on {', '.join(members)} in "
                    f"{time.monotonic() - t1:.1f} s (changed: {', '.join(changed) or 'none'}; rebooted: "
                    f"{', '.join(rebooted) or 'none'})" if ok else
                    f"{', '.join(full)}: the roles FAILED on {', '.join(bad) or 'the play'} "
                    f"({r.error or 'see the run'}; run dir {r.run_dir})", ok=ok,
                    seconds=round(time.monotonic() - t1, 1))
            if not ok:
                return failed(last_failure(ops, "the roles failed"), full)
            from provisioner.drift.tiers import record_run

            warning = record_run(fleet, r, skip_tags="vllm", extra={"provision_allow_reboot": True, **xv})
            if warning:
                ops.say("note", warning)
        step = "returning"
        ledger.rollout_step(rid, batch, "returning")
        if not return_clusters(ops, plan(fleet, batch), reason=reason, wait_healthy=wait_healthy):
            return failed(last_failure(ops, "the return failed"), batch)
    except Refused as exc:
        ops.say("refused", f"refused: {exc}", ok=False)
        return failed(f"refused: {exc}", batch)
    ledger.rollout_step(rid, batch, "done", seconds=round(time.monotonic() - t0, 1))
    return True


def abort_rollout(ops: Any, ledger: Any, fleet: Any, ro: Any, wait_healthy: float) -> bool:
    from provisioner.day2.drain import plan
    from provisioner.day2.lifecycle import Refused

    out = [c.cluster for c in ro.clusters if c.status not in ("pending", "done") and c.cluster in fleet.clusters]
    ok = True
    if out:
        ops.say("abort", f"abort: returning {', '.join(out)}")
        try:
            ok = return_clusters(ops, plan(fleet, out), reason=f"rollout {ro.id} aborted", wait_healthy=wait_healthy)
        except Refused as exc:
            ops.say("refused", f"refused: {exc}", ok=False)
            ok = False
    done = [c.cluster for c in ro.clusters if c.status == "done"]
    ledger.rollout_ended(ro.id, "aborted", "aborted" + ("" if ok else f": {last_failure(ops, 'a return failed')}"))
    ops.say("aborted", f"rollout {ro.id} aborted: {len(done)} cluster(s) had been upgraded "
            f"({', '.join(done) or 'none'})" + (f", {', '.join(out)} returned" if out and ok else "") +
            ("" if ok else "; what could not return stays drained (provision status)"), ok=ok)
    return ok


def roll(ops: Any, ledger: Any, rid: int, fleet: Any, models: dict[str, str], *, max_unavailable: int, force: bool,
          reason: str, wait: float, wait_healthy: float, xv: dict[str, Any]) -> bool:
    """Batch after batch until every cluster is done (True) or a step fails or nothing may go out (False)."""
    from provisioner.day2.rollout import next_batch, progress
    from provisioner.ledger.view import serving_clusters as serving

    t0 = time.monotonic()
    while True:
        ro = ledger.rollout(rid)
        statuses = {c.cluster: (c.status, c.step or "") for c in ro.clusters}
        pending = sorted((c for c in ro.clusters if c.status != "done"), key=lambda c: (c.status == "pending",
                                                                                        c.position))
        if not pending:
            ledger.rollout_ended(rid, "done")
            ops.say("done", f"rollout {rid} done: {len(statuses)} cluster(s) upgraded in "
                    f"{time.monotonic() - t0:.1f} s", seconds=round(time.monotonic() - t0, 1))
            return True
        batch, why = next_batch([c.cluster for c in pending], models, serving(fleet, ledger), max_unavailable,
                                force=force)
        if not batch:
            ledger.rollout_ended(rid, "stopped", why)
            ops.say("stopped", f"rollout {rid} stopped: {why}", ok=False)
            return False
        ops.say("batch", f"upgrading {', '.join(batch)}", clusters=batch)
        if not upgrade_batch(ops, ledger, rid, fleet, batch, statuses, reason=reason, force=force, wait=wait,
                              wait_healthy=wait_healthy, xv=xv):
            detail = last_failure(ops, "a step failed")
            ledger.rollout_ended(rid, "stopped", detail)
            ops.say("stopped", f"rollout {rid} stopped at {', '.join(batch)}: {detail}; the cluster stays out of "
                    "service: fix it and rerun the same command to resume, or --abort", ok=False)
            return False
        now = {c.cluster: c.status for c in ledger.rollout(rid).clusters}
        ops.say("progress", f"rollout {rid}: {progress(now, models, serving(fleet, ledger))}")


def upgrade(ops: Any, ledger: Any, fleet: Any, models: dict[str, str], *, key: str, digest: str,
            xv: dict[str, Any], max_unavailable: int, abort: bool, force: bool, reason: str, wait: float,
            wait_healthy: float) -> tuple[bool, int | None, str | None]:
    """`provision upgrade`: claim the site's rollout (start one, or resume/abort the open one) in one write
    transaction, so that of two starts at once one is refused, then roll or abort. (ok, rollout id, refusal line)."""
    from provisioner.day2.rollout import balancer_note, members_that_balance, refusal, resumed_line, started_line

    rid: int | None = None
    order: list[str] = []
    with ledger.atomic():  # check and claim in one write transaction: of two starts at once, one is refused
        ro = ledger.open_rollout()  # the site's: a copy of the inventory (same provision_site) sees it too
        refused = refusal(ro, ops.inventory, digest=digest, abort=abort, force=force, models=models)
        if refused is None and not abort:
            if ro is None:
                order = list(fleet.clusters)
                rid = ledger.rollout_started(key, {"extra_keys": sorted(xv), "order": order,
                                                   "max_unavailable": max_unavailable}, digest, order)
            else:
                rid = ro.id
                ledger.rollout_claimed(rid)
    if refused is not None:
        return False, None, refused
    if abort:
        if ro is None:
            ops.say("abort", f"no rollout of {ops.inventory} to abort")
            return True, None, None
        return abort_rollout(ops, ledger, fleet, ro, wait_healthy), ro.id, None
    assert rid is not None
    if ro is None:
        ops.say("rollout", started_line(rid, order, max_unavailable), rollout=rid)
        members_of = {name: cl.members for name, cl in fleet.clusters.items()}
        for host, cluster in members_that_balance(members_of, ops.lbs()):
            ops.say("rollout", balancer_note(host, cluster), rollout=rid)
    else:
        ops.say("rollout", resumed_line(ro), rollout=rid)
    return roll(ops, ledger, rid, fleet, models, max_unavailable=max_unavailable, force=force,
                reason=f"upgrade: {reason}", wait=wait, wait_healthy=wait_healthy, xv=xv), rid, None
