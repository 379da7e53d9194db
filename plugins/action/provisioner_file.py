"""`provisioner_file`'s controller side: renders `src` (a template, found and rendered as ansible.builtin.template
does: trim_blocks, no lstrip_blocks, `\\n` line ends) into `content`, then runs the module once. No temporary
directory on the host and no file transfer: the content travels in the module's arguments (managed files are small).
"""

from __future__ import annotations

import os
from typing import Any

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template

#: ansible.builtin.template's defaults (the bytes must not change when a task moves from it to this module).
OVERRIDES = {"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"}


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
            args["content"] = self._render(str(src), task_vars)
        result.update(self._execute_module(module_name="provisioner.gpu.provisioner_file", module_args=args,
                                           task_vars=task_vars))
        return result

    def _render(self, src: str, task_vars: dict[str, Any]) -> str:
        try:
            source = self._find_needle("templates", src)
        except AnsibleError as exc:
            raise AnsibleActionFail(str(exc)) from None
        with open(source, encoding="utf-8") as f:
            data = trust_as_template(f.read())
        searchpath = []
        for p in [*task_vars.get("ansible_search_path", []), os.path.dirname(source)]:
            searchpath += [os.path.join(p, "templates"), p]
        templar = self._templar.copy_with_new_env(searchpath=searchpath, available_variables=task_vars)
        out = templar.template(data, escape_backslashes=False, overrides=OVERRIDES)
        return "" if out is None else str(out)
