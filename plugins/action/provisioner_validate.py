"""`provisioner_validate`: the suite's validation rules (provisioner.rules, the code behind `provision validate`) run
on the play's own inventory, on the controller. playbooks/validate.yml calls it once per play:

    - name: Validate the inventory (the rules of `provision validate`)
      provisioner_validate:
      run_once: true

The fleet is the play's inventory as Ansible resolved it (`hostvars`: any inventory source, the `-e` extra vars on
top; provisioner.inventory.fleet_from_play), never the inventory file read again. Each error finding is one line of
the failure message (code, group/host, variable: what to fix; the same line `provision run` prints) and one item of
`errors` in the result; warnings are shown as Ansible warnings and never fail the task. As `provision run`, an
error on a host outside the play (`--limit`) is only a warning. Not run here: FLAG003 (vLLM's
own parser on the controller: `provision validate --vllm-parser on`; the vllm role checks each host's command line
with the node's vLLM before any unit is written).

No options. Needs the `provisioner` package importable by the controller's Python (`pip install` the suite, or run
from its virtual environment).
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        if self._task.args:
            raise AnsibleActionFail(f"provisioner_validate takes no options (got {', '.join(map(str, self._task.args))})")
        try:
            from provisioner.inventory import fleet_from_play
            from provisioner.rules import split_findings
            from provisioner.rules.result import validate
        except ImportError as exc:
            raise AnsibleActionFail(
                f"the provisioner Python package is not importable by the controller's Python ({exc}): install the "
                "suite (pip install .) or run ansible-playbook from its virtual environment") from None

        hostvars = (task_vars or {}).get("hostvars")
        if hostvars is None or not hasattr(hostvars, "_inventory"):
            raise AnsibleActionFail("provisioner_validate needs the play's hostvars (run it as a task of a play)")
        res = validate(fleet_from_play(hostvars))
        # as `provision run`: an error on a host outside the play (--limit) is a warning for this run
        play_hosts = (task_vars or {}).get("ansible_play_hosts_all")
        errors, warnings = split_findings(res.findings, None if play_hosts is None else [str(h) for h in play_hosts])
        for w in warnings:
            display.warning(w.line())
        result.update(
            changed=False,
            hosts=res.hosts,
            clusters=[c.as_json() for c in res.clusters],
            errors=[f.as_dict() for f in errors],
            validation_warnings=[f.as_dict() for f in warnings],
        )
        if errors:
            result["failed"] = True
            result["msg"] = "\n".join([
                f"{len(errors)} validation error(s) in the inventory ({len(warnings)} warning(s)):",
                *(f.line() for f in errors),
            ])
        else:
            result["msg"] = (f"inventory valid: {res.hosts} hosts, {len(res.clusters)} vLLM cluster(s), "
                             f"{len(warnings)} warning(s)")
        return result
