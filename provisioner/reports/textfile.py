"""What every Prometheus textfile report shares: label escaping and the atomic write node_exporter needs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def escape_label(v: str) -> str:
    """A Prometheus label value: backslash, newline and double quote escaped (text exposition format)."""
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory + rename (node_exporter never reads a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
