"""ansible-runner's `awx_display` event callback, plus the host's path on changed file results.

ansible-runner always runs its stdout callback `awx_display`, from the directory AWX_LIB_DIRECTORY names
(`RunConfig.ansible_env` points it here). This one is ansible-runner's own, with one addition made before the event
is written: a changed `copy`/`template`/`file`... result that does not name the path it manages (check mode: only a
diff, whose one header is the controller's source when the destination does not exist yet) gets it from the task's
templated arguments (`provisioner.runner.events.host_path`), so a drift item names `/usr/local/libexec/...` on the
host, never `roles/vllm/files/...` on the controller. It also makes the forked workers cheaper
(provisioner/runner/forkcost.py: the garbage collector frozen at each play start, each task's templates compiled
before its workers fork, AnsiballZ payloads kept between runs).
"""

from __future__ import annotations

import os
from typing import Any

from ansible_runner.display_callback.callback import awx_display as _runner

DOCUMENTATION = """
    callback: awx_display
    short_description: ansible-runner's event dispatcher, naming the host's path of changed file results
    version_added: "2.0"
    description:
        - ansible-runner's awx_display callback (events for ansible-runner), with the destination added to changed
          file results that do not name it.
    type: stdout
    extends_documentation_fragment:
      - default_callback
    requirements:
      - Set as stdout in config
"""


def _name_host_path(result: Any) -> None:
    try:
        from provisioner.runner.events import name_host_path

        name_host_path(result)
    except Exception:  # never let a display addition break the run
        pass


def _forkcost(step: str, obj: Any = None) -> None:
    """forkcost's `step` (restore, freeze, warm, save); a speed-up only, so never an error that breaks the run."""
    if os.environ.get("PROVISION_FORKCOST") == "0":
        return
    memo = os.environ.get("PROVISION_FORKCOST_MEMO") != "0"
    try:
        from provisioner.runner import forkcost

        if step == "warm":
            if memo:
                forkcost.warm(obj)
            return
        if step == "freeze":  # at a play start, before its first worker
            try:
                if memo and forkcost.memoize():
                    forkcost.warm_plugins()
                    forkcost.warm_play(obj)
            finally:
                forkcost.freeze()
            return
        store = forkcost.store_dir()
        if store is None:
            return
        if step == "restore":
            forkcost.restore(store, forkcost.local_dir())
        else:
            forkcost.save(forkcost.local_dir(), store)
    except Exception:
        pass


class CallbackModule(_runner.CallbackModule):
    CALLBACK_NAME = "awx_display"

    def __init__(self) -> None:
        super().__init__()
        _forkcost("restore")

    def v2_runner_on_start(self, host: Any, task: Any) -> None:
        # The start time only (the result events' duration): no runner_on_start event per host and task. Nothing of
        # provision reads them, and each costs the main process an event dump and the runner its parse.
        from ansible_runner.display_callback.callback.awx_display import current_time

        self._host_start[host.get_name()] = current_time()

    def v2_playbook_on_play_start(self, play: Any) -> None:
        super().v2_playbook_on_play_start(play)
        _forkcost("freeze", play)

    def v2_playbook_on_task_start(self, task: Any, is_conditional: Any) -> None:
        super().v2_playbook_on_task_start(task, is_conditional)
        _forkcost("warm", task)

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        super().v2_playbook_on_handler_task_start(task)
        _forkcost("warm", task)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        super().v2_playbook_on_stats(stats)
        _forkcost("save")

    def v2_runner_on_ok(self, result: Any) -> None:
        _name_host_path(result)
        super().v2_runner_on_ok(result)
