"""The options of `provision` itself, before any command: `--version`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer


def _version(value: bool) -> None:
    if value:
        from provisioner import __version__

        sys.stdout.write(f"provision {__version__}\n")
        raise typer.Exit()


def register(app: typer.Typer) -> None:
    @app.callback()
    def root(
        version: Annotated[bool, typer.Option(
            "--version", is_eager=True, callback=_version, help="Print the version and exit.")] = False,
    ) -> None:
        pass
