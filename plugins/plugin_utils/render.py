"""Render a role's template on the controller for the collection's action plugins (provisioner_file, provisioner_apt),
as ansible.builtin.template does (found under the role's `templates/`, trim_blocks, no lstrip_blocks, `\\n`), with the
task's variables as they are: no per-call deep copy of every variable, which `lookup('template')` makes.
"""

from __future__ import annotations

import os
from typing import Any

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.template import trust_as_template

#: ansible.builtin.template's defaults (the bytes must not change when a task moves from it to these modules).
OVERRIDES = {"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"}


def render(action: Any, src: str, task_vars: dict[str, Any]) -> str:
    """`src` rendered for this host; `action` is the calling action plugin (its template search and Templar)."""
    try:
        source = action._find_needle("templates", src)
    except AnsibleError as exc:
        raise AnsibleActionFail(str(exc)) from None
    with open(source, encoding="utf-8") as f:
        data = trust_as_template(f.read())
    searchpath = []
    for p in [*task_vars.get("ansible_search_path", []), os.path.dirname(source)]:
        searchpath += [os.path.join(p, "templates"), p]
    templar = action._templar.copy_with_new_env(searchpath=searchpath, available_variables=task_vars)
    out = templar.template(data, escape_backslashes=False, overrides=OVERRIDES)
    return "" if out is None else str(out)
