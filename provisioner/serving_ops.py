"""The steps drain, return and the rolling upgrade are made of, on real hosts: the balancer's drained list (through
playbooks/balancer.yml), vLLM's in-flight count and /health (read on the head over SSH), stopping a cluster, the
in-service mark, the health gate, the relaunch, and the lifecycle transitions they record."""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from provisioner import PROJECT_ROOT
from provisioner.drain import Head, Plan, inflight
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
        from provisioner.ledger.view import lifecycle_context
        from provisioner.lifecycle import transition

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
        config put back if it fails), a graceful `systemctl reload nginx`. False (the caller runs the playbook) when
        a balancer has the active health check, templated paths, or a server line this cannot find."""
        import base64

        from provisioner.drain import direct_paths, drained_list, rewrite_conf
        from provisioner.probes.ssh import run_one, target_for

        for h in lbs:
            paths = direct_paths(self.fleet, h)
            if paths is None:
                return False
            drained, conf = paths
            t = target_for(self.fleet.hosts[h])
            d, c = shlex.quote(drained), shlex.quote(conf)
            r = run_one(t, as_root(f"cat {d} 2>/dev/null; echo '{SPLIT}'; cat {c}", t.user), timeout=30.0)
            if not (r.ok and r.rc == 0 and SPLIT in r.stdout):
                return False
            now, _, text = r.stdout.partition(SPLIT + "\n")
            new = rewrite_conf(text, add=add, remove=remove)
            if new is None:
                return False
            lst = "".join(x + "\n" for x in drained_list(now.split(), add=add, remove=remove))
            b64 = {k: base64.b64encode(x.encode()).decode() for k, x in (("conf", new), ("list", lst))}
            script = (f"set -e; install -d -m 0755 -o root -g root {shlex.quote(str(Path(drained).parent))}; "
                      f"echo {b64['list']} | base64 -d > {d}.tmp; chmod 0644 {d}.tmp; cp -p {c} {c}.bak; "
                      f"echo {b64['conf']} | base64 -d > {c}.tmp; chmod 0644 {c}.tmp; mv {c}.tmp {c}; "
                      f"if nginx -t >/dev/null 2>&1; then mv {d}.tmp {d}; rm -f {c}.bak; systemctl reload nginx; "
                      f"else mv {c}.bak {c}; rm -f {d}.tmp; exit 7; fi")
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
        return not bad

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

    def launch(self, cluster: str, members: Iterable[str]) -> bool:
        from provisioner.runner import make_progress, run_playbook

        members = list(members)
        t0 = time.monotonic()
        r = run_playbook(self.inventory, command=f"{self.command}-launch", limit=",".join(members), tags="vllm",
                         extravars=self.extravars or None, progress=make_progress("none"), fleet=self.fleet)
        bad = r.failed_hosts + r.unreachable_hosts
        ok = not r.error and not bad and r.rc in (0, None)
        self.say("launch", f"{cluster}: vLLM launched on {', '.join(members)} ({time.monotonic() - t0:.1f} s)" if ok
                 else f"{cluster}: vLLM launch FAILED ({r.error or ', '.join(bad)}; run dir {r.run_dir})", ok=ok,
                 cluster=cluster)
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
