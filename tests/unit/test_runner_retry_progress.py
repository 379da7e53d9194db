"""Progress of a retrying task (the vLLM launch's /health wait): `retry_subject` on recorded events, `Waiting` and
the line display on a fake clock (one line per 15 s at most, naming the cluster, its head and attempt n/N, elapsed,
which answered), and the live panel's row. The events are a real ansible-runner run of
tests/fixtures/runner/retry.yml (record.py retry): vllm_pp answers on its 2nd attempt, vllm_single never."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from provisioner.results import RunResult
from provisioner.runner import EventFolder, LineProgress, LiveProgress, NullProgress
from provisioner.runner.events import retry_subject
from provisioner.runner.progress import Waiting

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runner"


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _events() -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (FIXTURES / "retry.jsonl").read_text().splitlines()]


def _result() -> RunResult:
    return RunResult(command="run", inventory="hosts.ini", playbook="retry.yml", run_dir="run", artifact_dir="art",
                     started=0.0, check=False, targeted=["alpha", "beta", "gamma"])


class Recorder(NullProgress):
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def retry(self, host: str, subject: str, attempt: int, attempts: int) -> None:
        self.calls.append(("retry", host, subject, attempt, attempts))

    def item_event(self, host: str, subject: str, kind: str) -> None:
        self.calls.append(("item", host, subject, kind))


def test_recorded_retries_reach_the_display_naming_cluster_head_and_attempt() -> None:
    rec = Recorder()
    folder = EventFolder(_result(), rec)
    for ev in _events():
        folder(ev)
    assert rec.calls == [
        ("retry", "alpha", "vllm_pp (head beta)", 2, 4),
        ("item", "alpha", "vllm_pp (head beta)", "ok"),
        ("retry", "alpha", "vllm_single (head gamma)", 2, 4),
        ("retry", "alpha", "vllm_single (head gamma)", 3, 4),
        ("retry", "alpha", "vllm_single (head gamma)", 4, 4),
        ("item", "alpha", "vllm_single (head gamma)", "failed"),
    ]


def test_retry_subject_never_shows_more_than_a_label() -> None:
    assert retry_subject("n1", {"attempts": 2, "retries": 5}) == "n1"  # no loop: the host
    assert retry_subject("n1", {"censored": "hidden", "_ansible_item_label": "x"}) == "n1"
    assert retry_subject("n1", {"_ansible_no_log": True, "_ansible_item_label": "x"}) == "n1"
    assert retry_subject("n1", {"item": {"token": "s3cret"}}) == "n1"  # a whole item is not a name
    assert retry_subject("n1", {"_ansible_item_label": "vllm_a", "item": {"name": "vllm_a", "head": "n1"}}) == (
        "vllm_a (head n1)")


def test_waiting_lines_are_rate_limited_and_say_what_answered() -> None:
    w = Waiting(every=15.0)
    w.start(0.0)
    first = w.retry("vllm_pp (head node01)", 2, 240, 5.0)
    assert first == "waiting for vllm_pp (head node01): attempt 2/240, 5s so far"  # the first at once
    said = [t for t in range(6, 60) if w.retry("vllm_pp (head node01)", 2 + t // 5, 240, float(t))]
    assert said == [20, 35, 50]  # then at most one per 15 s
    # hosts retrying side by side (a task without a loop) share the limit: no line per host
    assert w.retry("node07", 2, 10, 51.0) is None and w.retry("node08", 2, 10, 52.0) is None
    assert w.line("node08", 52.0).endswith("; also waiting for vllm_pp (head node01), node07")
    w.pending.pop("node07"), w.pending.pop("node08")
    assert w.done("vllm_pp (head node01)", True, 154.0) == "vllm_pp (head node01) answered after 2m34s (attempt 13/240)"
    # the next cluster's time counts from when the previous one answered
    assert w.retry("vllm_single (head node03)", 2, 240, 160.0) == (
        "waiting for vllm_single (head node03): attempt 2/240, 6s so far; answered: vllm_pp (head node01)")
    assert w.summary(170.0) == ("vllm_single (head node03) attempt 2/240, 16s · answered: vllm_pp (head node01)")
    assert w.done("vllm_single (head node03)", False, 200.0) == (
        "vllm_single (head node03) did not answer: gave up after 46s (240 attempts)")
    assert w.done("never waited", True, 201.0) is None
    w.start(300.0)
    assert w.summary(300.0) is None and w.pending == {}


def test_line_display_on_the_recorded_run() -> None:
    clock, out = Clock(), io.StringIO()
    p = LineProgress(stream=out, clock=clock)
    folder = EventFolder(_result(), p)
    p.start(_result())
    for ev in _events():
        clock.t += 2.0 if ev["event"] in ("runner_retry", "runner_item_on_ok", "runner_item_on_failed") else 0.0
        folder(ev)
    lines = [ln.split("] ", 1)[1] for ln in out.getvalue().splitlines()]
    waits = [ln.strip() for ln in lines if ln.startswith("  ")]
    assert waits[:4] == ["waiting for vllm_pp (head beta): attempt 2/4, 2s so far",
                         "vllm_pp (head beta) answered after 4s (attempt 2/4)",
                         # the loop's next cluster is said at once; its further retries within 15 s are not
                         "waiting for vllm_single (head gamma): attempt 2/4, 2s so far; answered: vllm_pp (head beta)",
                         "vllm_single (head gamma) did not answer: gave up after 8s (4 attempts)"]
    assert waits[4].startswith("FAILED: alpha: ") and len(waits) == 5


def test_live_panel_has_a_waiting_row() -> None:
    from rich.console import Console

    clock = Clock()
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    p = LiveProgress(console=console)
    p.clock, p.t0 = clock, clock.t
    p.result = _result()
    p.task("Wait for those clusters to answer /health", "vllm_launch", False)
    p.retry("node01", "vllm_pp (head node01)", 3, 240)
    clock.t += 40
    console.print(p._render())
    p.item_event("node01", "vllm_pp (head node01)", "ok")
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "waiting vllm_pp (head node01) attempt 3/240, 40s" in text and "elapsed 40.0s" in text
    assert "vllm_pp (head node01) answered after 40s (attempt 3/240)" in text
