"""`provision render INVENTORY --host H [--out DIR]`: the exact files a host gets from templates/.

Same templates, same variables (roles' defaults/main.yml under the host's inventory vars, plus the vLLM facts from
provisioner.vllm_args) as the roles, so the output is byte for byte what Ansible writes, except secrets
(vllm_api_key, vllm_hf_token), which show as <redacted>.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from provisioner.commands.common import VAULT_HELP, finding_line, unwrap, use_vault, validate
from provisioner.errors import Exit, UsageError

err = Console(stderr=True, highlight=False, soft_wrap=True)  # one line per message at any width (grep, logs)

HELP = unwrap("""Print the exact files a host gets from templates/ (secrets redacted).

Prints (or writes under --out DIR, at their host paths) the files HOST gets: /etc/nccl.conf, the vLLM env file and
systemd units, byte for byte what the roles write. Secrets show as <redacted>.

An inventory that fails validation for HOST is refused (exit 1), and with --out every destination must lie under
DIR (a `..` in vllm_env_file or vllm_unit_dir is refused, exit 2) before anything is written; each file is written
atomically (temporary file + rename).

Exit codes: 0 ok, 1 validation errors, 2 usage (unknown host, unreadable inventory, a path outside DIR).""")


def register(app: typer.Typer) -> None:
    @app.command("render", help=HELP)
    def render_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file (INI/YAML) with group_vars/ beside it.",
                                                  show_default=False)],
        host: Annotated[str, typer.Option("--host", help="The inventory host to render for.", show_default=False)],
        out: Annotated[Path | None, typer.Option(
            "--out", help="Write the files under DIR (DIR/etc/...) instead.")] = None,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        from provisioner.inventory import load_fleet
        from provisioner.render import host_files, out_paths
        from provisioner.reports.textfile import write_atomic

        fleet = load_fleet(inventory)
        if host not in fleet.hosts:
            known = ", ".join(sorted(fleet.hosts)[:10])
            raise UsageError(f"unknown host {host!r} (hosts: {known})", path=str(inventory))
        errors, _ = validate(fleet, {host})
        if errors:  # what validate (and `run`) refuses is never rendered, to stdout or to files
            for e in errors:
                err.print(f"[red]error[/] {escape(finding_line(e))}")
            err.print(f"refusing to render: {len(errors)} validation error(s) (see `provision validate "
                      f"{escape(str(inventory))}`)")
            raise typer.Exit(int(Exit.FAIL))
        files = host_files(fleet, host)
        if not files:
            err.print(f"{escape(host)}: no templated files (not a GPU node, in no vLLM cluster)")
            return
        if out is None:
            for i, f in enumerate(files):
                if i:
                    sys.stdout.write("\n")
                sys.stdout.write(f"# ==> {f.dest} ({f.mode} {f.owner}:{f.group}, from templates/{f.template})\n")
                sys.stdout.write(f.content)
            sys.stdout.flush()
            return
        for f, dest in out_paths(files, out):  # every destination checked before the first write
            write_atomic(dest, f.content, int(f.mode, 8))
            err.print(f"wrote {escape(str(dest))} ({f.mode})")
