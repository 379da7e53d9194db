"""Progress displays for a playbook run: `make_progress("auto"|"live"|"lines"|"none")`. The runner calls them from
its event callback (play, task, host result, a task's retry and loop item) and at start and finish.

A task that retries (`until`/`retries`, e.g. the vLLM launch's /health wait) is followed by `Waiting` (pure, the clock
passed in): what is waited for (`events.retry_subject`: a loop item's label and its head, or the host), attempt n/N,
elapsed, which answered;
the line display says so at most every `RETRY_EVERY_S`, the live panel in a row of its own."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from provisioner.reports import count
from provisioner.results import RunResult


class Progress(Protocol):
    def start(self, result: RunResult) -> None: ...

    def play(self, name: str, batch: int) -> None: ...

    def task(self, name: str, role: str | None, handler: bool) -> None: ...

    def host_event(self, host: str, kind: str, message: str | None = None) -> None: ...

    def retry(self, host: str, subject: str, attempt: int, attempts: int) -> None: ...

    def item_event(self, host: str, subject: str, kind: str) -> None: ...

    def finish(self, result: RunResult) -> None: ...


#: Longest silence of the line display while a task retries (seconds between its "waiting for" lines).
RETRY_EVERY_S = 15.0


def _secs(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s}s" if s < 120 else f"{s // 60}m{s % 60:02d}s"


@dataclass
class Waiting:
    """The retries of the current task, on the caller's clock: `start(now)` at each task, `retry(...)` per retry
    event (a line when one is due: at once for a subject waited for alone, e.g. a loop's next item, else at most one
    per `every` s), `done(...)` when an item or host finishes (a line when it had been waited for), `summary(now)`
    for a live panel."""

    every: float = RETRY_EVERY_S
    t0: float = 0.0
    last_done: float = 0.0
    last_said: float | None = None
    #: subject -> [since, attempt, attempts]
    pending: dict[str, list[Any]] = field(default_factory=dict)
    answered: list[str] = field(default_factory=list)
    gave_up: list[str] = field(default_factory=list)

    def start(self, now: float) -> None:
        self.t0 = self.last_done = now
        self.last_said = None
        self.pending, self.answered, self.gave_up = {}, [], []

    def retry(self, subject: str, attempt: int, attempts: int, now: float) -> str | None:
        new = subject not in self.pending
        st = self.pending.setdefault(subject, [self.last_done, attempt, attempts])
        st[1], st[2] = attempt, attempts
        alone = new and len(self.pending) == 1  # the next item of a loop: say at once what is waited for now
        if not alone and self.last_said is not None and now - self.last_said < self.every:
            return None
        self.last_said = now
        return self.line(subject, now)

    def line(self, subject: str, now: float) -> str:
        since, n, total = self.pending[subject]
        text = f"waiting for {subject}: attempt {n}/{total}, {_secs(now - since)} so far"
        others = [s for s in self.pending if s != subject]
        if others:
            text += f"; also waiting for {', '.join(others[:3])}" + (f" +{len(others) - 3}" if len(others) > 3 else "")
        if self.answered:
            text += f"; answered: {', '.join(self.answered[-5:])}"
        return text

    def done(self, subject: str, ok: bool, now: float) -> str | None:
        st = self.pending.pop(subject, None)
        self.last_done = now
        if st is None:
            if ok and self.last_said is not None:  # answered at once, while the task waits for others
                self.answered.append(subject)
            return None
        since, n, total = st
        if ok:
            self.answered.append(subject)
            return f"{subject} answered after {_secs(now - since)} (attempt {n}/{total})"
        self.gave_up.append(subject)
        return f"{subject} did not answer: gave up after {_secs(now - since)} ({total} attempts)"

    def summary(self, now: float) -> str | None:
        if not self.pending and not (self.answered or self.gave_up):
            return None
        parts = []
        for subject, (since, n, total) in list(self.pending.items())[:3]:
            parts.append(f"{subject} attempt {n}/{total}, {_secs(now - since)}")
        if len(self.pending) > 3:
            parts.append(f"+{len(self.pending) - 3} more")
        if self.answered:
            parts.append(f"answered: {', '.join(self.answered[-5:])}")
        if self.gave_up:
            parts.append(f"gave up: {', '.join(self.gave_up)}")
        return " · ".join(parts)


class NullProgress:
    def start(self, result: RunResult) -> None:
        pass

    def play(self, name: str, batch: int) -> None:
        pass

    def task(self, name: str, role: str | None, handler: bool) -> None:
        pass

    def host_event(self, host: str, kind: str, message: str | None = None) -> None:
        pass

    def retry(self, host: str, subject: str, attempt: int, attempts: int) -> None:
        pass

    def item_event(self, host: str, subject: str, kind: str) -> None:
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
    clock: Callable[[], float] = time.monotonic
    t0: float = field(default_factory=time.monotonic)
    waiting: Waiting = field(default_factory=Waiting)

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

    def __init__(self, stream: Any = None, clock: Callable[[], float] | None = None) -> None:
        super().__init__()
        self.stream = stream or sys.stderr
        if clock is not None:
            self.clock = clock
            self.t0 = clock()

    def _say(self, text: str) -> None:
        el = self.clock() - self.t0
        print(f"[{el:7.1f}s] {text}", file=self.stream, flush=True)

    def start(self, result: RunResult) -> None:
        self.result = result
        self.t0 = self.clock()
        mode = "check (drift)" if result.check else "apply"
        self._say(f"{result.command}: {count(len(result.targeted), 'host')}, forks {result.forks}, {mode}; "
                  f"run dir {result.run_dir}")

    def play(self, name: str, batch: int) -> None:
        self.play_name, self.batch = name, batch
        suffix = f" batch {batch}" if batch > 1 or (self.result and self.result.serial) else ""
        self._say(f"PLAY [{name}]{suffix}")

    def task(self, name: str, role: str | None, handler: bool) -> None:
        self.tasks += 1
        self.waiting.start(self.clock())
        kind = "HANDLER" if handler else "TASK"
        self._say(f"{kind} [{role + ' : ' if role else ''}{name}]")

    def host_event(self, host: str, kind: str, message: str | None = None) -> None:
        if host in self.waiting.pending:  # a task without a loop that retried on this host
            line = self.waiting.done(host, kind in ("ok", "changed"), self.clock())
            if line and kind in ("ok", "changed"):
                self._say(f"  {line}")
        if kind in ("failed", "unreachable"):
            msg = (message or "").splitlines()[0][:200] if message else ""
            self._say(f"  {kind.upper()}: {host}: {msg}")

    def retry(self, host: str, subject: str, attempt: int, attempts: int) -> None:
        line = self.waiting.retry(subject, attempt, attempts, self.clock())
        if line:
            self._say(f"  {line}")

    def item_event(self, host: str, subject: str, kind: str) -> None:
        line = self.waiting.done(subject, kind == "ok", self.clock())
        if line:
            self._say(f"  {line}")

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
        from rich.markup import escape
        from rich.table import Table

        t, reached, failed, unreach = self.counts()
        el = self.clock() - self.t0
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("play", escape(self.play_name) + (f"  [cyan]batch {self.batch}[/]" if self.batch > 1 or (
            self.result and self.result.serial) else ""))
        grid.add_row("task", f"{escape(self.task_name)}  ({count(len(self.task_done), 'host')} done)")
        grid.add_row("hosts", f"{t} targeted · {reached} reached · [red]{failed} failed[/] · "
                              f"[magenta]{unreach} unreachable[/]")
        waiting = self.waiting.summary(self.clock())
        if waiting:
            grid.add_row("waiting", escape(waiting))
        grid.add_row("elapsed", f"{el:.1f}s · {count(self.tasks, 'task')}")
        return grid

    def start(self, result: RunResult) -> None:
        from rich.live import Live
        from rich.markup import escape

        self.result = result
        self.t0 = self.clock()
        self.console.print(f"[bold]{result.command}[/]: {count(len(result.targeted), 'host')}, forks {result.forks}"
                           f"{', check mode' if result.check else ''}; run dir {escape(str(result.run_dir))}",
                           highlight=False)
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True,
                         get_renderable=self._render)
        self.live.start()

    def play(self, name: str, batch: int) -> None:
        from rich.markup import escape

        self.play_name, self.batch = name, batch
        if batch > 1 or (self.result and self.result.serial):
            self.console.print(f"PLAY {escape(f'[{name}]')} [cyan]batch {batch}[/]", highlight=False)

    def task(self, name: str, role: str | None, handler: bool) -> None:
        self.tasks += 1
        self.task_name = f"{role + ' : ' if role else ''}{name}"
        self.task_done = set()
        self.waiting.start(self.clock())

    def host_event(self, host: str, kind: str, message: str | None = None) -> None:
        self.task_done.add(host)
        if host in self.waiting.pending:
            self._waited(self.waiting.done(host, kind in ("ok", "changed"), self.clock()), kind in ("ok", "changed"))
        if kind in ("failed", "unreachable"):
            from rich.markup import escape

            msg = (message or "").splitlines()[0][:200] if message else ""
            self.console.print(f"  [red]{kind.upper()}[/]: {escape(f'{host} [{self.task_name}]: {msg}')}",
                               highlight=False)

    def retry(self, host: str, subject: str, attempt: int, attempts: int) -> None:
        self.waiting.retry(subject, attempt, attempts, self.clock())  # the panel's "waiting" row shows it

    def item_event(self, host: str, subject: str, kind: str) -> None:
        self._waited(self.waiting.done(subject, kind == "ok", self.clock()), kind == "ok")

    def _waited(self, line: str | None, ok: bool) -> None:
        """A wait that ended stays above the panel (answered in green, gave up in red)."""
        if line:
            from rich.markup import escape

            self.console.print(f"  [{'green' if ok else 'red'}]{escape(line)}[/]", highlight=False)

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

