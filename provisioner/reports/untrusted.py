"""Text a node sent back (health results, probe output, firmware strings) made safe to keep and show: typed,
bounded in size, one line, no control characters. Reports escape it for their own format on top (Prometheus:
provisioner.reports.textfile; HTML: the status page)."""

from __future__ import annotations

import re
from typing import Any

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
def printable(text: str, keep: str = "") -> str:
    """`text` for a terminal: every character that is not printable (ESC and the other C0/C1 controls, DEL, a
    newline or tab, bidi overrides and other format characters), except those in `keep`, shown as its escape
    (`\\x1b`, `\\n`, `\\u202e`), so text from the ledger or a node can neither move the cursor, recolour or clear
    the terminal, retitle it, nor forge a line of its own. Backslashes stay as they are."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def terminal_safe(text: str) -> str:
    """Multi-line text from a node or a task's result (Ansible failure messages, stderr, diffs): `printable` with
    its lines and tabs kept."""
    return printable(text, keep="\n\t")


def node_text(v: Any, limit: int = 300) -> str:
    """`v` as one line of at most `limit` characters: a string, or a number/bool as text (anything else is shown
    by its type only); control characters (ANSI escapes included) become a space."""
    if isinstance(v, str):
        s = v
    elif isinstance(v, (int, float, bool)) or v is None:
        s = str(v)
    else:
        s = f"<{type(v).__name__}>"
    s = _CONTROL.sub(" ", s)
    return s if len(s) <= limit else s[:limit - 1] + "\u2026"
