"""`provision drift`'s fast path (provisioner.cli.parse_plain with drift.FAST_OPTIONS): the nightly timer's plain
arguments run without typer; flags take no value; anything else (-e, --exec-node, a bad value) goes to typer."""

from __future__ import annotations

import inspect
from pathlib import Path

from provisioner.cli import FAST_COMMANDS, parse_plain
from provisioner.commands import drift
from provisioner.commands.drift import FAST_OPTIONS, Report


def test_the_timers_arguments_take_the_fast_path() -> None:
    argv = ["inv/hosts.ini", "--report", "prometheus", "--output", "/var/lib/node_exporter/provisioner_drift.prom",
            "--quiet", "--full-every", "7"]
    assert "drift" in FAST_COMMANDS
    assert parse_plain(argv, FAST_OPTIONS) == ("inv/hosts.ini", {
        "report": Report.prometheus, "output": Path("/var/lib/node_exporter/provisioner_drift.prom"), "quiet": True,
        "full_every": 7.0})
    assert parse_plain(["inv", "-q", "-r", "json", "--full", "-l", "node0[1:2]", "--skip-tags=vllm"], FAST_OPTIONS) == (
        "inv", {"quiet": True, "report": Report.json, "full": True, "limit": "node0[1:2]", "skip_tags": "vllm"})


def test_anything_unusual_goes_to_typer() -> None:
    for argv in (["inv", "-e", "a=1"], ["inv", "--exec-node", "x"], ["inv", "--report", "yaml"], ["inv", "--quiet=1"],
                 ["inv", "--full-every", "weekly"], ["inv", "--help"], [], ["a", "b"], ["inv", "--output"]):
        assert parse_plain(argv, FAST_OPTIONS) is None, argv


def test_fast_options_are_run_parameters_and_typer_options() -> None:
    params = inspect.signature(drift.run).parameters
    source = inspect.getsource(drift.register)
    for opt, (param, _kind) in FAST_OPTIONS.items():
        assert param in params, opt
        assert f'"{opt}"' in source, opt  # declared to typer too (the one source of --help)
