"""`provisioner_plan`: the fleet plan (provisioner.plan.compute, the function behind `provision render|plan`),
computed once per run on the controller from the play's own inventory, after the validation rules of
`provision validate`. roles/provisioner_plan runs it once and hands the result to every host:

    - provisioner.gpu.provisioner_plan:
        validate: true          # run the rules first; errors fail the task, warnings are shown
      register: provisioner_plan_result
      run_once: true

The Fleet comes from what Ansible resolved, through public interfaces only: `groups` and each host's variables
(`hostvars.raw_get`: inventory, group_vars/host_vars, -e on top, in Ansible's own precedence). The inventory file is
never read again. As `provision run`, an error on a host outside the play (--limit) is only a warning. Not run here:
FLAG003 (vLLM's own parser; the vllm role checks each command line on the node). Needs the `provisioner` package
importable by the controller's Python.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
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
        args = dict(self._task.args)
        unknown = sorted(set(args) - {"validate"})
        if unknown:
            raise AnsibleActionFail(f"provisioner_plan: unknown option(s) {', '.join(unknown)} (known: validate)")
        validate = boolean(args.get("validate", True), strict=True)
        try:
            from provisioner.plan import compute, fleet_from_vars
            from provisioner.rules import split_findings
            from provisioner.rules.result import validate as run_rules
        except ImportError as exc:
            raise AnsibleActionFail(
                f"the provisioner Python package is not importable by the controller's Python ({exc}): install the "
                "suite (pip install .) or run ansible-playbook from its virtual environment") from None

        tv = task_vars or {}
        hostvars, groups = tv.get("hostvars"), tv.get("groups")
        if hostvars is None or not isinstance(groups, dict):
            raise AnsibleActionFail("provisioner_plan needs the play's hostvars and groups (run it as a play's task)")
        names = list(groups.get("all") or [])
        sources = tv.get("ansible_inventory_sources") or []
        fleet = fleet_from_vars({h: hostvars.raw_get(h) for h in names}, groups,
                                source=sources[0] if sources else "")
        errors: list[Any] = []
        warnings: list[Any] = []
        if validate:
            res = run_rules(fleet)
            play_hosts = tv.get("ansible_play_hosts_all")
            errors, warnings = split_findings(res.findings,
                                              None if play_hosts is None else [str(h) for h in play_hosts])
            for w in warnings:
                display.warning(w.line())
        result.update(changed=False, hosts=len(fleet.hosts), clusters=sorted(fleet.clusters),
                      errors=[f.as_dict() for f in errors], validation_warnings=[f.as_dict() for f in warnings])
        if errors:
            result["failed"] = True
            result["msg"] = "\n".join([
                f"{len(errors)} validation error(s) in the inventory ({len(warnings)} warning(s)):",
                *(f.line() for f in errors),
            ])
            try:  # for validate_ignore_assert_errors (report and carry on): the plan where it can still be made
                result["plan"] = compute(fleet)
            except Exception:  # noqa: BLE001 - an invalid fleet has no plan; the errors above say why
                pass
            return result
        try:
            result["plan"] = compute(fleet)
        except Exception as exc:  # noqa: BLE001 - an inventory the rules would refuse (they were not run here)
            raise AnsibleActionFail(f"the fleet plan cannot be computed ({type(exc).__name__}: {exc}): the inventory "
                                    "does not pass the rules; run `provision validate INVENTORY` or playbooks/"
                                    "validate.yml") from None
        result["msg"] = (f"plan: {len(fleet.hosts)} hosts, {len(fleet.clusters)} vLLM cluster(s)"
                         + (f", {len(warnings)} warning(s)" if validate else " (rules not run here)"))
        return result
