"""Where Ansible loaded a value from: `where(value) -> (path, line) | None`.

ansible-core tags every value it reads from a file with its origin but has no public API for reading the tag yet;
this is the one place that reads it (`ansible._internal._datatag`), and it degrades to None when that module moves,
so messages only lose their `(set in FILE:LINE)` part.
"""

from __future__ import annotations

from typing import Any


def where(value: Any) -> tuple[str, int | None] | None:
    """(path, line) of `value`'s origin tag (`value` may be the Origin itself), else None."""
    if value is None:
        return None
    try:
        from ansible._internal._datatag._tags import Origin
    except ImportError:  # pragma: no cover - another ansible-core layout: no locations, same findings
        return None
    o = value if isinstance(value, Origin) else Origin.get_tag(value)
    if o is None or not o.path or o.path.startswith("<"):
        return None
    return o.path, o.line_num
