"""`provision onboard INVENTORY HOST...`: preflight -> provisioning run (serial) -> health gate -> in service or not."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

import provisioner.probes  # noqa: F401  (keeps the SSH key variables in the fleet model)
from provisioner.errors import Exit, UsageError

err = Console(stderr=True, highlight=False)

HELP = """Bring new GPU nodes into service, one gate after the other:

1. preflight: the node's real hardware matches the inventory (a host that does not is not provisioned);
2. provisioning run of the playbooks (default playbooks/site.yml) on the remaining hosts, one host at a time
   (--serial 1 through provisioner.runner / ansible-runner);
3. health gate (roles/node_health/files/node_health.py);
4. a host that passed everything is marked in service: /etc/provisioner/in-service on the host (JSON: when, what
   passed) and an IN SERVICE line in the report. A host that failed anywhere has that file removed, is left out of
   its vLLM cluster's launch (the vLLM launch starts only on hosts with the mark) and is reported with the failing
   checks.

Exit codes: 0 every host in service, 1 any host left out, 2 usage."""

IN_SERVICE = "/etc/provisioner/in-service"


@dataclass
class Outcome:
    host: str
    in_service: bool = False
    stage: str | None = None  # where it failed: preflight, run, health, mark
    problems: list[str] = field(default_factory=list)
    clusters: list[str] = field(default_factory=list)
    marked: bool | None = None  # the in-service file was written/removed on the host
    passed: list[str] = field(default_factory=list)  # the gates a host in service went through

    def line(self) -> str:
        if self.in_service:
            return f"{self.host}: IN SERVICE ({', '.join(self.passed)} passed; {IN_SERVICE} written)"
        why = "; ".join(self.problems) or "failed"
        cl = f"; left out of the launch of {', '.join(self.clusters)}" if self.clusters else ""
        return f"{self.host}: LEFT OUT at {self.stage}: {why}{cl}"


def _runner_available() -> bool:
    try:
        from provisioner import runner  # noqa: F401
    except ImportError:
        return False
    return True


def _mark(fleet: Any, results: dict[str, Outcome], timeout: float, passed: list[str]) -> None:
    from provisioner.probes.health import mark_command
    from provisioner.probes.ssh import run_many, target_for

    targets = [target_for(fleet.hosts[h]) for h in results if results[h].stage != "unreachable"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def cmd(t: Any) -> str:
        o = results[t.name]
        note = {"since": now, "by": "provision onboard", "passed": passed}
        return mark_command(o.in_service, note, sudo=(t.user or "root") != "root")

    for name, r in run_many(targets, cmd, timeout=timeout).items():
        o = results[name]
        o.marked = r.ok and r.rc == 0
        if o.in_service and not o.marked:
            o.in_service = False
            o.stage = "mark"
            o.problems.append(f"could not write {IN_SERVICE}: {r.error or r.stderr.strip()[:200]}")


def register(app: typer.Typer) -> None:
    @app.command("onboard", help=HELP)
    def onboard_cmd(
        inventory: Path = typer.Argument(..., help="Inventory file or directory."),
        hosts: list[str] = typer.Argument(..., help="Hosts to onboard (inventory names)."),
        playbook: Optional[Path] = typer.Option(None, "--playbook", help="Provisioning playbook (default site.yml)."),
        skip_run: bool = typer.Option(False, "--skip-run", help="Only preflight + health + mark (already provisioned)."),
        fmt: str = typer.Option("text", "--format", "-f", help="text or json."),
        report: Optional[Path] = typer.Option(None, "--report", help="Also write the JSON report here."),
        timeout: float = typer.Option(900.0, "--timeout", help="Seconds per host for preflight/health."),
    ) -> None:
        from provisioner.inventory import load_fleet
        from provisioner.probes.health import run_health
        from provisioner.probes.preflight import probe

        if fmt not in ("text", "json"):
            raise UsageError(f"--format must be text or json, got {fmt!r}")
        if playbook is not None and not playbook.is_file():
            raise UsageError("playbook not found", path=str(playbook))
        fleet = load_fleet(inventory)
        unknown = [h for h in hosts if h not in fleet.hosts]
        if unknown:
            raise UsageError(f"not in the inventory: {', '.join(unknown)}", path=str(inventory))
        not_gpu = [h for h in hosts if not (fleet.hosts[h].is_gpu_node or fleet.hosts[h].gpu_count is not None)]
        if not_gpu:
            raise UsageError(f"not GPU nodes: {', '.join(not_gpu)}", path=str(inventory))
        hosts = list(dict.fromkeys(hosts))
        out = {h: Outcome(h, clusters=fleet.cluster_of(h)) for h in hosts}
        t0 = time.monotonic()
        say = (lambda m: None) if fmt == "json" else (lambda m: err.print(m))

        # 1. preflight
        say(f"onboard: preflight on {', '.join(hosts)}")
        for name, r in probe(fleet, hosts, timeout=min(timeout, 60.0)).items():
            if not r.ok:
                out[name].stage = "preflight" if r.reachable else "unreachable"
                out[name].problems = [m.line() for m in r.mismatches if m.severity == "error"] or [r.message]
        alive = [h for h in hosts if out[h].stage is None]

        # 2. provisioning run, serial
        run_dir = None
        if alive and not skip_run:
            if not _runner_available():
                raise UsageError("provisioner.runner is not available: use --skip-run on provisioned hosts")
            from provisioner.runner import make_progress, run_playbook

            say(f"onboard: provisioning {', '.join(alive)} (serial 1)")
            result = run_playbook(inventory, command="onboard", playbook=playbook, limit=",".join(alive), serial="1",
                                  extravars={"node_health_mark_in_service": True},
                                  progress=make_progress("none" if fmt == "json" else "auto"))
            run_dir = result.run_dir
            for h in alive:
                hr = result.hosts.get(h)
                state = hr.state if hr is not None else "not_run"
                if result.error or state in ("failed", "unreachable", "not_run"):
                    out[h].stage = "run"
                    fails = [f"{f.task}: {f.message[:200]}" for f in result.failures if f.host == h]
                    out[h].problems = fails or [result.error or f"host {state} in the provisioning run"]
            alive = [h for h in alive if out[h].stage is None]

        # 3. health gate
        if alive:
            say(f"onboard: health gate on {', '.join(alive)}")
            for name, hh in run_health(fleet, alive, timeout=timeout).items():
                if not hh.ok:
                    out[name].stage = "health"
                    out[name].problems = [f"{c['check']}: {c.get('message', '')}" for c in hh.failed] or [hh.message]
        for h in hosts:
            out[h].in_service = out[h].stage is None

        # 4. mark in service / out of service on the hosts
        stages = ["preflight"] + ([] if skip_run else ["run"]) + ["health"]
        _mark(fleet, out, timeout=min(timeout, 60.0), passed=stages)
        for o in out.values():
            o.passed = stages

        doc = {"ok": all(o.in_service for o in out.values()), "seconds": round(time.monotonic() - t0, 2),
               "run_dir": run_dir, "hosts": {h: asdict(o) for h, o in out.items()},
               "clusters_affected": sorted({c for o in out.values() if not o.in_service for c in o.clusters})}
        if fmt == "json":
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:
            for o in out.values():
                sys.stdout.write(o.line() + "\n")
            n = sum(o.in_service for o in out.values())
            sys.stdout.write(f"onboard: {n}/{len(out)} hosts in service ({doc['seconds']:.1f}s)\n")
        for path in [report] + ([Path(run_dir) / "onboard.json"] if run_dir else []):
            if path is not None:
                try:
                    path.write_text(json.dumps(doc, indent=2) + "\n")
                except OSError as exc:
                    err.print(f"[yellow]warning:[/] cannot write {path}: {exc.strerror or exc}")
        raise SystemExit(int(Exit.OK if doc["ok"] else Exit.FAIL))
