"""What every Prometheus textfile report shares: label escaping and the atomic write node_exporter needs (also the
one atomic write of every other file a command writes: `render --out`, `status --html`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def escape_label(v: str) -> str:
    """A Prometheus label value: backslash, newline and double quote escaped (text exposition format)."""
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


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
