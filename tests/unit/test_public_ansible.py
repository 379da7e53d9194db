"""The suite reads Ansible only through public interfaces (shared/design.md): no `_`-prefixed attribute of an Ansible
object in the package or the plugins, no role task calling a filter that rebuilds the Fleet, and ansible-core's
internal data tagging read in one place only (provisioner/inventory/origin.py, until ansible-core makes it public), its template
compilation wrapped in one other (provisioner/runner/forkcost.py: a speed-up gated to the checked ansible-core series)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*ROOT.glob("provisioner/**/*.py"), *ROOT.glob("plugins/**/*.py")])
# attributes of ansible-core objects the suite used to read (HostVars, InventoryManager, VariableManager,
# AnsibleError, the INI inventory plugin) and any `._x` on a name that holds one
PRIVATE = re.compile(r"\b(hostvars|inv|inventory|vm|variable_manager|loader|exc|e|plugin|task_vars)\._[a-z]\w*"
                     r"|\._(inventory|variable_manager|loader|sources|fact_cache|extra_vars|message|origin)\b"
                     r"|getattr\([^)]*[\"']_(message|inventory|loader|sources|origin)[\"']")


def test_no_private_ansible_attribute_is_read() -> None:
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in SOURCES
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if PRIVATE.search(line)]
    assert not hits, "\n".join(hits)


def test_internal_data_tagging_is_read_in_one_place() -> None:
    users = sorted(str(p.relative_to(ROOT)) for p in SOURCES if "ansible._internal" in p.read_text(encoding="utf-8"))
    assert users == ["provisioner/inventory/origin.py", "provisioner/runner/forkcost.py"], users


def test_no_role_task_rebuilds_the_fleet() -> None:
    """Roles read `provisioner_plan`; the only Python they call is pure data in, data out."""
    pure = {"provisioner_vllm_launch", "provisioner_vllm_gate", "provisioner_vllm_gate_hosts", "provisioner_apt",
            "provisioner_plan", "provisioner_file", "provisioner_addresses", "provisioner_signing_key",
            "provisioner_probe_launch", "provisioner_probe_servers"}
    calls: set[str] = set()
    for f in ROOT.glob("roles/**/*.yml"):
        calls |= set(re.findall(r"provisioner\.gpu\.(\w+)", f.read_text(encoding="utf-8")))
    assert calls and calls <= pure, sorted(calls - pure)
    filters = {p.stem for p in (ROOT / "plugins/filter").glob("*.py")}
    for f in filters:
        text = (ROOT / "plugins/filter" / f"{f}.py").read_text(encoding="utf-8")
        assert "fleet_from" not in text and "load_fleet" not in text, f
    # the plan role runs the plan action once per run: guarded, tagged always
    (task, hand) = yaml.safe_load((ROOT / "roles/provisioner_plan/tasks/main.yml").read_text())
    assert task["run_once"] and task["when"] == "provisioner_plan is not defined" and "always" in task["tags"]
    assert hand["ansible.builtin.set_fact"] == {"provisioner_plan": "{{ provisioner_plan_result.plan }}"}
    assert task["when"] in hand["when"]
