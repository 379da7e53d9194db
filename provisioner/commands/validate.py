"""`provision validate INVENTORY`: load the inventory through Ansible, run every rule, size every vLLM cluster."""

from __future__ import annotations

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


def run(inventory: Path, fmt: Format = Format.text, vllm_parser: VllmParser = VllmParser.auto) -> int:
    """Validate and print; returns the exit code. UsageError propagates (the CLI maps it to exit 2)."""
    from provisioner.inventory import load_fleet
    from provisioner.reports import validate_json, validate_text
    from provisioner.rules import build_context
    from provisioner.rules.result import validate
    from provisioner.vllm_args import vllm_available, vllm_parser_error

    fleet = load_fleet(inventory)
    checker = None
    if vllm_parser is VllmParser.on and not vllm_available():
        raise UsageError("--vllm-parser on: the vllm package is not importable in this environment")
    if vllm_parser is not VllmParser.off and vllm_available():
        checker = vllm_parser_error
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
    ) -> None:
        if inventory is None:
            raise UsageError("validate needs an INVENTORY (e.g. provision validate inventories/rack-a.ini)")
        raise SystemExit(run(inventory, _choice(Format, "--format", fmt), _choice(VllmParser, "--vllm-parser",
                                                                                    vllm_parser)))
