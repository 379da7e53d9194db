"""`provisioner_file`'s controller side: renders `src` (a template, found and rendered as ansible.builtin.template
does) into `content`, then runs the module once. No temporary directory on the host and no file transfer: the
content travels in the module's arguments (managed files are small).
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.provisioner.gpu.plugins.plugin_utils.render import render


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        src = args.get("src")
        if (src is None) == (args.get("content") is None):
            raise AnsibleActionFail("provisioner_file: give one of src (a template) or content")
        if src is not None:
            args["content"] = render(self, str(src), task_vars)
        result.update(self._execute_module(module_name="provisioner.gpu.provisioner_file", module_args=args,
                                           task_vars=task_vars))
        return result
