"""Event folding on recorded events: two real ansible-runner runs of tests/fixtures/runner/site.yml (record.py
re-records them), replayed through `EventFolder` without Ansible."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from provisioner.results import RunResult
from provisioner.runner import EventFolder, NullProgress

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runner"
HOSTS = ["alpha", "beta", "gamma", "gone"]


class Recorder(NullProgress):
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def play(self, name: str, batch: int) -> None:
        self.calls.append(("play", name, str(batch)))

    def task(self, name: str, role: str | None, handler: bool) -> None:
        self.calls.append(("handler" if handler else "task", name))

    def host_event(self, host: str, kind: str, message: str | None = None) -> None:
        self.calls.append((kind, host))


def replay(name: str, check: bool) -> tuple[RunResult, Recorder, list[dict[str, Any]]]:
    events = [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]
    result = RunResult(command=name, inventory="hosts.ini", playbook="site.yml", run_dir="run", artifact_dir="art",
                       started=0.0, check=check, targeted=list(HOSTS))
    seen: list[dict[str, Any]] = []
    progress = Recorder()
    folder = EventFolder(result, progress, on_event=seen.append)
    for ev in events:
        assert folder(ev) is True  # every event stays in the artifacts
    folder.finish(HOSTS)
    assert len(seen) == len(events)
    return result, progress, events


def test_apply_run_folds_counts_batches_failures_and_rescues() -> None:
    r, progress, _ = replay("apply", check=False)
    # serial 2: two batches of the one play, each host in the batch it ran in
    assert [(b["batch"], sorted(b["hosts"])) for b in r.batches] == [(1, ["alpha", "beta"]), (2, ["gamma", "gone"])]
    assert {n: h.batch for n, h in r.hosts.items()} == {"alpha": 1, "beta": 1, "gamma": 2, "gone": 2}
    assert {n: h.state for n, h in r.hosts.items()} == {
        "alpha": "changed", "beta": "failed", "gamma": "changed", "gone": "unreachable"}
    # the recap is authoritative: the failure inside a rescued block is not a failure, the ignored one neither
    alpha = r.hosts["alpha"]
    assert (alpha.failed, alpha.rescued, alpha.ignored, alpha.skipped) == (0, 1, 1, 2)
    assert alpha.failures == []
    (failure,) = r.hosts["beta"].failures
    assert (failure.task, failure.message, failure.action, failure.play) == (
        "Break on request", "disk full on beta", "fail", "Tiny site")
    assert "Connection refused" in (r.hosts["gone"].unreachable_message or "")
    assert r.failed_hosts == ["beta"] and r.unreachable_hosts == ["gone"] and not r.succeeded
    assert sorted(r.retry_hosts) == ["beta", "gone"]
    assert not any(h.drift for h in r.hosts.values())  # not check mode: changes are not drift
    # the display saw both batches, the handler, and each failure as it happened
    assert [c for c in progress.calls if c[0] == "play"] == [("play", "Tiny site", "1"), ("play", "Tiny site", "2")]
    assert ("handler", "Restart the consumer") in progress.calls
    assert ("failed", "beta") in progress.calls and ("unreachable", "gone") in progress.calls
    assert ("ignored", "alpha") in progress.calls


def test_check_run_reports_the_drifted_file_only() -> None:
    r, _, events = replay("check", check=True)
    alpha = r.hosts["alpha"]
    (item,) = alpha.drift
    assert (item.kind, item.task, item.action) == ("file", "Render nccl.conf", "copy")
    assert item.resource.endswith("/hosts/alpha/nccl.conf")
    assert item.diff is not None and "-drifted\n+NCCL_IB_HCA=mlx5_0\n" in item.diff
    assert [n for n, h in r.hosts.items() if h.drift] == ["alpha"]
    assert r.drift == alpha.drift
    assert {n: h.state for n, h in r.hosts.items()} == {
        "alpha": "changed", "beta": "ok", "gamma": "ok", "gone": "unreachable"}
    # the no_log task's result stays censored in the events as recorded
    censored = [e for e in events if (e["event_data"].get("task") == "Write the token file"
                                      and e["event"].startswith("runner_on_ok"))]
    assert censored and all(e["event_data"]["res"].get("censored") for e in censored)


def test_a_broken_event_never_stops_the_fold() -> None:
    result = RunResult(command="run", inventory="i", playbook="p", run_dir="r", artifact_dir="a", started=0.0,
                       targeted=["alpha"])
    folder = EventFolder(result, NullProgress())
    assert folder({"event": "runner_on_ok", "event_data": {}}) is True  # no host: reported on stderr, not raised
    assert folder({"event": "runner_on_ok", "event_data": {"host": "alpha", "res": {"changed": True}}}) is True
    assert result.hosts["alpha"].changed == 1
