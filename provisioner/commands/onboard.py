"""`provision onboard INVENTORY HOST...`: preflight -> provisioning run (serial) -> health gate -> in service or not."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

import provisioner.probes  # noqa: F401  (keeps the SSH key variables in the fleet model)
from provisioner.commands.common import VAULT_HELP, Format, unwrap, use_vault
from provisioner.errors import Exit, UsageError
from provisioner.reports import count

err = Console(stderr=True, highlight=False, soft_wrap=True)  # one line per message at any width (grep, logs)

HELP = unwrap("""Bring new GPU nodes into service, one gate after the other.

0. out of band: a host whose BMC (bmc_address) reports it powered off is powered on and SSH waited for
   (docs/bmc.md); a host with a `firmware` map has its BMC's firmware inventory, and where the map names gpu or hca
   the node's own VBIOS / HCA fw_ver, checked against it (FW010-FW012: a host whose firmware is not accepted is left
   out at `firmware`; what a bare node cannot report before its driver is installed is checked after the run);
1. preflight: the node's real hardware matches the inventory (a host that does not is not provisioned);
2. provisioning run of the playbooks (default playbooks/site.yml) on the remaining hosts WITHOUT the vLLM launch
   (--skip-tags vllm), one host at a time by default (--serial, through provisioner.runner / ansible-runner);
3. health gate (roles/node_health/files/node_health.py), then the burn-in tier the host's `burnin_onboard_tier` names
   (default standard; quick, soak, or off: docs/burn-in.md), recorded as `provision burn-in` records it;
4. a host that passed everything is marked in service: /etc/provisioner/in-service on the host (JSON: when, what
   passed) and an IN SERVICE line in the report. A host that failed anywhere has that file removed, is left out of
   its vLLM cluster's launch (the vLLM launch starts only on hosts with the mark) and is reported with the failing
   checks;
5. vLLM launch: the same playbook with --tags vllm on the clusters of the hosts now in service (every member of
   those clusters: a cluster launches whole, and only when all its members carry the mark). Skipped with
   --skip-run or --skip-launch.

Exit codes: 0 every host in service (and its cluster launched), 1 any host left out or a launch failed, 2 usage.""")

def register(app: typer.Typer) -> None:
    @app.command("onboard", help=HELP)
    def onboard_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        hosts: Annotated[list[str], typer.Argument(help="Hosts to onboard (inventory names).", show_default=False)],
        playbook: Annotated[Path | None, typer.Option(
            "--playbook", help="Provisioning playbook (default site.yml).")] = None,
        skip_run: Annotated[bool, typer.Option(
            "--skip-run", help="Only preflight + health + mark (already provisioned).")] = False,
        skip_launch: Annotated[bool, typer.Option(
            "--skip-launch", help="Do not run the vLLM launch (--tags vllm) after the mark.")] = False,
        serial: Annotated[str, typer.Option(
            "--serial", help="Hosts per batch in the provisioning run (N or N%).")] = "1",
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Report on stdout.")] = Format.text,
        report: Annotated[Path | None, typer.Option("--report", help="Also write the JSON report here.")] = None,
        timeout: Annotated[float, typer.Option("--timeout", help="Seconds per host for preflight/health.")] = 900.0,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        from provisioner.day2 import onboard_steps as steps
        from provisioner.day2.onboard import (
            Outcome,
            judge_launch,
            judge_run,
            launch_targets,
            launched_clusters,
            stages,
            unburnt,
        )
        from provisioner.inventory import load_fleet
        from provisioner.probes.health import run_health
        from provisioner.probes.preflight import probe
        from provisioner.runner import make_progress, run_playbook, validate_serial

        validate_serial(serial)
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
        from provisioner import vault

        # the run and the launch need the hosts' (and their clusters') vaulted values: one line now, not mid-way
        vault.require(fleet, sorted({*hosts, *launch_targets(fleet, hosts)}), what="provision onboard")
        out = {h: Outcome(h, clusters=fleet.cluster_of(h)) for h in hosts}
        t0 = time.monotonic()
        say = (lambda m: None) if fmt is Format.json else (lambda m: err.print(m, markup=False))

        # 0. out of band: power on from the BMC, the firmware gate
        oob = steps.out_of_band(fleet, hosts, out, min(timeout, 600.0), say)
        # 1. preflight
        ready = [h for h in hosts if out[h].stage is None]
        say(f"onboard: preflight on {', '.join(ready) or 'no host'}")
        for name, r in (probe(fleet, ready, timeout=min(timeout, 60.0)) if ready else {}).items():
            if not r.ok:
                out[name].stage = "preflight" if r.reachable else "unreachable"
                out[name].problems = [m.line() for m in r.mismatches if m.severity == "error"] or [r.message]
        alive = [h for h in hosts if out[h].stage is None]

        # 2. provisioning run, serial
        run_dir = None
        if alive and not skip_run:
            say(f"onboard: provisioning {', '.join(alive)} (serial {serial}; the vLLM launch comes after the mark)")
            result = run_playbook(inventory, command="onboard", playbook=playbook, limit=",".join(alive),
                                  serial=serial, skip_tags="vllm", extravars={"node_health_mark_in_service": True},
                                  progress=make_progress("none" if fmt is Format.json else "auto"), fleet=fleet)
            run_dir = result.run_dir
            judge_run(out, alive, result)
            alive = [h for h in alive if out[h].stage is None]

        # the node's own firmware, now that the run installed its tools
        node_fw = False
        if alive:
            node_fw = steps.node_firmware(fleet, alive, out, timeout=min(timeout, 60.0))
            alive = [h for h in alive if out[h].stage is None]

        # 3. health gate
        if alive:
            say(f"onboard: health gate on {', '.join(alive)}")
            for name, hh in run_health(fleet, alive, timeout=timeout).items():
                if not hh.ok:
                    out[name].stage = "health"
                    out[name].problems = [f"{c['check']}: {c.get('message', '')}" for c in hh.failed] or [hh.message]
        # 3b. burn-in (docs/burn-in.md): the tier the site names (`burnin_onboard_tier`, default standard; off)
        burned = steps.burnin(fleet, inventory, [h for h in alive if out[h].stage is None], out, say)
        unburnt(fleet, out)  # the burn-in gate: no tier ran (burnin_onboard_tier off) -> not in service
        for h in hosts:
            out[h].in_service = out[h].stage is None

        # 4. mark in service / out of service on the hosts
        passed = stages(oob, run=not skip_run, node_firmware=node_fw, burn_in=burned)
        steps.mark(fleet, out, timeout=min(timeout, 60.0), passed=passed)
        for o in out.values():
            o.passed = passed
        from provisioner.day2.executor import record_onboarding

        record_onboarding(fleet, out, lambda m: err.print(f"[yellow]warning:[/] {escape(m)}", highlight=False))

        # 5. vLLM launch for the clusters of the hosts now in service (after the mark: the launch checks it)
        launch_dir = None
        launch_hosts = launch_targets(fleet, [h for h in hosts if out[h].in_service])
        if launch_hosts and not (skip_run or skip_launch):
            say(f"onboard: vLLM launch on {', '.join(launch_hosts)}")
            lr = run_playbook(inventory, command="onboard-launch", playbook=playbook, limit=",".join(launch_hosts),
                              tags="vllm", progress=make_progress("none" if fmt is Format.json else "auto"),
                              fleet=fleet)
            launch_dir = lr.run_dir
            judge_launch(out, fleet, lr)

        from provisioner.endpoints import endpoint_lines, endpoints_for

        endpoints = endpoints_for(fleet, launched_clusters(out))
        doc = {"ok": all(o.in_service and o.launch != "failed" for o in out.values()),
               "seconds": round(time.monotonic() - t0, 2),
               "run_dir": run_dir, "launch_run_dir": launch_dir, "hosts": {h: asdict(o) for h, o in out.items()},
               "clusters_affected": sorted({c for o in out.values() if not o.in_service for c in o.clusters}),
               "endpoints": [e.to_dict() for e in endpoints]}
        if fmt is Format.json:
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:
            for o in out.values():
                sys.stdout.write(o.line() + "\n")
            n = sum(o.in_service for o in out.values())
            sys.stdout.write(f"onboard: {n}/{count(len(out), 'host')} in service ({doc['seconds']:.1f}s)\n")
            if endpoints:
                sys.stdout.write(f"serving: {count(len(endpoints), 'vLLM cluster')}\n")
                sys.stdout.write("".join(f"  {ln}\n" for ln in endpoint_lines(endpoints)))
        for path in [report] + ([Path(run_dir) / "onboard.json"] if run_dir else []):
            if path is not None:
                try:
                    path.write_text(json.dumps(doc, indent=2) + "\n")
                except OSError as exc:
                    err.print(f"[yellow]warning:[/] {escape(f'cannot write {path}: {exc.strerror or exc}')}")
        raise typer.Exit(int(Exit.OK if doc["ok"] else Exit.FAIL))
