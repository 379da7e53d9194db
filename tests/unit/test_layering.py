"""Module layering, read from the source: no command module imports another command module (only the shared
`commands.common`), and the day-2 decisions import neither the executor nor any command."""

from __future__ import annotations

import ast
from pathlib import Path

import provisioner

PKG = Path(provisioner.__file__).parent
COMMANDS = PKG / "commands"
PURE = ("lifecycle", "policy", "rails", "rollout", "drain", "incidents", "onboard")


def _imports(path: Path) -> set[str]:
    """Every module `path` imports (at any depth: the commands import lazily inside functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_no_command_module_imports_another() -> None:
    names = {p.stem for p in COMMANDS.glob("*.py")} - {"__init__", "common"}
    assert len(names) > 10  # the walk sees the commands
    bad = []
    for p in sorted(COMMANDS.glob("*.py")):
        for mod in _imports(p):
            parts = mod.split(".")
            if parts[:2] == ["provisioner", "commands"] and len(parts) > 2 and parts[2] in names \
                    and parts[2] != p.stem:
                bad.append(f"{p.name} imports {mod}")
    assert not bad, "; ".join(sorted(set(bad)))


def test_day2_decisions_are_pure() -> None:
    bad = []
    for stem in PURE:
        p = PKG / "day2" / f"{stem}.py"
        if not p.exists():
            continue
        for mod in _imports(p):
            if mod.startswith(("provisioner.commands", "provisioner.day2.executor", "provisioner.day2.service",
                               "provisioner.probes", "provisioner.runner", "provisioner.ledger", "subprocess")):
                bad.append(f"day2/{stem}.py imports {mod}")
    assert not bad, "; ".join(sorted(set(bad)))


def test_the_walk_catches_a_cross_import(tmp_path: Path) -> None:
    p = tmp_path / "x.py"
    p.write_text("def f():\n    from provisioner.commands.drain import run\n")
    assert "provisioner.commands.drain" in _imports(p)


def test_day2_imports_no_command() -> None:
    """The executor and its I/O siblings (onboard_steps, burnin_return) serve the commands; none calls one back."""
    mods = sorted((PKG / "day2").glob("*.py"))
    assert {"executor", "onboard_steps", "burnin_return", "onboard"} <= {p.stem for p in mods}
    bad = [f"day2/{p.name} imports {m}" for p in mods for m in _imports(p) if m.startswith("provisioner.commands")]
    assert not bad, "; ".join(sorted(set(bad)))
