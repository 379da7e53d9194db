"""`provision run INVENTORY`: validate, preflight, then apply playbooks/site.yml through ansible-runner."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from provisioner.commands.common import (
    EXEC_NODE_HELP,
    EXTRA_VARS_HELP,
    VAULT_HELP,
    finding_line,
    load_run_targets,
    shard_lines,
    shard_targets,
    unwrap,
    validate,
)
from provisioner.errors import Exit, UsageError
from provisioner.model import Fleet
from provisioner.reports import count

err = Console(stderr=True, highlight=False, soft_wrap=True)  # one line per message at any width (grep, logs)

HELP = unwrap("""Apply the playbooks (default playbooks/site.yml) to INVENTORY through ansible-runner.

Validates the inventory first, with the -e extra vars on top as the play will see them (refuses on errors), and
runs the preflight probe (unless --skip-preflight); live progress on stderr; artifacts under .runs/<time>-run/
(printed). Failed hosts are listed with a ready-to-paste `--limit @<run dir>/retry`.

With --exec-node, the hosts are split into one shard per execution node (a vLLM cluster, NVLink domain or `rack`
is never split) and each shard runs on its node's `ansible-runner worker`; the report is the same, one for all.

With --bundle DIR (an air-gapped site), a package, wheel or file the targeted hosts need that DIR's manifest lacks
is refused before any host is touched, each named with its version, role and hosts.

Exit codes: 0 all hosts ok, 1 validation/preflight/bundle refused or any host failed, unreachable or not reached,
2 usage.""")


def preflight(fleet: Fleet, targeted: list[str]) -> tuple[bool, list[str]]:
    """provisioner.probes.preflight on the targeted GPU nodes: (all ok, problem lines)."""
    from provisioner.probes.preflight import run_preflight

    reports = run_preflight(fleet, hosts=targeted)
    problems = [f"{name}: {rep.message}" for name, rep in reports.items() if not rep.ok]
    return not problems, problems


def register(app: typer.Typer) -> None:
    @app.command("run", help=HELP)
    def run_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        limit: Annotated[str | None, typer.Option(
            "--limit", "-l", help="Host pattern, or @FILE (a retry file).")] = None,
        tags: Annotated[str | None, typer.Option(
            "--tags", "-t", help="Only tasks with these tags (comma list).")] = None,
        skip_tags: Annotated[str | None, typer.Option("--skip-tags", help="Skip tasks with these tags.")] = None,
        extra: Annotated[list[str] | None, typer.Option("--extra-vars", "-e", help=EXTRA_VARS_HELP)] = None,
        serial: Annotated[str | None, typer.Option(
            "--serial", help="Rolling batches: N hosts or N% per batch.")] = None,
        max_fail_percent: Annotated[int | None, typer.Option(
            "--max-fail-percent", help="Stop the rollout when more than P% of a batch fails (0-100).")] = None,
        check: Annotated[bool, typer.Option("--check", help="Dry run (check + diff); changes nothing.")] = False,
        json_out: Annotated[bool, typer.Option(
            "--json", help="One JSON object on stdout at the end; no progress.")] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress; short summary only.")] = False,
        skip_preflight: Annotated[bool, typer.Option(
            "--skip-preflight", help="Do not run the preflight probe.")] = False,
        playbook: Annotated[Path | None, typer.Option(
            "--playbook", help="Playbook to run (default site.yml).")] = None,
        accelerate: Annotated[str | None, typer.Option(
            "--accelerate",
            help="Execution accelerator: none | mitogen (default $PROVISION_ACCELERATE, none).")] = None,
        exec_node: Annotated[list[str] | None, typer.Option("--exec-node", help=EXEC_NODE_HELP)] = None,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
        bundle: Annotated[Path | None, typer.Option(
            "--bundle", help="An air-gapped bundle (docs/airgap.md): refuse, before any host, what it lacks.")] = None,
    ) -> None:
        from provisioner.endpoints import LaunchSeen, endpoint_lines, endpoints_for, launched_clusters
        from provisioner.reports import run_json, run_text
        from provisioner.runner import make_progress, run_playbook, validate_serial

        validate_serial(serial)
        if max_fail_percent is not None and not 0 <= max_fail_percent <= 100:
            raise UsageError(f"--max-fail-percent must be 0..100, got {max_fail_percent}")
        # the inventory is parsed once: the limit is resolved on the fleet's own inventory, and ansible-runner is
        # handed the hosts it selects
        fleet, xv, limit_abs, targeted = load_run_targets(inventory, extra, limit, playbook, accelerate,
                                                        vault_password_file, "provision run")
        nodes, targeted = shard_targets(fleet, targeted, exec_node, accelerate)

        errors, warnings = validate(fleet, set(targeted))
        for w in warnings:
            if getattr(w, "severity", "") == "warning" and not quiet and not json_out:
                err.print(f"[yellow]warning[/] {escape(finding_line(w))}")
        if errors:
            for e in errors:
                err.print(f"[red]error[/] {escape(finding_line(e))}")
            err.print(f"refusing to run: {len(errors)} validation error(s) (see `provision validate {inventory}`)",
                      markup=False)
            raise typer.Exit(int(Exit.FAIL))
        if bundle is not None:
            from provisioner.bundle.verify import gaps

            lacking = gaps(bundle, fleet, targeted)
            for line in lacking:
                err.print(f"[red]bundle[/] {escape(str(bundle))}: {escape(line)}")
            if lacking:
                err.print(f"refusing to run: the bundle lacks {count(len(lacking), 'item')} the hosts need "
                          "(`provision bundle build` it again from this inventory)", markup=False)
                raise typer.Exit(int(Exit.FAIL))

        if not skip_preflight:
            ok, problems = preflight(fleet, targeted)
            if ok and not (quiet or json_out):
                err.print(f"preflight: ok ({count(len(targeted), 'host')} targeted)")
            for p in problems:
                err.print(f"[red]preflight[/] {escape(p)}")
            if not ok:
                err.print("refusing to run: preflight failed (fix the hosts, narrow --limit, or --skip-preflight)")
                raise typer.Exit(int(Exit.FAIL))

        from provisioner.ledger.site import site_of
        from provisioner.role_gates import idle_roles

        progress = make_progress("none" if (json_out or quiet) else "auto")
        seen = LaunchSeen()
        result = run_playbook(
            inventory, command="run", playbook=playbook, limit=limit_abs, tags=tags, skip_tags=skip_tags,
            check=check, serial=serial, max_fail_percent=max_fail_percent, extravars=xv, targeted=targeted,
            progress=progress, accelerate=accelerate, exec_nodes=nodes, fleet=fleet if nodes else None,
            on_event=seen, idle_roles=idle_roles(fleet, targeted, xv), ledger_site=site_of(fleet),
        )
        if not check:
            from provisioner.drift.tiers import record_run

            # the hosts this run completed: their state, for the next drift's probe tier
            warning = record_run(fleet, result, playbook=playbook, tags=tags, skip_tags=skip_tags, extra=xv,
                                 exec_nodes=nodes)
            if warning:
                err.print(warning, markup=False)
        if not (json_out or quiet):
            for line in shard_lines(result):
                err.print(line, markup=False)
        if json_out:
            sys.stdout.write(run_json.render(result))
        else:
            sys.stdout.write(run_text.render(result, quiet=quiet))
            endpoints = [] if quiet else endpoints_for(fleet, launched_clusters(fleet, result, seen))
            if endpoints:
                sys.stdout.write(f"serving: {count(len(endpoints), 'vLLM cluster')}\n")
                sys.stdout.write("".join(f"  {ln}\n" for ln in endpoint_lines(endpoints)))
        raise typer.Exit(int(Exit.OK if result.succeeded else Exit.FAIL))
