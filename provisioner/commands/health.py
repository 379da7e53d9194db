"""`provision health INVENTORY`: run the node health program on the GPU nodes and aggregate pass/fail."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

import provisioner.probes  # noqa: F401  (keeps the SSH key variables in the fleet model)
from provisioner.commands.common import VAULT_HELP, Format, load_targets, unwrap, use_vault
from provisioner.errors import Exit, UsageError

HELP = unwrap("""Run the node health program on the GPU nodes and aggregate a per-host pass/fail table.

Runs roles/node_health/files/node_health.py on the GPU nodes of INVENTORY (over SSH, in parallel; the program
travels in the command, only python3 is needed on the host).

Checks: GPU count/model, driver == pinned, persistence mode, Fabric Manager (version == driver, fabric state),
uncorrectable ECC / pending row remaps, critical XIDs, NVLink, IB ports of NCCL_IB_HCA, GPUDirect (peermem or
DMA-BUF), single-node all-reduce bus bandwidth against the GPU catalog's threshold.

Exit codes: 0 every host passed, 1 a check failed or a host was unreachable, 2 usage.""")


def register(app: typer.Typer) -> None:
    @app.command("health", help=HELP)
    def health_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        limit: Annotated[str | None, typer.Option("--limit", "-l", help="Hosts/groups/globs, Ansible style.")] = None,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Report on stdout.")] = Format.text,
        prometheus: Annotated[Path | None, typer.Option(
            "--prometheus", help="Also write the Prometheus textfile (node_exporter textfile collector) here.")] = None,
        timeout: Annotated[float, typer.Option(
            "--timeout", help="Seconds per host (the all-reduce included).")] = 900.0,
        forks: Annotated[int, typer.Option("--forks", help="Hosts checked at once.")] = 64,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        from provisioner.probes.health import render_json, render_prometheus, render_text, run_health
        from provisioner.reports.textfile import write_atomic

        fleet, hosts = load_targets(inventory, limit, timeout, forks)
        t0, started = time.monotonic(), time.time()
        results = run_health(fleet, hosts, timeout=timeout, forks=forks)
        seconds = time.monotonic() - t0
        from provisioner.ledger.record import record_health

        record_health(results, inventory, started, seconds, fleet=fleet)  # the ledger (best effort: one line at most)
        sys.stdout.write(render_json(results, seconds) if fmt is Format.json else render_text(results, seconds))
        if prometheus is not None:
            try:
                write_atomic(prometheus, render_prometheus(results))
            except OSError as exc:
                raise UsageError(f"cannot write the Prometheus textfile: {exc.strerror or exc}",
                                 path=str(prometheus)) from None
        raise typer.Exit(int(Exit.OK if all(h.ok for h in results.values()) else Exit.FAIL))
