"""What every Prometheus textfile report shares: label and sample escaping, and the atomic write node_exporter needs
(also the one atomic write of every other file a command writes: `render --out`, `status --html`).

Label values and sample values can come from a node (a health check's name, a measured bandwidth): they are data,
never exposition syntax. `escape_label` keeps any value inside its quotes on one line, `sample_value` prints a
number or nothing, so a node cannot add a sample for another host.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

#: A label value longer than this is cut (a node's string could otherwise grow the file without bound).
MAX_LABEL = 256
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# C0 but newline (escaped as \n), DEL, C1, U+2028/9: the exposition format has no escape for them
_OTHER_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def escape_label(v: Any) -> str:
    """A Prometheus label value: any value as text, backslash, newline and double quote escaped (text exposition
    format), other control characters replaced by U+FFFD, cut at MAX_LABEL characters."""
    s = v if isinstance(v, str) else str(v)
    if len(s) > MAX_LABEL:
        s = s[:MAX_LABEL - 1] + "\u2026"
    s = _OTHER_CONTROL.sub("\ufffd", s)
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def sample_value(v: Any) -> str | None:
    """A sample's value: an int or float (bools as 0/1) in exposition syntax, else None (not a number: no sample)."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "+Inf" if v > 0 else "-Inf"
        return repr(v)
    return None


def sample(name: str, labels: dict[str, Any], value: Any) -> str | None:
    """One sample line `name{k="v",...} value`, or None when `value` is not a number. Names are ours (asserted)."""
    assert _METRIC_NAME.fullmatch(name), name
    assert all(_LABEL_NAME.fullmatch(k) for k in labels), labels
    val = sample_value(value)
    if val is None:
        return None
    body = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
    return f"{name}{{{body}}} {val}" if labels else f"{name} {val}"


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write via a temporary file in the same directory + rename (node_exporter never reads a half-written file);
    the file gets `mode` before it appears. A symlink at `path` is replaced, never followed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
