"""`provision status` takes provisioner.cli's fast path (no typer import) with plain arguments; its options are run()'s
parameters and declared to typer too (the one source of --help); --all-sites and anything unusual go to typer."""

from __future__ import annotations

import inspect

from provisioner.cli import FAST_COMMANDS, parse_plain
from provisioner.commands import status
from provisioner.commands.common import Format


def test_plain_status_arguments_take_the_fast_path() -> None:
    assert "status" in FAST_COMMANDS
    assert parse_plain(["inv.ini", "--format", "json"], status.FAST_OPTIONS) == ("inv.ini", {"fmt": Format.json})
    for argv in (["--all-sites"], ["inv", "--all-sites"], ["inv", "--format", "yaml"], ["inv", "--help"], []):
        assert parse_plain(argv, status.FAST_OPTIONS) is None, argv


def test_fast_options_are_run_parameters_and_typer_options() -> None:
    params = inspect.signature(status.run).parameters
    source = inspect.getsource(status.register)
    for opt, (param, _kind) in status.FAST_OPTIONS.items():
        assert param in params, opt
        assert f'"{opt}"' in source, opt
