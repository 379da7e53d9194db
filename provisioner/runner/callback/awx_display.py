"""ansible-runner's `awx_display` event callback, plus the host's path on changed file results.

ansible-runner always runs its stdout callback `awx_display`, from the directory AWX_LIB_DIRECTORY names
(`RunConfig.ansible_env` points it here). This one is ansible-runner's own, with one addition made before the event
is written: a changed `copy`/`template`/`file`... result that does not name the path it manages (check mode: only a
diff, whose one header is the controller's source when the destination does not exist yet) gets it from the task's
templated arguments (`provisioner.runner.events.host_path`), so a drift item names `/usr/local/libexec/...` on the
host, never `roles/vllm/files/...` on the controller.
"""

from __future__ import annotations

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


class CallbackModule(_runner.CallbackModule):
    CALLBACK_NAME = "awx_display"

    def v2_runner_on_ok(self, result: Any) -> None:
        _name_host_path(result)
        super().v2_runner_on_ok(result)
