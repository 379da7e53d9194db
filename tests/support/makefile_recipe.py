"""The command lines of a Makefile target's recipe, so a test runs what `make TARGET` runs (the demos)."""

from __future__ import annotations


def make_recipe(makefile: str, target: str) -> list[str]:
    """The command lines of a Makefile target's recipe (tab-indented lines; comment lines dropped)."""
    lines = makefile.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split(":", 1)[0].strip() == target and ":" in ln
                 and not ln.startswith("\t") and not ln.startswith("."))
    out = []
    for ln in lines[start + 1:]:
        if not ln.startswith("\t"):
            break
        cmd = ln.strip().lstrip("@-").strip()
        if cmd and not cmd.startswith("#"):
            out.append(cmd)
    return out
