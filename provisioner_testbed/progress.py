"""Progress of the testbed's long silent steps (the vLLM layer build, the wheel download): one line per phase as it
starts and ends, with its seconds, and a heartbeat at most every `HEARTBEAT_S` while a subprocess runs.

`Phases` is pure: every call takes the clock reading (`now`) and returns the lines to print, so tests drive it with a
fake clock. `build_phase` names a build script marker (`== [HH:MM:SS] TEXT`) for the operator (never echoing the
marker's own text: the apt line carries the proxy URL, credentials included). `run_logged` runs a process, copies
its output to a log file and calls back per line and per tick.
"""

from __future__ import annotations

import queue
import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

#: Longest silence while a phase runs (seconds between heartbeat lines).
HEARTBEAT_S = 20.0

#: `say` in vllm_image._BUILD_SH: `== [12:34:56] pip install ...`.
MARKER = re.compile(r"^== \[\d\d:\d\d:\d\d\] (.*)$")


def seconds(s: float) -> str:
    """`42 s`, `3 min 05 s`: how the layer's lines say elapsed time."""
    s = max(0, int(round(s)))
    return f"{s} s" if s < 120 else f"{s // 60} min {s % 60:02d} s"


@dataclass
class Phases:
    """Phase lines for one long step. `start(name, now)` ends the running phase (`NAME: done in N s`) and announces
    the next (`NAME ...`); `tick(now)` is the heartbeat (None until `every` seconds passed since the last line);
    `finish(now)` ends the last phase. `total`: phases expected, for "phase i/N" (0: unknown)."""

    prefix: str
    t0: float
    total: int = 0
    every: float = HEARTBEAT_S
    name: str | None = None
    index: int = 0
    started: float = 0.0
    last_line: float = field(default=0.0)
    #: extra words for the heartbeat (e.g. `37 wheels so far`), asked for at each beat
    detail: Callable[[], str] | None = None

    def _p(self, text: str) -> str:
        return f"{self.prefix}: {text}"

    def start(self, name: str, now: float, about: str = "") -> list[str]:
        """`about`: more words for the start line only (the end and heartbeat lines name the phase alone)."""
        out = self._end(now)
        self.name, self.started, self.last_line = name, now, now
        self.index += 1
        of = f" (phase {self.index}/{self.total})" if self.total and self.index <= self.total else ""
        out.append(self._p(f"{name}{' ' + about if about else ''}{of} ..."))
        return out

    def _end(self, now: float) -> list[str]:
        if self.name is None:
            return []
        line = self._p(f"{self.name}: done in {seconds(now - self.started)}")
        self.name, self.last_line = None, now
        return [line]

    def finish(self, now: float) -> list[str]:
        return self._end(now)

    def fail(self, now: float) -> list[str]:
        """The running phase failed: `NAME: FAILED after N s` (nothing when none runs)."""
        if self.name is None:
            return []
        line = self._p(f"{self.name}: FAILED after {seconds(now - self.started)}")
        self.name, self.last_line = None, now
        return [line]

    def tick(self, now: float) -> str | None:
        if self.name is None or now - self.last_line < self.every:
            return None
        self.last_line = now
        more = self.detail() if self.detail else ""
        left = f", {self.total - self.index} phase(s) after this" if self.total and self.index < self.total else ""
        return self._p(f"{self.name}: {seconds(now - self.started)} so far{', ' + more if more else ''}"
                       f" ({seconds(now - self.t0)} in all{left})")


def build_phase(marker: str, wheels: int = 0) -> str | None:
    """The operator's name for a build script marker (None: the marker ends the build, `done`). Unknown markers are
    shown by their first word only (the text may carry a proxy URL)."""
    m = marker.strip()
    if m == "done":
        return None
    names = (
        ("overlay of ", "mounting an overlay of the base root"),
        ("apt: ", "apt install of the vLLM host packages"),
        ("venv ", "creating the venv with the base root's python3.11"),
        ("pip install ", f"installing {wheels} wheels into the venv (offline)" if wheels else
         "installing the wheels into the venv (offline)"),
        ("pip uninstall ", "removing the dists that do not import beside torch"),
        ("tiny model ", "building the tiny random-weight model"),
        ("smoke: ", "checks: console script, no-op pin, vLLM's parser"),
    )
    for prefix, name in names:
        if m.startswith(prefix):
            return name
    return m.split(" ", 1)[0] or "build"


#: Phases `vllm_image._BUILD_SH` announces (overlay, apt, venv, pip install, uninstall, model, smoke).
BUILD_PHASES = 7


@dataclass
class Ran:
    rc: int
    output: str


def run_logged(argv: Sequence[str], log: IO[str], *, env: Mapping[str, str] | None = None,
               on_line: Callable[[str], None] | None = None, on_tick: Callable[[], None] | None = None,
               tick_s: float = 1.0, keep_output: bool = False) -> Ran:
    """Run `argv` (stdout and stderr together), each line appended to `log` as it comes and passed to `on_line`;
    `on_tick` every `tick_s` of silence or between lines (the caller's `Phases.tick` decides whether to speak).
    `keep_output`: return the whole output too (pip's, for its one-line failure)."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=dict(env) if env is not None else None, bufsize=1)
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def read(stream: IO[str]) -> None:
        for ln in stream:
            lines.put(ln)
        lines.put(None)

    reader = threading.Thread(target=read, args=(proc.stdout,), daemon=True)
    reader.start()
    kept: list[str] = []
    next_tick = time.monotonic() + tick_s
    try:
        while True:
            try:
                ln = lines.get(timeout=max(0.0, next_tick - time.monotonic()))
            except queue.Empty:
                ln = ""
            if ln is None:
                break
            if ln:
                log.write(ln)
                log.flush()
                if keep_output:
                    kept.append(ln)
                if on_line is not None:
                    on_line(ln.rstrip("\n"))
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + tick_s
                if on_tick is not None:
                    on_tick()
    except BaseException:  # interrupted (Ctrl-C): as subprocess.run does, the child goes too
        proc.kill()
        proc.wait()
        raise
    rc = proc.wait()
    reader.join(timeout=5)
    return Ran(rc, "".join(kept))


def count_wheels(wheelhouse: Path) -> int:
    try:
        return sum(1 for p in wheelhouse.iterdir() if p.name.endswith(".whl"))
    except OSError:
        return 0
