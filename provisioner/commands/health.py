"""`provision health INVENTORY`: run the node health program on the GPU nodes and aggregate pass/fail."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

import provisioner.probes  # noqa: F401  (keeps the SSH key variables in the fleet model)
from provisioner.errors import Exit, UsageError

err = Console(stderr=True, highlight=False)

HELP = """Run roles/node_health/files/node_health.py on the GPU nodes of INVENTORY (over SSH, in parallel; the
program travels in the command, only python3 is needed on the host) and aggregate a per-host pass/fail table.

Checks: GPU count/model, driver == pinned, persistence mode, Fabric Manager (version == driver, fabric state),
uncorrectable ECC / pending row remaps, critical XIDs, NVLink, IB ports of NCCL_IB_HCA, GPUDirect (peermem or
DMA-BUF), single-node all-reduce bus bandwidth against the GPU catalog's threshold.
Exit codes: 0 every host passed, 1 a check failed or a host was unreachable, 2 usage."""


def register(app: typer.Typer) -> None:
    @app.command("health", help=HELP)
    def health_cmd(
        inventory: Path = typer.Argument(..., help="Inventory file or directory."),
        limit: Optional[str] = typer.Option(None, "--limit", "-l", help="Hosts/groups/globs, Ansible style."),
        fmt: str = typer.Option("text", "--format", "-f", help="text or json (stdout)."),
        prometheus: Optional[Path] = typer.Option(
            None, "--prometheus", help="Also write the Prometheus textfile (node_exporter textfile collector) here."),
        timeout: float = typer.Option(900.0, "--timeout", help="Seconds per host (the all-reduce included)."),
        forks: int = typer.Option(64, "--forks", help="Hosts checked at once."),
    ) -> None:
        from provisioner.commands.common import load_targets
        from provisioner.probes.health import render_json, render_prometheus, render_text, run_health
        from provisioner.reports.textfile import write_atomic

        fleet, hosts = load_targets(inventory, limit, fmt, timeout, forks)
        t0 = time.monotonic()
        results = run_health(fleet, hosts, timeout=timeout, forks=forks)
        seconds = time.monotonic() - t0
        sys.stdout.write(render_json(results, seconds) if fmt == "json" else render_text(results, seconds))
        if prometheus is not None:
            try:
                write_atomic(prometheus, render_prometheus(results))
            except OSError as exc:
                raise UsageError(f"cannot write the Prometheus textfile: {exc.strerror or exc}",
                                 path=str(prometheus)) from None
        raise SystemExit(int(Exit.OK if all(h.ok for h in results.values()) else Exit.FAIL))
