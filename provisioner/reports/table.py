"""Plain-text tables through rich (`provision health`, `provision preflight`): whole column names, aligned cells,
no borders, no colour, never wrapped (the text goes to stdout, pipes and logs as much as terminals)."""

from __future__ import annotations

import io
from typing import Any

#: Render width: wide enough that rich never wraps or cuts a cell (the table is only as wide as its content).
WIDE = 10_000


def plain_table(*columns: str, right: tuple[str, ...] = ()) -> Any:
    """A borderless rich Table with these headers; columns named in `right` are right-aligned."""
    from rich.table import Table

    t = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False, highlight=False)
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left", no_wrap=True)
    return t


def to_text(table: Any) -> str:
    """The table as text lines (trailing blanks stripped), no markup."""
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=WIDE, color_system=None, highlight=False, markup=False, emoji=False).print(table)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())
