"""Onboarding's steps that talk to BMCs and nodes: power on and the firmware gate (out of band), the node's own
firmware after the run, the burn-in, and the in-service mark. Each fails hosts in the outcomes it is handed; the
decisions are day2/onboard.py's."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provisioner.day2.onboard import (
    BURNIN_TIMEOUT,
    IN_SERVICE,
    Outcome,
    before_the_run,
    burnin_tiers,
    check_line,
    mark_note,
)
from provisioner.model import Fleet

Say = Callable[[str], None]


def mark(fleet: Fleet, results: dict[str, Outcome], timeout: float, passed: list[str]) -> None:
    """Write (in service) or remove (left out) /etc/provisioner/in-service on each reachable host; a host in service
    whose mark cannot be written is left out at `mark`."""
    from provisioner.probes.health import mark_command
    from provisioner.probes.ssh import run_many, target_for

    targets = [target_for(fleet.hosts[h]) for h in results if results[h].stage != "unreachable"]
    note = mark_note(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), passed)

    def cmd(t: Any) -> str:
        return mark_command(results[t.name].in_service, note, sudo=(t.user or "root") != "root")

    for name, r in run_many(targets, cmd, timeout=timeout).items():
        o = results[name]
        o.marked = r.ok and r.rc == 0
        if o.in_service and not o.marked:
            o.in_service = False
            o.stage = "mark"
            o.problems.append(f"could not write {IN_SERVICE}: {r.error or r.stderr.strip()[:200]}")


def burnin(fleet: Fleet, inventory: Path, hosts: list[str], out: dict[str, Outcome], say: Say) -> bool:
    """Each host's onboarding burn-in tier, run and recorded as `provision burn-in` does; a failed check fails the
    host (stage burn-in). True when one ran."""
    from provisioner.ledger.record import record_burnin
    from provisioner.probes.burnin import run_burnin

    tiers = burnin_tiers(fleet, hosts)
    for tier, names in tiers.items():
        say(f"onboard: burn-in ({tier}) on {', '.join(names)}")
        started = time.time()
        res = run_burnin(fleet, names, tier=tier, timeout=BURNIN_TIMEOUT[tier])
        record_burnin(res, tier, inventory, started, time.time() - started, fleet=fleet)
        for name, hb in res.items():
            if not hb.ok:
                out[name].fail("burn-in", [check_line(r) for r in hb.failed] or [hb.error or "failed"])
            else:
                out[name].burnin = tier
    return bool(tiers)


def out_of_band(fleet: Fleet, hosts: list[str], out: dict[str, Outcome], timeout: float, say: Say) -> list[str]:
    """Power on from the BMC what is off and wait for SSH (hosts with a bmc_address), then the firmware gate for
    hosts with a `firmware` map: the BMC's report, plus the node's own (VBIOS, HCA fw_ver) where the map names gpu or
    hca. Fails hosts in `out` (stage power / firmware); returns the stages that ran."""
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
            o.fail("power", [f"BMC: {exc}"])
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
            o.fail("power", [str(exc)])
            return
        if wanted[host]:
            try:
                reports[host] = bmc.firmware()
            except BmcError as exc:
                o.fail("firmware", [str(exc)])

    for h, r in each(with_bmc, one, 16).items():
        if isinstance(r, BaseException):
            out[h].fail("power", [f"{type(r).__name__}: {r}"])
    gated = [h for h in gated if out[h].stage is None]
    nodes = read_nodes(fleet, [h for h in gated if node_part(wanted[h])], timeout=min(timeout, 60.0))
    for h in gated:
        rep = reports.get(h, HostFirmware(h))
        if h in nodes:
            rep = merged(rep, *nodes[h])
        findings = before_the_run(compare(rep, wanted[h]), NODE_COMPONENTS)
        if findings:
            out[h].fail("firmware", [f.line() for f in findings])
    return (["power"] if with_bmc else []) + (["firmware"] if any(wanted.values()) else [])


def node_firmware(fleet: Fleet, hosts: list[str], out: dict[str, Outcome], timeout: float) -> bool:
    """After the run (the driver is installed now): the node's own VBIOS / HCA fw_ver against the gpu / hca entries
    of each host's firmware map; a host that fails is left out at `firmware`. Whether any host was gated."""
    from provisioner.bmc.firmware import HostFirmware, compare, merged, node_part, wanted_map
    from provisioner.probes.firmware import read_nodes

    wanted = {h: node_part(wanted_map(fleet.hosts[h].vars.get("firmware"))) for h in hosts}
    gated = [h for h in hosts if wanted[h]]
    for h, (items, error) in read_nodes(fleet, gated, timeout=timeout).items():
        findings = compare(merged(HostFirmware(h), items, error), wanted[h])
        if findings:
            out[h].fail("firmware", [f.line() for f in findings])
    return bool(gated)
