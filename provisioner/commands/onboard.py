"""`provision onboard INVENTORY HOST...`: preflight -> provisioning run (serial) -> health gate -> in service or not."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

import provisioner.probes  # noqa: F401  (keeps the SSH key variables in the fleet model)
from provisioner.commands.common import VAULT_HELP, Format, unwrap, use_vault
from provisioner.errors import Exit, UsageError
from provisioner.model import Fleet
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

IN_SERVICE = "/etc/provisioner/in-service"


@dataclass
class Outcome:
    host: str
    in_service: bool = False
    stage: str | None = None  # where it failed: power, firmware, preflight, run, health, burn-in, mark
    powered_on: bool = False  # its BMC powered it on first
    problems: list[str] = field(default_factory=list)
    clusters: list[str] = field(default_factory=list)
    marked: bool | None = None  # the in-service file was written/removed on the host
    passed: list[str] = field(default_factory=list)  # the gates a host in service went through
    launch: str | None = None  # vLLM launch after the mark: ok, failed, or None (not run: no cluster / skipped)
    launch_problems: list[str] = field(default_factory=list)
    lifecycle: str | None = None  # its state in the ledger after onboarding (None: the ledger could not be written)

    def line(self) -> str:
        if self.in_service:
            text = f"{self.host}: IN SERVICE ({', '.join(self.passed)} passed; {IN_SERVICE} written)"
            if self.launch == "ok":
                text += f"; vLLM launched: {', '.join(self.clusters)}"
            elif self.launch == "failed":
                text += f"; vLLM launch FAILED: {'; '.join(self.launch_problems) or 'failed'}"
            return text
        why = "; ".join(self.problems) or "failed"
        cl = f"; left out of the launch of {', '.join(self.clusters)}" if self.clusters else ""
        return f"{self.host}: LEFT OUT at {self.stage}: {why}{cl}"


def _mark(fleet: Fleet, results: dict[str, Outcome], timeout: float, passed: list[str]) -> None:
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


def onboard_burnin(fleet: Fleet, inventory: Path, hosts: list[str], out: dict[str, Outcome], say: Any) -> bool:
    """Stage 3b: each host's onboarding burn-in tier (`burnin_onboard_tier`: quick, standard (default), soak or off),
    run and recorded as `provision burn-in` does; a failed check fails the host (stage burn-in). True when one ran."""
    from provisioner.ledger.record import record_burnin
    from provisioner.probes.burnin import run_burnin

    tiers: dict[str, list[str]] = {}
    for h in hosts:
        tier = str(fleet.hosts[h].vars.get("burnin_onboard_tier", "standard")).strip().lower()
        if tier != "off":
            tiers.setdefault(tier if tier in ("quick", "standard", "soak") else "standard", []).append(h)
    for tier, names in tiers.items():
        say(f"onboard: burn-in ({tier}) on {', '.join(names)}")
        started = time.time()
        res = run_burnin(fleet, names, tier=tier, timeout={"quick": 600.0, "standard": 3600.0}.get(tier, 43200.0))
        record_burnin(res, tier, inventory, started, time.time() - started, fleet=fleet)
        for name, hb in res.items():
            if not hb.ok:
                out[name].stage = "burn-in"
                out[name].problems = [f"{r['check']}{'' if r.get('gpu') is None else ' gpu' + str(r['gpu'])}"
                                      f"{' [' + r['code'] + ']' if r.get('code') else ''}: {r['message']}"
                                      for r in hb.failed] or [hb.error or "failed"]
    return bool(tiers)


def out_of_band(fleet: Fleet, hosts: list[str], out: dict[str, Outcome], timeout: float,
                say: Any) -> list[str]:
    """Stage 0: power on from the BMC what is off and wait for SSH (hosts with a bmc_address), then the firmware
    gate for hosts with a `firmware` map: the BMC's report, plus the node's own (VBIOS, HCA fw_ver) where the map
    names gpu or hca. Fails hosts in `out` (stage power / firmware); returns the stages that ran."""
    from provisioner.bmc.config import BmcConfigError
    from provisioner.bmc.firmware import NODE_COMPONENTS, HostFirmware, compare, merged, node_part, wanted_map
    from provisioner.bmc.redfish import Bmc, BmcError, opt_out_line
    from provisioner.bmc.session import bmc_target, each, setup_vault, wait_ssh
    from provisioner.probes.firmware import read_nodes

    with_bmc = [h for h in hosts if fleet.hosts[h].vars.get("bmc_address")]
    wanted = {h: wanted_map(fleet.hosts[h].vars.get("firmware")) for h in hosts}
    gated = [h for h in hosts if wanted[h]]
    if not with_bmc and not gated:
        return []
    setup_vault(fleet, with_bmc, None)
    reports: dict[str, HostFirmware] = {}

    def one(host: str) -> None:
        o = out[host]
        try:
            t = bmc_target(fleet, host)
        except BmcConfigError as exc:
            o.stage, o.problems = "power", [f"BMC: {exc}"]
            return
        warn = opt_out_line(t)
        if warn:
            sys.stderr.write(warn + "\n")
        bmc = Bmc(t)
        try:
            state = bmc.power_state()
            if state != "On":
                say(f"onboard: {host} is {state} at its BMC: powering on")
                bmc.power("on", timeout=timeout)
                wait_ssh(fleet, host, time.monotonic() + timeout)
                o.powered_on = True
        except BmcError as exc:
            o.stage, o.problems = "power", [str(exc)]
            return
        if wanted[host]:
            try:
                reports[host] = bmc.firmware()
            except BmcError as exc:
                o.stage, o.problems = "firmware", [str(exc)]

    for h, r in each(with_bmc, one, 16).items():
        if isinstance(r, BaseException):
            out[h].stage, out[h].problems = "power", [f"{type(r).__name__}: {r}"]
    gated = [h for h in gated if out[h].stage is None]
    nodes = read_nodes(fleet, [h for h in gated if node_part(wanted[h])], timeout=min(timeout, 60.0))
    for h in gated:
        rep = reports.get(h, HostFirmware(h))
        if h in nodes:
            rep = merged(rep, *nodes[h])
        # a bare node has no nvidia-smi yet: what it cannot report now is judged after the run (node_firmware_gate)
        findings = [f for f in compare(rep, wanted[h]) if not (f.code == "FW011" and f.component in NODE_COMPONENTS)]
        if findings:
            out[h].stage, out[h].problems = "firmware", [f.line() for f in findings]
    return (["power"] if with_bmc else []) + (["firmware"] if any(wanted.values()) else [])


def node_firmware_gate(fleet: Fleet, hosts: list[str], out: dict[str, Outcome], timeout: float) -> bool:
    """After the run (the driver is installed now): the node's own VBIOS / HCA fw_ver against the gpu / hca entries
    of each host's firmware map; a host that fails is left out at `firmware`. Whether any host was gated."""
    from provisioner.bmc.firmware import HostFirmware, compare, merged, node_part, wanted_map
    from provisioner.probes.firmware import read_nodes

    wanted = {h: node_part(wanted_map(fleet.hosts[h].vars.get("firmware"))) for h in hosts}
    gated = [h for h in hosts if wanted[h]]
    for h, (items, error) in read_nodes(fleet, gated, timeout=timeout).items():
        findings = compare(merged(HostFirmware(h), items, error), wanted[h])
        if findings:
            out[h].stage, out[h].problems = "firmware", [f.line() for f in findings]
    return bool(gated)


def launch_targets(fleet: Fleet, in_service: list[str]) -> list[str]:
    """Hosts of the vLLM launch after onboarding: every member of each cluster that has an onboarded host in
    service (a cluster launches whole; the vllm_launch role refuses it when a member has no mark). Pure."""
    out: list[str] = []
    for h in in_service:
        for c in fleet.cluster_of(h):
            for m in fleet.clusters[c].members:
                if m not in out:
                    out.append(m)
    return out


def launched_clusters(out: dict[str, Outcome]) -> list[str]:
    """Clusters the onboarding launched (an onboarded member reports `launch == "ok"`), in first-seen order. Pure."""
    names: list[str] = []
    for o in out.values():
        if o.launch == "ok":
            names += [c for c in o.clusters if c not in names]
    return names


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
        oob = out_of_band(fleet, hosts, out, min(timeout, 600.0), say)
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
            for h in alive:
                hr = result.hosts.get(h)
                state = hr.state if hr is not None else "not_run"
                if result.error or state in ("failed", "unreachable", "not_run"):
                    out[h].stage = "run"
                    fails = [f"{f.task}: {f.message[:200]}" for f in result.failures if f.host == h]
                    out[h].problems = fails or [result.error or f"host {state} in the provisioning run"]
            alive = [h for h in alive if out[h].stage is None]

        # the node's own firmware, now that the run installed its tools
        node_fw = False
        if alive:
            node_fw = node_firmware_gate(fleet, alive, out, timeout=min(timeout, 60.0))
            alive = [h for h in alive if out[h].stage is None]

        # 3. health gate
        if alive:
            say(f"onboard: health gate on {', '.join(alive)}")
            for name, hh in run_health(fleet, alive, timeout=timeout).items():
                if not hh.ok:
                    out[name].stage = "health"
                    out[name].problems = [f"{c['check']}: {c.get('message', '')}" for c in hh.failed] or [hh.message]
        # 3b. burn-in (docs/burn-in.md): the tier the site names (`burnin_onboard_tier`, default standard; off)
        burned = onboard_burnin(fleet, inventory, [h for h in alive if out[h].stage is None], out, say)
        for h in hosts:
            out[h].in_service = out[h].stage is None

        # 4. mark in service / out of service on the hosts
        stages = [*oob, "preflight"] + ([] if skip_run else ["run"]) + (["node firmware"] if node_fw else []) + \
            ["health"] + (["burn-in"] if burned else [])
        _mark(fleet, out, timeout=min(timeout, 60.0), passed=stages)
        for o in out.values():
            o.passed = stages
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
            for h in hosts:
                o = out[h]
                if not (o.in_service and o.clusters):
                    continue
                members = {m for c in o.clusters for m in fleet.clusters[c].members}
                fails = [f"{f.host}: {f.task}: {f.message[:300]}" for f in lr.failures if f.host in members]
                bad = [m for m in members
                       if (hr := lr.hosts.get(m)) is not None and hr.state in ("failed", "unreachable", "not_run")]
                if lr.error or fails or bad:
                    o.launch = "failed"
                    o.launch_problems = fails or [lr.error or f"{', '.join(sorted(bad))} not launched"]
                elif o.host in lr.hosts and lr.hosts[o.host].ok > 0:
                    o.launch = "ok"
                # else: the playbook has no vllm-tagged task for the host (e.g. --playbook health.yml): not run

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
