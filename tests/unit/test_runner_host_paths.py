"""Drift items name the path on the host, never the controller's source (issue 28, item 5), and live progress shows
a task once per start, not once per host (item 10). Synthetic events in the shape ansible-runner writes them
(check + diff mode: a `copy` from `src:` to a destination that does not exist yet returns only a diff whose one
header is the controller's source, tests/fixtures/runner has the recorded shapes)."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from provisioner.reports import drift_text
from provisioner.results import RunResult
from provisioner.runner import EventFolder, NullProgress
from provisioner.runner.config import RunConfig
from provisioner.runner.events import host_path, name_host_path
from provisioner.runner.progress import LineProgress

SRC = "/tmp/tmpab12/project/roles/vllm/files/vllm-argcheck"
DEST = "/usr/local/libexec/provisioner/vllm-argcheck"
# what ansible-core's copy action returns in check mode for a missing destination (no `dest` key)
CHECK_COPY_MISSING = {"changed": True, "diff": [{"before": "", "after_header": SRC, "after": "#!/usr/bin/python3\n"}]}
CHECK_TEMPLATE_MISSING = {"changed": True, "diff": [
    {"before": "", "after_header": "/root/.ansible/tmp/ansible-local-1x/tmpq/vllm.env.j2", "after": "A=1\n"}]}


def _ok(host: str, task: str, action: str, res: dict[str, Any], uuid: str = "t1") -> dict[str, Any]:
    return {"event": "runner_on_ok", "event_data": {"host": host, "task": task, "task_action": action,
                                                   "resolved_action": f"ansible.builtin.{action}", "res": res,
                                                   "role": "vllm", "play": "vLLM", "task_uuid": uuid}}


def _fold(events: list[dict[str, Any]], progress: Any = None) -> RunResult:
    r = RunResult(command="drift", inventory="rack.ini", playbook="site.yml", run_dir="/runs/x", artifact_dir="a",
                  started=0.0, check=True, targeted=["node01"])
    folder = EventFolder(r, progress or NullProgress())
    for ev in events:
        folder(ev)
    folder.finish(["node01"])
    return r


def test_callback_names_the_destination_the_task_was_given() -> None:
    """What the runner's event callback (runner/callback/awx_display.py, not imported here: importing it hooks
    ansible's Display) does to a result before the event is written: the templated `dest` added."""
    res = dict(CHECK_COPY_MISSING)
    task = SimpleNamespace(action="ansible.builtin.copy", resolved_action="ansible.builtin.copy",
                           args={"src": "vllm-argcheck", "dest": DEST, "mode": "0755"})
    name_host_path(SimpleNamespace(_task=task, _result=res))
    assert res["dest"] == DEST
    callback = (Path(__file__).resolve().parents[2] / "provisioner/runner/callback/awx_display.py").read_text()
    assert "name_host_path(result)" in callback and "super().v2_runner_on_ok(result)" in callback


@pytest.mark.parametrize(("action", "args", "res", "expected"), [
    ("ansible.builtin.copy", {"src": "x", "dest": DEST}, CHECK_COPY_MISSING, ("dest", DEST)),
    ("template", {"src": "vllm.env.j2", "dest": "/etc/vllm/vllm.env"}, CHECK_TEMPLATE_MISSING,
     ("dest", "/etc/vllm/vllm.env")),
    ("ansible.builtin.file", {"path": "/usr/local/libexec/provisioner", "state": "directory"}, {"changed": True},
     ("path", "/usr/local/libexec/provisioner")),
    ("copy", {"dest": DEST}, {"changed": True, "dest": DEST}, None),  # names it already
    ("copy", {"dest": DEST}, {"changed": False}, None),
    ("copy", {"dest": DEST}, {"changed": True, "_ansible_no_log": True}, None),
    ("command", {"argv": ["/bin/true"]}, {"changed": True}, None),
])
def test_host_path(action: str, args: dict[str, Any], res: dict[str, Any], expected: Any) -> None:
    assert host_path(action, args, res) == expected


def test_drift_item_names_the_host_path_from_the_event() -> None:
    r = _fold([_ok("node01", "Command-line checker", "copy", dict(CHECK_COPY_MISSING, dest=DEST))])
    (item,) = r.hosts["node01"].drift
    assert (item.kind, item.resource) == ("file", DEST)
    assert f"before: {DEST}" in (item.diff or "") and SRC not in (item.diff or "")
    text = drift_text.render(r)
    assert f"file     {DEST}" in text and SRC not in text


@pytest.mark.parametrize("res", [CHECK_COPY_MISSING, CHECK_TEMPLATE_MISSING])
def test_drift_item_never_names_a_controller_path(res: dict[str, Any]) -> None:
    """Without the callback's addition (a result recorded elsewhere), a controller source is never the resource."""
    r = _fold([_ok("node01", "Command-line checker", "copy", res)])
    (item,) = r.hosts["node01"].drift
    assert "/roles/" not in item.resource and "/.ansible/tmp/" not in item.resource
    assert item.resource == "Command-line checker"


def test_run_environment_points_ansible_runner_at_our_callback(tmp_path: Any) -> None:
    env = RunConfig(inventory=Path("rack.ini")).ansible_env(tmp_path)
    assert (Path(env["AWX_LIB_DIRECTORY"]) / "awx_display.py").is_file()


def _start(uuid: str, name: str, handler: bool = False) -> dict[str, Any]:
    return {"event": "playbook_on_handler_task_start" if handler else "playbook_on_task_start",
            "event_data": {"task": name, "role": "nvidia_driver", "task_uuid": uuid}}


def test_a_meta_task_started_once_per_host_is_shown_once() -> None:
    """`meta: flush_handlers` sends one task start per host: live progress prints it once per task."""
    out = io.StringIO()
    play = {"event": "playbook_on_play_start", "event_data": {"name": "GPU stack", "play_uuid": "p1"}}
    flush = "Reboot now if the kernel module changed (provision_allow_reboot)"
    events = [play, _start("a", "Install the driver"), *[_start("m", flush) for _ in range(4)],
              _start("h", "Reboot", handler=True), _start("b", "Next task"),
              {"event": "playbook_on_play_start", "event_data": {"name": "GPU stack", "play_uuid": "p1"}},
              _start("m", flush)]  # the next serial batch runs it again: shown again
    _fold(events, LineProgress(out))
    lines = out.getvalue().splitlines()
    assert sum(flush in ln for ln in lines) == 2, lines
    assert [ln.split("] ", 1)[1] for ln in lines if "TASK [" in ln or "HANDLER [" in ln] == [
        "TASK [nvidia_driver : Install the driver]", f"TASK [nvidia_driver : {flush}]",
        "HANDLER [nvidia_driver : Reboot]", "TASK [nvidia_driver : Next task]", f"TASK [nvidia_driver : {flush}]"]
