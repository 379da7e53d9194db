"""`provision ARGS` in this process: `provisioner.cli.main()` with sys.argv, the working directory and COLUMNS set,
stdout/stderr captured, SystemExit turned into the exit code. The same entry point as the console script, whose
real-process behaviour (exit status, one stderr line, no traceback) tests/integration/test_cli_process.py keeps.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def provision(*args: str, columns: int | None = None, cwd: Path | str | None = None,
              env: dict[str, str] | None = None) -> Result:
    from provisioner import cli

    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    saved_env = {k: os.environ.get(k) for k in ["COLUMNS", *(env or {})]}
    os.environ.pop("COLUMNS", None)
    if columns:
        os.environ["COLUMNS"] = str(columns)
    os.environ.update(env or {})
    sys.argv = ["provision", *args]
    os.chdir(cwd or ROOT)
    code: int | str | None = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as exc:
                code = exc.code
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if code is None:
        code = 0
    if isinstance(code, str):
        err.write(code + "\n")
        code = 1
    return Result(int(code), out.getvalue(), err.getvalue())
