"""The fleet plan is computed once per run and is the same in the play, in `provision plan` and in `provision render`.

Real ansible-playbook runs of playbooks/validate.yml (the provisioner_plan role) with a play that shows the plan
each host was handed, kept per host by ansible-core's tree callback; no host is contacted (the plan is computed on
the controller, `debug` runs there). `provision plan` runs in this process (tests/support/cli_inproc.py: its
process behaviour is test_cli_process.py's). Every example inventory and a generated testbed rack inventory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_inproc import provision

from provisioner import PLAYBOOKS, PROJECT_ROOT
from provisioner.inventory import load_fleet
from provisioner_testbed import inventory_writer as invw

BIN = Path(sys.executable).parent
INVENTORIES = PROJECT_ROOT / "inventories"
# the committed examples (inventories/testbed-* are written by the rack tests while they run: not inputs here)
EXAMPLES = ["rack-a.ini", "b200-rack/hosts.ini", "gb200-nvl72/hosts.ini", "p5-pair/hosts.ini"]

# Counts provisioner.plan.compute calls in every process of the run (the controller and its forked workers).
COUNTER = """
import os
import provisioner.plan as _plan
_compute = _plan.compute
def _counted(fleet):
    with open(os.environ["PLAN_COUNT_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    return _compute(fleet)
_plan.compute = _counted
"""

PLAYS = """
- name: Validate and plan (site.yml's first play)
  ansible.builtin.import_playbook: {validate}
- name: A later play whose roles depend on the plan role (it finds the plan and skips)
  hosts: gpu_nodes
  gather_facts: false
  roles:
    - role: provisioner_plan
- name: Every host's plan, as the hosts were handed it (the tree callback keeps each host's last result)
  hosts: all
  gather_facts: false
  tasks:
    - name: Show it
      ansible.builtin.debug:
        var: provisioner_plan
"""


def _inventories(tmp_path: Path) -> list[Path]:
    """The examples and the inventory `provision testbed up` writes for a 4-node rack (its clusters declared)."""
    hosts = tuple(invw.InvHost(name=f"node{i:02d}", address=f"198.18.0.{10 + i}") for i in range(1, 5))
    rack = invw.InvRack(name="rack", hosts=hosts, key_file="/k/id_ed25519", known_hosts="/k/known_hosts",
                        repo_url="http://198.18.0.1:8090/nvidia/", proxy_url="http://198.18.0.1:3128")
    return [INVENTORIES / e for e in EXAMPLES] + [invw.write(rack, tmp_path / "testbed")]


def _play(inv: Path, tmp_path: Path, *extra: str) -> tuple[dict[str, Any], int, str]:
    pb = tmp_path / "dump.yml"
    pb.write_text(PLAYS.format(validate=PLAYBOOKS / "validate.yml"))
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(COUNTER)
    out, count = tmp_path / "tree", tmp_path / "count"
    shutil.rmtree(out, ignore_errors=True)
    count.unlink(missing_ok=True)
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"), PLAN_COUNT_FILE=str(count),
               ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.tree", ANSIBLE_CALLBACK_TREE_DIR=str(out),
               PYTHONPATH=os.pathsep.join([str(site), str(PROJECT_ROOT)]))
    p = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(pb), *extra], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "no hosts matched" not in p.stdout, p.stdout[-2000:]
    plans = {f.name: json.loads(f.read_text())["provisioner_plan"] for f in out.iterdir()}
    assert sorted(plans) == sorted(load_fleet(inv).hosts), sorted(plans)  # every host showed its plan
    first = next(iter(plans.values()))
    assert all(v == first for v in plans.values())  # every host was handed the same plan
    return first, len(count.read_text().splitlines()), p.stdout


def _cli_plan(inv: Path, *extra: str) -> dict[str, Any]:
    p = provision("plan", str(inv), "--format", "json", *extra)
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    for h in plan["hosts"].values():
        h.pop("sources")  # the CLI's own addition: where each input was set
    return plan


def test_the_play_plans_once_and_agrees_with_provision_plan_and_render(tmp_path: Path) -> None:
    from provisioner.render import host_variables

    for inv in _inventories(tmp_path):
        play, computed, _ = _play(inv, tmp_path)
        assert computed == 1, (inv, computed)  # two plays ask for it: computed once for the run
        assert play == _cli_plan(inv), inv
        fleet = load_fleet(inv)
        for host in fleet.hosts:  # render reads the same plan for its templates
            v = host_variables(fleet, host)
            assert v["vllm_facts"] == play["hosts"][host]["vllm"] and v["imex_nodes"] == \
                play["hosts"][host]["imex_nodes"], (inv, host)
        assert any(h["vllm"] for h in play["hosts"].values()), inv  # each inventory has a cluster to plan


def test_extra_vars_reach_the_plan_and_skipping_validate_skips_only_the_rules(tmp_path: Path) -> None:
    inv = INVENTORIES / "rack-a.ini"
    over = json.dumps({"vllm_watch_misses": 5, "vllm_unit_dir": "/etc/systemd/system/x"})
    # nccl_ib_timeout=40 breaks NCCL001: with the tag validate skipped (as `provision run` does, having run the rules
    # itself) the rules are not run in the play, the plan still is
    play, computed, _ = _play(inv, tmp_path, "-e", over, "-e", "nccl_ib_timeout=40", "--skip-tags", "validate")
    assert computed == 1
    v = play["hosts"]["node01"]["vllm"]
    assert v["exec_argv"][v["exec_argv"].index("--misses") + 1] == "5"
    assert v["units"][0]["dest"] == "/etc/systemd/system/x/vllm.service"
    assert play == _cli_plan(inv, "-e", over)


def test_an_invalid_inventory_stops_the_play_with_the_rules_lines(tmp_path: Path) -> None:
    inv = tmp_path / "bad" / "rack-a.ini"
    inv.parent.mkdir()
    inv.write_text((INVENTORIES / "rack-a.ini").read_text())
    (inv.parent / "group_vars").symlink_to(INVENTORIES / "group_vars")
    pb = tmp_path / "v.yml"
    pb.write_text(f"- ansible.builtin.import_playbook: {PLAYBOOKS / 'validate.yml'}\n")
    p = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(pb), "-e", "nccl_ib_timeout=40"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                                ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts")))
    assert p.returncode != 0 and "NCCL001" in p.stdout, p.stdout[-3000:]
    bad = provision("plan", str(inv), "-e", "nccl_ib_timeout=40")
    assert bad.returncode == 1 and "NCCL001" in bad.stderr and "no plan" in bad.stderr, bad.stderr


@pytest.mark.parametrize("fmt", ["text", "yaml"])
def test_provision_plan_formats(fmt: str) -> None:
    p = provision("plan", str(INVENTORIES / "rack-a.ini"), "--host", "node02", "--format", fmt)
    assert p.returncode == 0, p.stderr
    assert "node02" in p.stdout and "--node-rank 1" in p.stdout
    assert "rack-a.ini:" in p.stdout  # where node_rank was set
    u = provision("plan", str(INVENTORIES / "rack-a.ini"), "--host", "nope")
    assert u.returncode == 2 and "unknown host" in u.stderr and "Traceback" not in u.stderr
