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


def origin_type() -> type | None:
    """ansible-core's Origin tag class (the parsed-inventory cache pickles it compactly), or None when it moved."""
    try:
        from ansible._internal._datatag._tags import Origin
    except ImportError:  # pragma: no cover - another ansible-core layout
        return None
    return Origin


def make_origin(path: str | None, description: str | None, line_num: int | None, col_num: int | None) -> Any:
    from ansible._internal._datatag._tags import Origin

    return Origin(path=path, description=description, line_num=line_num, col_num=col_num)


def tag_like(src: Any, value: Any) -> Any:
    """`value` with `src`'s tags (its origin), or `value` as it is when ansible-core's tag helper moved."""
    try:
        from ansible.module_utils._internal._datatag import AnsibleTagHelper
    except ImportError:  # pragma: no cover - another ansible-core layout: the value, without its origin
        return value
    return AnsibleTagHelper.tag_copy(src, value)
