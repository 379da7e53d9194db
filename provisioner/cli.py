"""`provision`: the command line. Commands only wire stages together and map outcomes to exit codes.

Each command lives in `provisioner/commands/<name>.py` and exposes `register(app)`.

Start-up: typer, rich and the command modules are imported only when needed. A command listed in FAST_COMMANDS
(its module exposes FAST_OPTIONS and run()) runs without them when its arguments are plain (one positional, known
options with valid values); anything else — --help, an unknown option, a bad value — goes through typer, which
stays the one source of help texts and usage errors.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from provisioner.errors import Exit, Failure, UsageError

if TYPE_CHECKING:
    import typer

HELP = "Provision NVIDIA GPU racks for vLLM with Ansible.\n\nExit codes: 0 ok, 1 failed/invalid, 2 usage, 3 drift."

# Command modules, in the order `provision --help` lists them.
COMMANDS = (
    "validate",
    "render",
    "plan",
    "run",
    "drift",
    "preflight",
    "health",
    "burn_in",
    "onboard",
    "power",
    "firmware",
    "status",
    "history",
    "node",
    "drain",
    "upgrade",
    "remediate",
    "incidents",
    "receiver",
    "ledger",
    "bench",
    "monitoring",
    "bundle",
    "testbed",
)

#: Commands with a fast path (no typer/rich import): their module has FAST_OPTIONS {option: (param, type)}, run().
FAST_COMMANDS = ("preflight", "drift", "status")

_app: Any = None


def build_app() -> typer.Typer:
    """The typer app with every command module that exists registered (built once)."""
    global _app
    if _app is None:
        import typer

        _app = typer.Typer(name="provision", help=HELP, no_args_is_help=True, add_completion=False,
                           pretty_exceptions_enable=False)
        importlib.import_module("provisioner.commands.root").register(_app)  # --version
        for name in COMMANDS:
            importlib.import_module(f"provisioner.commands.{name}").register(_app)
    return _app


def __getattr__(name: str) -> Any:  # `provisioner.cli.app` stays available (built on first use)
    if name == "app":
        return build_app()
    raise AttributeError(name)


def parse_plain(argv: list[str], options: dict[str, tuple[str, type]]) -> tuple[str, dict[str, Any]] | None:
    """(positional, {param: value}) when `argv` is one positional plus known options (`--opt VALUE`, `--opt=VALUE`,
    `-o VALUE`, and flags: type `bool`) with values of the right type; None for anything else (typer then parses and
    reports it)."""
    positional: list[str] = []
    values: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-") or a == "-":
            positional.append(a)
            i += 1
            continue
        opt, eq, val = a.partition("=") if a.startswith("--") else (a, "", "")
        if opt not in options:
            return None
        param, kind = options[opt]
        if kind is bool:  # a flag: no value
            if eq:
                return None
            values[param] = True
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv):
                return None
            val = argv[i + 1]
            i += 1
        i += 1
        try:
            values[param] = kind(val)
        except ValueError:
            return None
    if len(positional) != 1:
        return None
    return positional[0], values


def vault_failure(exc: BaseException) -> str | None:
    """One line for a vaulted value used where it cannot be decrypted (no vault password, a wrong one), else None:
    the net under the commands' own checks (provisioner.vault.require), never a traceback."""
    from provisioner.vault import SOURCES

    if isinstance(exc, ReferenceError) and "VaultSecretsContext" in str(exc):
        return f"a vaulted value is needed and no vault password is given ({SOURCES})"
    if type(exc).__name__ in ("AnsibleVaultError", "AnsibleVaultPasswordError", "AnsibleVaultFormatError"):
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"a vaulted value cannot be decrypted: {first} ({SOURCES})"
    return None


def _fast(command: str, argv: list[str]) -> int | None:
    """Run `command` without typer when its arguments are plain; None when typer must handle them."""
    from pathlib import Path

    mod = importlib.import_module(f"provisioner.commands.{command}")
    parsed = parse_plain(argv, mod.FAST_OPTIONS)
    if parsed is None:
        return None
    positional, values = parsed
    try:
        return int(mod.run(Path(positional), **values))
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return int(Exit.USAGE)
    except Failure as exc:
        sys.stderr.write(f"error: {exc}\n")
        return int(Exit.FAIL)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except Exception as exc:
        line = vault_failure(exc)
        if line is None:
            raise
        sys.stderr.write(f"error: {line}\n")
        return int(Exit.USAGE)


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
    argv = sys.argv[1:]
    if argv and argv[0] in FAST_COMMANDS:
        rc = _fast(argv[0], argv[1:])
        if rc is not None:
            sys.exit(rc)
    import typer
    from rich.console import Console
    from rich.markup import escape

    err = Console(stderr=True, soft_wrap=True)
    app = build_app()
    try:
        # standalone_mode=False: a command's `raise typer.Exit(code)` comes back as the return value
        rc = app(standalone_mode=False)
    except UsageError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(Exit.USAGE)
    except Failure as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(Exit.FAIL)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # click usage errors arrive here in standalone_mode=False
        if type(exc).__name__ == "NoArgsIsHelpError":
            # bare `provision` (or a group without its command): the help, as typer's no_args_is_help shows it
            # (typer has printed it already; plain click carries it as the message), exit 2, no empty error line
            text = exc.format_message()  # type: ignore[attr-defined]
            if text.strip():
                sys.stdout.write(text.rstrip("\n") + "\n")
            sys.exit(Exit.USAGE)
        if isinstance(exc, _click_exceptions()):
            # one line, as for our own usage errors: what is wrong, and where the help is
            ctx = getattr(exc, "ctx", None)
            where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            message = exc.format_message()  # type: ignore[attr-defined]
            err.print(f"[bold red]error:[/] {escape(message + where)}", highlight=False)
            sys.exit(Exit.USAGE)
        line = vault_failure(exc)
        if line is not None:
            err.print(f"[bold red]error:[/] {escape(line)}", highlight=False)
            sys.exit(Exit.USAGE)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
