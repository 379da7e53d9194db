"""`provision testbed ...`: the simulated rack (real systemd hosts over SSH; only GPUs and HCAs are simulated)."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from provisioner.commands.common import unwrap
from provisioner.errors import Exit

# Not a terminal (CI logs, pipes): a wide table rather than one wrapped into 80 columns.
out = Console(width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True)

#: --name of every testbed command
RackName = Annotated[str, typer.Option("--name", "-n", help="Rack name (several racks can exist at once).")]
#: a host of the rack
HostName = Annotated[str, typer.Argument(help="Host name, e.g. node02.", show_default=False)]


def _log(msg: str) -> None:
    err.print(f"[dim]testbed:[/] {escape(msg)}", highlight=False, soft_wrap=True)  # paths stay whole in logs


def _fail(exc: Exception) -> None:
    # one line whatever the terminal's width (a failed wheel download names URL, CA and the fix in one line)
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(Exit.FAIL)


def _testbed(module: str) -> ModuleType:
    """`provisioner_testbed.<module>`, imported on first use: the simulated rack is its own top-level package (a
    rehearsal tool, outside the product package; nothing in `provisioner/` but this module imports it). Where it is
    not installed, one line and exit 2 (usage), never a traceback."""
    try:
        return importlib.import_module(f"provisioner_testbed.{module}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("provisioner_testbed", f"provisioner_testbed.{module}"):
            raise  # the testbed is there but one of its own imports is broken: a bug, keep the traceback
        err.print("error: the simulated rack is not installed: no module named 'provisioner_testbed' (it ships in the "
                  "wheel built from provisioner's repository, and with `pip install -e .` in a checkout)",
                  highlight=False, soft_wrap=True, markup=False)
        raise typer.Exit(Exit.USAGE) from None


def _faults_text(faults: dict[str, Any]) -> str:
    if not faults:
        return "-"
    return ", ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" if v is not True else k for k, v in faults.items())


def _table(name: str) -> Table:
    rack = _testbed("rack")

    st = rack.load(name)
    rows = rack.status(name)
    t = Table(title=escape(f"testbed rack '{name}' · {st.bridge} {st.gateway}/24"), title_justify="left")
    for col in ("host", "address", "state", "ssh", "GPUs", "HCAs up", "faults", "mem MiB"):
        t.add_column(col, justify="right" if col in ("HCAs up", "mem MiB") else "left", no_wrap=col != "faults")
    for r in rows:
        t.add_row(
            escape(r.name), escape(r.address),
            "[green]running[/]" if r.running else "[red]stopped[/]",
            "[green]up[/]" if r.ssh else "[red]down[/]",
            escape(str(r.gpus)), str(r.hcas), escape(_faults_text(r.faults)),
            f"{r.memory_mib:.0f}" if r.memory_mib is not None else "-",
        )
    return t


def register(app: typer.Typer) -> None:
    tb = typer.Typer(
        name="testbed",
        help=unwrap("""A simulated rack on this machine (root) to rehearse on.

        Real Debian hosts (systemd-nspawn) over SSH, a stand-in NVIDIA apt repo, simulated GPUs/HCAs with fault
        injection.

        Exit codes: 0 ok, 1 failed, 2 usage."""),
        no_args_is_help=True,
    )

    @tb.command()
    def up(
        nodes: Annotated[int, typer.Option("--nodes", "-N", help="Number of hosts (node01..).")] = 4,
        spec: Annotated[Path | None, typer.Option(
            "--spec", help="Hardware spec YAML (defaults + per-host overrides).")] = None,
        name: RackName = "rack",
        with_vllm: Annotated[bool, typer.Option(
            "--with-vllm", help="Add the vLLM golden layer (CPU vLLM + tiny model).")] = False,
        clusters: Annotated[bool | None, typer.Option(
            "--clusters/--no-clusters",
            help="Declare the vLLM cluster groups (vllm_pp, vllm_single) in the inventory. Default: only with "
                 "--with-vllm, since a plain rack cannot serve vLLM (its plain run and drift stay clean).")] = None,
        balancers: Annotated[int, typer.Option(
            "--balancers", help="Plain hosts after the nodes (lb01..) in the inventory's group lb: the serving "
                                "edge (nginx) on hosts of its own, apart from the GPU nodes.")] = 0,
    ) -> None:
        """Bring the rack up (no-op when it is already up; restarts stopped hosts). Writes its inventory."""
        rack = _testbed("rack")

        try:
            res = rack.up(rack.UpOptions(name=name, nodes=nodes, spec_file=spec, with_vllm=with_vllm,
                                         clusters=clusters, balancers=balancers), _log)
        except RuntimeError as exc:
            _fail(exc)
        out.print(_table(name))
        what = "created" if res.created else ("repaired: " + ", ".join(res.repaired) if res.repaired else
                                               "already up (no-op)")
        out.print(f"rack '{name}' {what} in {res.seconds:.1f} s · inventory: {res.rack.inventory}", highlight=False,
                  markup=False)
        # the inventory's secrets are vaulted: provision and ansible-playbook read the password file from here
        out.print(f"vault: {_testbed('vault').export_line()}", highlight=False, markup=False)

    @tb.command()
    def status(name: RackName = "rack",
               as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False) -> None:
        """Per-host state: running, sshd answering, hardware, injected faults, memory."""
        rack = _testbed("rack")

        if as_json:
            rows = rack.status(name)
            out.print_json(json.dumps([r.__dict__ for r in rows]))
        else:
            out.print(_table(name))

    @tb.command("list")
    def list_() -> None:
        """Every rack on this machine (name, hosts running, bridge, subnet, inventory)."""
        rack = _testbed("rack")

        t = Table(title="testbed racks", title_justify="left")
        for col in ("rack", "hosts", "bridge", "subnet", "state", "vLLM", "inventory"):
            t.add_column(col, no_wrap=True)
        for r in rack.list_racks():
            state = "[green]up[/]" if r.complete and r.running == r.nodes else (
                "[yellow]degraded[/]" if r.complete else "[red]half-built[/]")
            t.add_row(escape(r.name), f"{r.running}/{r.nodes}", escape(r.bridge), escape(r.subnet), state,
                      "yes" if r.with_vllm else "-", escape(str(r.inventory)))
        out.print(t)

    @tb.command()
    def down(
        name: RackName = "rack",
        all_racks: Annotated[bool, typer.Option(
            "--all", help="Every rack on this machine and stray pvbrN bridges.")] = False,
    ) -> None:
        """Remove the rack: hosts, mounts, bridge, proxy, repo server, state, inventory (also after a crash)."""
        rack = _testbed("rack")

        t0 = time.monotonic()
        try:
            if all_racks:
                names = rack.down_all(_log)
                out.print(f"removed {len(names)} rack(s) in {time.monotonic() - t0:.1f} s", highlight=False,
                          markup=False)
            elif rack.down(name, _log):
                out.print(f"rack '{name}' removed in {time.monotonic() - t0:.1f} s", highlight=False, markup=False)
            else:
                out.print(f"rack '{name}' is not up: nothing to remove", highlight=False, markup=False)
        except RuntimeError as exc:
            _fail(exc)

    @tb.command()
    def reset(name: RackName = "rack") -> None:
        """Every host back to a fresh disk (same names, addresses, host keys); hardware back to the rack spec."""
        rack = _testbed("rack")

        t0 = time.monotonic()
        try:
            rack.reset(name, _log)
        except RuntimeError as exc:
            _fail(exc)
        out.print(_table(name))
        out.print(f"rack '{name}' reset in {time.monotonic() - t0:.1f} s", highlight=False, markup=False)

    @tb.command()
    def fault(
        host: HostName,
        faults: Annotated[list[str], typer.Argument(
            help="hca_down=mlx5_3 · hca_rate=mlx5_2:200 · xid=[GPU:]79 · ecc_uncorrectable=GPU[:N] · missing_gpu[=N] · "
                 "nvlink_down[=GPU] · row_remap_pending[=GPU] · fm_mismatch[=VER] · persistence_off · acs_on[=GPU] · "
                 "vbios=[GPU:]VER · hca_fw=[HCA:]VER",
            show_default=False)],
        name: RackName = "rack",
    ) -> None:
        """Inject hardware faults into a host, live (its hardware tools answer differently at once)."""
        rack = _testbed("rack")

        resolved = rack.fault(name, host, faults, _log)
        out.print(f"{host}: faults now {_faults_text(resolved.get('faults') or {})}", highlight=False, markup=False)

    @tb.command()
    def clear(host: HostName, name: RackName = "rack") -> None:
        """Remove the faults injected with `fault` (back to the rack spec's hardware for that host)."""
        rack = _testbed("rack")

        resolved = rack.clear(name, host)
        out.print(f"{host}: faults now {_faults_text(resolved.get('faults') or {})}", highlight=False, markup=False)

    @tb.command()
    def stop(host: HostName, name: RackName = "rack") -> None:
        """Power a host off (it becomes unreachable; its disk is kept). `start` or `up` boots it again."""
        rack = _testbed("rack")

        rack.stop_host(name, host)
        out.print(f"{host}: stopped", highlight=False, markup=False)

    @tb.command()
    def start(host: HostName, name: RackName = "rack") -> None:
        """Boot a stopped host (waits until SSH answers)."""
        rack = _testbed("rack")

        try:
            started = rack.start_host_cmd(name, host)
        except RuntimeError as exc:
            _fail(exc)
        out.print(f"{host}: {'started' if started else 'already running'}", highlight=False, markup=False)

    @tb.command()
    def bmc(
        hosts: Annotated[list[str] | None, typer.Argument(help="Hosts (default: every host of the rack).",
                                                          show_default=False)] = None,
        name: RackName = "rack",
        stop: Annotated[bool, typer.Option("--stop", help="Stop those BMCs (the BMC-unreachable fault).")] = False,
        firmware: Annotated[list[str] | None, typer.Option(
            "--firmware", help="COMPONENT=VERSION the BMCs report from now on (bios, bmc), e.g. --firmware bios=2.18.0",
            show_default=False)] = None,
    ) -> None:
        """Give the rack's hosts Redfish BMCs (sushy-tools' emulator; power actions stop and start the host).

        One HTTPS service per host on 127.0.0.1, with certificates from the rack's own BMC CA and basic auth.

        The inventory gets bmc_address/bmc_port per host, bmc_username, bmc_ca_file and a vaulted bmc_password.

        Export the ANSIBLE_VAULT_PASSWORD_FILE line `testbed up` prints; docs/bmc.md has the rest."""
        rack, bmcmod = _testbed("rack"), _testbed("bmc")

        fw: dict[str, str] = {}
        for item in firmware or []:
            comp, eq, version = item.partition("=")
            if not eq or comp not in ("bios", "bmc") or not version:
                err.print(f"error: --firmware {item!r}: expected bios=VERSION or bmc=VERSION", highlight=False,
                          markup=False)
                raise typer.Exit(Exit.USAGE)
            fw[comp] = version
        try:
            states = rack.bmcs(name, hosts or None, stop=stop, firmware=fw or None)
        except (RuntimeError, KeyError) as exc:
            _fail(exc)
        for h, state in states.items():
            info = bmcmod.read_host(name, h) or {}
            out.print(f"{h}: BMC {state} at https://{bmcmod.ADDRESS}:{info.get('port')}", highlight=False, markup=False)
        out.print(f"password: {bmcmod.password_file(name)} (vaulted in the inventory: "
                  f"{_testbed('vault').export_line()})", highlight=False, markup=False)

    @tb.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def ssh(
        ctx: typer.Context,
        host: HostName,
        name: RackName = "rack",
    ) -> None:
        """Open a shell on a host (or run the command after the host name) with the rack's key and known_hosts."""
        hosts, rack = _testbed("hosts"), _testbed("rack")

        st = rack.load(name)
        h = rack.get_host(st, host)
        argv = hosts.ssh_argv(st, h.address, *ctx.args)
        if not ctx.args:
            argv = [a for a in argv if a != "BatchMode=yes"]
            argv.insert(1, "-t")
        os.execvp(argv[0], argv)

    app.add_typer(tb)
