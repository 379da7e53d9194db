"""`provision validate INVENTORY`: load the inventory through Ansible, run every rule, size every vLLM cluster."""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from provisioner.errors import Exit, UsageError

HELP = """Check INVENTORY (INI or YAML, with its group_vars/ and host_vars/) before anything touches a host:
hardware variables, NCCL tuning, vLLM cluster topology, memory sizing (weights per GPU, KV cache, full-length
sequences that fit) and vLLM flags. Every finding has a stable code (docs/inventory.md).
Exit codes: 0 valid (warnings allowed), 1 invalid, 2 usage (missing file, unreadable inventory)."""


class Format(str, Enum):
    text = "text"
    json = "json"


class VllmParser(str, Enum):
    auto = "auto"  # use vLLM's parser when the vllm package is importable
    on = "on"  # require it
    off = "off"


def _flag_checker(fleet: Any, vllm_parser: VllmParser, vllm_python: str | None) -> Any:
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
    verdicts = {(model, argv): err for (_, _, model, argv), err in zip(items, errors)}
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


def _choice(enum: type[Enum], option: str, value: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise UsageError(f"{option} {value!r}: expected one of {', '.join(e.value for e in enum)}") from None


def register(app: typer.Typer) -> None:
    # Options are plain strings checked here (UsageError -> one line, exit 2) rather than typer choices: typer's
    # own parameter errors would need cli.main to know its vendored click exception types.
    @app.command("validate", help=HELP)
    def validate_cmd(
        inventory: Optional[Path] = typer.Argument(None, help="inventory file or directory (e.g. inventories/rack-a.ini)",
                                                   show_default=False),
        fmt: str = typer.Option("text", "--format", "-f", help="text (tables) or json"),
        vllm_parser: str = typer.Option(
            "auto", "--vllm-parser",
            help="check rendered vLLM flags with vLLM's own parser: auto (when importable), on, off"),
        vllm_python: Optional[str] = typer.Option(
            None, "--vllm-python", envvar="PROVISION_VLLM_PYTHON", show_default=False,
            help="interpreter of an environment with vLLM, for the parser check (its PYTHONPATH: "
                 "PROVISION_VLLM_PYTHONPATH)"),
    ) -> None:
        if inventory is None:
            raise UsageError("validate needs an INVENTORY (e.g. provision validate inventories/rack-a.ini)")
        raise SystemExit(run(inventory, _choice(Format, "--format", fmt),
                             _choice(VllmParser, "--vllm-parser", vllm_parser), vllm_python))
