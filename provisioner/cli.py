"""`provision`: the command line. Commands only wire stages together and map outcomes to exit codes.

Each command lives in `provisioner/commands/<name>.py` and exposes `register(app)`.
"""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console

from provisioner.errors import Exit, UsageError

app = typer.Typer(
    name="provision",
    help="Provision NVIDIA GPU racks for vLLM with Ansible. Exit codes: 0 ok, 1 failed/invalid, 2 usage, 3 drift.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Command modules, in the order `provision --help` lists them.
COMMANDS = (
    "validate",
    "render",
    "run",
    "drift",
    "preflight",
    "health",
    "onboard",
    "bench",
    "monitoring",
    "testbed",
)

err = Console(stderr=True, soft_wrap=True)


def _register_all() -> None:
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"provisioner.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"provisioner.commands.{name}":
                continue  # command not built yet
            raise
        mod.register(app)


_register_all()


def _click_exceptions() -> tuple[type[BaseException], ...]:
    """Click's usage-error classes: typer >= 0.29 vendors its own click (typer._click), older ones use click."""
    types: list[type[BaseException]] = []
    for mod in ("typer._click.exceptions", "click.exceptions"):
        try:
            types.append(importlib.import_module(mod).ClickException)
        except (ImportError, AttributeError):
            pass
    return tuple(types)


def main() -> None:
    try:
        # standalone_mode=False: a command's `raise typer.Exit(code)` comes back as the return value
        rc = app(standalone_mode=False)
    except UsageError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(Exit.USAGE)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # click usage errors arrive here in standalone_mode=False
        if isinstance(exc, _click_exceptions()):
            exc.show()  # type: ignore[attr-defined]
            sys.exit(Exit.USAGE)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
