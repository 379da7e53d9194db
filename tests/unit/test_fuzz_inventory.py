"""Random and malformed inventories never make `provision validate` crash: exit 0/1/2, never a traceback.

Examples run through the real CLI entry point (`provisioner.cli.main`, what the console script calls) in-process
for speed; a few also through the console script in a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from fuzz_inventory_shared import _write, inventories
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st


def run_cli(inv: Path, fmt: str) -> tuple[int, str, str]:
    from provisioner import cli

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["provision", "validate", str(inv), "--format", fmt]
    code: Any = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.argv = argv
    return int(code or 0), out.getvalue(), err.getvalue()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(files=inventories(), fmt=st.sampled_from(["json", "text"]))
def test_random_inventories_never_crash(files: dict[str, str], fmt: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        inv = _write(Path(d), files)
        rc, out, err = run_cli(inv, fmt)  # any exception other than SystemExit fails the test: a traceback
    assert rc in (0, 1, 2), (rc, err)
    event(f"exit {rc}")  # --hypothesis-show-statistics shows the mix
    if rc == 2:
        assert "error:" in err and out == "", err
    elif fmt == "json":
        doc = json.loads(out)
        assert set(doc) == {"ok", "errors", "warnings", "clusters"} and doc["ok"] == (rc == 0)
