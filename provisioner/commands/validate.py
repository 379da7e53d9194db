"""`provision validate INVENTORY`: load the inventory through Ansible, run every rule, size every vLLM cluster."""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from provisioner.commands.common import VAULT_HELP, Format, unwrap, use_vault
from provisioner.errors import Exit, UsageError
from provisioner.model import Fleet

HELP = unwrap("""Check an inventory before anything touches a host.

Loads INVENTORY (INI or YAML, with its group_vars/ and host_vars/) and checks hardware variables, NCCL tuning, vLLM
cluster topology, memory sizing (weights per GPU, KV cache, full-length sequences that fit) and vLLM flags. Every
finding has a stable code (docs/inventory.md).

Exit codes: 0 valid (warnings allowed), 1 invalid, 2 usage (missing file, unreadable inventory).""")


class VllmParser(str, Enum):
    auto = "auto"  # use vLLM's parser when the vllm package is importable
    on = "on"  # require it
    off = "off"


def _flag_checker(fleet: Fleet, vllm_parser: VllmParser, vllm_python: str | None) -> Any:
    """A FLAG003 checker backed by vLLM's real parser (all argvs checked in one batch up front), or None."""
    from provisioner.rules.flags import member_argvs
    from provisioner.vllm_args import vllm_available, vllm_parser_errors

    if vllm_parser is VllmParser.off:
        return None
    if vllm_python is None and not vllm_available():
        if vllm_parser is VllmParser.on:
            raise UsageError("--vllm-parser on: the vllm package is not importable here; pass --vllm-python "
                             "(or PROVISION_VLLM_PYTHON) pointing at a vLLM environment's interpreter")
        return None
    items = member_argvs(fleet)
    try:
        errors = vllm_parser_errors([(model, argv) for _, _, model, argv in items], python=vllm_python,
                                    pythonpath=os.environ.get("PROVISION_VLLM_PYTHONPATH"))
    except RuntimeError as exc:
        raise UsageError(f"--vllm-python: {exc}") from None
    verdicts = {(model, argv): err for (_, _, model, argv), err in zip(items, errors, strict=False)}
    return lambda model, argv: verdicts.get((model, tuple(argv)))


def run(inventory: Path, fmt: Format = Format.text, vllm_parser: VllmParser = VllmParser.auto,
        vllm_python: str | None = None) -> int:
    """Validate and print; returns the exit code. UsageError propagates (the CLI maps it to exit 2)."""
    from provisioner.inventory import load_fleet
    from provisioner.reports import validate_json, validate_text
    from provisioner.rules import build_context
    from provisioner.rules.result import validate

    fleet = load_fleet(inventory)
    checker = _flag_checker(fleet, vllm_parser, vllm_python)
    result = validate(fleet, build_context(fleet, flag_checker=checker))
    if fmt is Format.json:
        sys.stdout.write(validate_json.render(result))
    else:
        validate_text.print_report(result, Console(highlight=False))
    return Exit.OK if result.ok else Exit.FAIL


def register(app: typer.Typer) -> None:
    @app.command("validate", help=HELP)
    def validate_cmd(
        inventory: Annotated[Path, typer.Argument(
            help="Inventory file or directory (e.g. inventories/rack-a.ini).", show_default=False)],
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Tables (text) or JSON.")] = Format.text,
        vllm_parser: Annotated[VllmParser, typer.Option(
            "--vllm-parser", help="Check rendered vLLM flags with vLLM's own parser: auto (when importable), on, off."),
        ] = VllmParser.auto,
        vllm_python: Annotated[str | None, typer.Option(
            "--vllm-python", envvar="PROVISION_VLLM_PYTHON", show_default=False,
            help="Interpreter of an environment with vLLM, for the parser check (its PYTHONPATH: "
                 "PROVISION_VLLM_PYTHONPATH)."),
        ] = None,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, fmt, vllm_parser, vllm_python))
