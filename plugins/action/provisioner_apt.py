"""`provisioner_apt`'s controller side: `pin_src` (a template of the role, rendered as ansible.builtin.template does)
becomes the module's `pin_content`; then the module runs once. Cheaper than `pin_content: "{{ lookup('template',
...) }}"`, whose lookup deep-copies every variable of the host in each forked worker.
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
        src = args.pop("pin_src", None)
        if src is not None:
            if args.get("pin_content") is not None:
                raise AnsibleActionFail("provisioner_apt: give one of pin_src (a template) or pin_content")
            args["pin_content"] = render(self, str(src), task_vars)
        result.update(self._execute_module(module_name="provisioner.gpu.provisioner_apt", module_args=args,
                                           task_vars=task_vars))
        return result
