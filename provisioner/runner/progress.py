"""Progress displays for a playbook run: `make_progress("auto"|"live"|"lines"|"none")`. The runner calls them from
its event callback (play, task, host result) and at start and finish."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from provisioner.reports import count
from provisioner.results import RunResult


class Progress(Protocol):
    def start(self, result: RunResult) -> None: ...

    def play(self, name: str, batch: int) -> None: ...

    def task(self, name: str, role: str | None, handler: bool) -> None: ...

    def host_event(self, host: str, kind: str, message: str | None = None) -> None: ...

    def finish(self, result: RunResult) -> None: ...


class NullProgress:
    def start(self, result: RunResult) -> None:
        pass

    def play(self, name: str, batch: int) -> None:
        pass

    def task(self, name: str, role: str | None, handler: bool) -> None:
        pass

    def host_event(self, host: str, kind: str, message: str | None = None) -> None:
        pass

    def finish(self, result: RunResult) -> None:
        pass


@dataclass
class _View:
    """What both progress displays show."""

    result: RunResult | None = None
    play_name: str = ""
    batch: int = 1
    task_name: str = ""
    task_done: set[str] = field(default_factory=set)
    tasks: int = 0
    t0: float = field(default_factory=time.monotonic)

    def counts(self) -> tuple[int, int, int, int]:
        r = self.result
        if r is None:
            return 0, 0, 0, 0
        reached = sum(1 for h in r.hosts.values() if h.seen)
        failed = sum(1 for h in r.hosts.values() if h.failed and not h.unreachable)
        unreach = sum(1 for h in r.hosts.values() if h.unreachable)
        return len(r.targeted), reached, failed, unreach


class LineProgress(_View):
    """Plain progress lines (logs, CI, pipes): plays, batches, tasks, failures as they happen."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__()
        self.stream = stream or sys.stderr

    def _say(self, text: str) -> None:
        el = time.monotonic() - self.t0
        print(f"[{el:7.1f}s] {text}", file=self.stream, flush=True)

    def start(self, result: RunResult) -> None:
        self.result = result
        self.t0 = time.monotonic()
        mode = "check (drift)" if result.check else "apply"
        self._say(f"{result.command}: {count(len(result.targeted), 'host')}, forks {result.forks}, {mode}; "
                  f"run dir {result.run_dir}")

    def play(self, name: str, batch: int) -> None:
        self.play_name, self.batch = name, batch
        suffix = f" batch {batch}" if batch > 1 or (self.result and self.result.serial) else ""
        self._say(f"PLAY [{name}]{suffix}")

    def task(self, name: str, role: str | None, handler: bool) -> None:
        self.tasks += 1
        kind = "HANDLER" if handler else "TASK"
        self._say(f"{kind} [{role + ' : ' if role else ''}{name}]")

    def host_event(self, host: str, kind: str, message: str | None = None) -> None:
        if kind in ("failed", "unreachable"):
            msg = (message or "").splitlines()[0][:200] if message else ""
            self._say(f"  {kind.upper()}: {host}: {msg}")

    def finish(self, result: RunResult) -> None:
        t, reached, failed, unreach = self.counts()
        self._say(f"done in {result.duration:.1f}s: {count(t, 'host')}, {failed} failed, {unreach} unreachable")


class LiveProgress(_View):
    """rich live panel on a terminal: play, batch, task, hosts done/failed/unreachable, elapsed."""

    def __init__(self, console: Any = None) -> None:
        super().__init__()
        from rich.console import Console

        self.console = console or Console(stderr=True, soft_wrap=True)
        self.live: Any = None

    def _render(self) -> Any:
        from rich.table import Table

        t, reached, failed, unreach = self.counts()
        el = time.monotonic() - self.t0
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("play", f"{self.play_name}" + (f"  [cyan]batch {self.batch}[/]" if self.batch > 1 or (
            self.result and self.result.serial) else ""))
        grid.add_row("task", f"{self.task_name}  ({count(len(self.task_done), 'host')} done)")
        grid.add_row("hosts", f"{t} targeted · {reached} reached · [red]{failed} failed[/] · "
                              f"[magenta]{unreach} unreachable[/]")
        grid.add_row("elapsed", f"{el:.1f}s · {count(self.tasks, 'task')}")
        return grid

    def start(self, result: RunResult) -> None:
        from rich.live import Live

        self.result = result
        self.t0 = time.monotonic()
        self.console.print(f"[bold]{result.command}[/]: {count(len(result.targeted), 'host')}, forks {result.forks}"
                           f"{', check mode' if result.check else ''}; run dir {result.run_dir}", highlight=False)
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True,
                         get_renderable=self._render)
        self.live.start()

    def play(self, name: str, batch: int) -> None:
        self.play_name, self.batch = name, batch
        if batch > 1 or (self.result and self.result.serial):
            self.console.print(f"PLAY [{name}] [cyan]batch {batch}[/]", highlight=False)

    def task(self, name: str, role: str | None, handler: bool) -> None:
        self.tasks += 1
        self.task_name = f"{role + ' : ' if role else ''}{name}"
        self.task_done = set()

    def host_event(self, host: str, kind: str, message: str | None = None) -> None:
        self.task_done.add(host)
        if kind in ("failed", "unreachable"):
            msg = (message or "").splitlines()[0][:200] if message else ""
            self.console.print(f"  [red]{kind.upper()}[/]: {host} [{self.task_name}]: {msg}", highlight=False)

    def finish(self, result: RunResult) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def make_progress(mode: str) -> Progress:
    """`mode`: "auto" (live on a terminal, lines otherwise), "live", "lines" or "none"."""
    if mode == "none":
        return NullProgress()
    if mode == "live" or (mode == "auto" and sys.stderr.isatty()):
        return LiveProgress()
    return LineProgress()

