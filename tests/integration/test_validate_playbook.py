"""playbooks/validate.yml: the rules of `provision validate`, run by the action plugin
plugins/action/provisioner_plan.py (the provisioner_plan role, rules on) inside the play. Both entry points, the same inventories, the same findings:
passes on rack-a, fails on broken inventories with the rule code and a line that says what to fix, for INI and
for a dynamic (script) inventory alike. Runs the real ansible-playbook and `provision` (no host is contacted)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from inventory_factory import BASE_INI, DELETE, TINY_CONFIG, cluster, gpu_nodes, script_twin, write_inventory
from provisioner import INVENTORIES, PLAYBOOKS, PROJECT_ROOT

PLAYBOOK = PLAYBOOKS / "validate.yml"
BIN = Path(sys.executable).parent
ANSIBLE_PLAYBOOK = str(BIN / "ansible-playbook")


def play(inv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"))
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(inv), str(PLAYBOOK), *args], capture_output=True, text=True,
                          timeout=300, cwd=PROJECT_ROOT, env=env)


def plugin_result(inv: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """(rc, the action plugin's task result) of one validate.yml run with the escape hatch on: the result as the
    default callback prints it (YAML, ansible.cfg's callback_result_format) between "FAILED! =>" and "...ignoring"."""
    p = play(inv, "-e", "validate_ignore_assert_errors=true", *args)
    out = p.stdout
    assert "FAILED! =>" in out and "...ignoring" in out, out[-3000:] + p.stderr[-2000:]
    block = out.split("FAILED! =>", 1)[1].split("...ignoring", 1)[0]
    return p.returncode, yaml.safe_load(textwrap.dedent(block.strip("\n")))


def cli_result(inv: Path) -> tuple[int, dict[str, Any]]:
    p = subprocess.run([str(BIN / "provision"), "validate", str(inv), "--format", "json", "--vllm-parser", "off"],
                       capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT)
    return p.returncode, json.loads(p.stdout)


def test_validate_yml_is_the_plan_role_with_the_rules_on() -> None:
    doc = yaml.safe_load(PLAYBOOK.read_text())
    assert all(p.get("gather_facts") is False and not p.get("tasks") for p in doc)
    assert [p["roles"] for p in doc] == [[{"role": "provisioner_plan", "vars": {"provisioner_plan_validate": True}}]]
    tasks = yaml.safe_load((PROJECT_ROOT / "roles/provisioner_plan/tasks/main.yml").read_text())
    assert "provisioner.gpu.provisioner_plan" in tasks[0] and tasks[0]["run_once"] is True
    assert "ansible.builtin.assert" not in PLAYBOOK.read_text()  # no Jinja re-implementation of the rules


def test_passes_on_rack_a() -> None:
    p = play(INVENTORIES / "rack-a.ini")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr
    assert "failed=0" in p.stdout


def test_passes_on_base_inventory_with_model_config(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, group_vars=cluster(model_arch=DELETE, model_config="tiny/config.json",
                                                       tensor_parallel_size=8, pipeline_parallel_size=1),
                          ini=BASE_INI.replace("n2 node_rank=1\n", "").replace("n2 ansible_host=10.0.0.2\n", ""),
                          files={"tiny/config.json": json.dumps(TINY_CONFIG)})
    p = play(inv)
    assert p.returncode == 0, p.stdout[-3000:]


BROKEN_INI = """\
[gpu_nodes]
hw001 ansible_host=10.1.0.1
hw002 ansible_host=10.1.0.2
hw003 ansible_host=10.1.0.3
hw005 ansible_host=10.1.0.5
hw006 ansible_host=10.1.0.6
hw007a ansible_host=10.1.9.9
hw007b ansible_host=10.1.9.9
nccl001 ansible_host=10.1.1.1
nccl003 ansible_host=10.1.1.3
var001 ansible_host=10.1.2.1 cuda_version=12.10
efa1 ansible_host=10.1.3.1
b200old ansible_host=10.1.3.2
tray1 ansible_host=10.1.3.3

[gpu_nodes:children]
clusters

[clusters:children]
cl002
cl003
cl006
cl008
cl013
mem001
mem002
flag001

[cl002]
c2n1 ansible_host=10.2.2.1 node_rank=0
[cl003]
c3n1 ansible_host=10.2.3.1 node_rank=0
[cl006]
c6n1 ansible_host=10.2.6.1 node_rank=0
c6n2 ansible_host=10.2.6.2 node_rank=0
[cl008]
c8n1 ansible_host=10.2.8.1 node_rank=0
[cl013]
c13n1 ansible_host=10.2.13.1 node_rank=0
[mem001]
m1n1 ansible_host=10.3.1.1 node_rank=0
[mem002]
m2n1 ansible_host=10.3.2.1 node_rank=0
m2n2 ansible_host=10.3.2.2 node_rank=1
[flag001]
f1n1 ansible_host=10.4.1.1 node_rank=0
"""


def _vc(**kw: Any) -> dict[str, Any]:
    return {"vllm_cluster": {"model": "/m", "model_arch": "Qwen2-72B", "tensor_parallel_size": 8, **kw}}


BROKEN_GROUP_VARS = {
    "cl002": _vc(model_arch="Qwen3-999B"),
    "cl003": _vc(pipeline_parallel_size=2),
    "cl006": _vc(pipeline_parallel_size=2),
    "cl008": _vc(model_arch="Qwen2-7B"),
    "cl013": _vc(enable_prefix_caching="yes"),
    "mem001": _vc(gpu_memory_utilization=0.1),
    "mem002": _vc(pipeline_parallel_size=2, gpu_memory_utilization=0.11, max_model_len=32768),
    "flag001": _vc(extra_args=["--swap-space", "4"]),
}
BROKEN_HOST_VARS = {
    "hw001": {"bootstrap_interface": None},
    "hw002": {"gpu_count": "8"},
    "hw003": {"gpu_model": "H100"},
    "hw005": {"ib_hcas": []},
    "hw006": {"ib_hcas": ["mlx5 0"]},
    "nccl001": {"nccl_ib_timeout": 40},
    "nccl003": {"nccl_algo": "allreduce:ringg"},
    # node shapes (issue 18): an EFA node keeping ib_hcas and lacking its count and installer, a B200 on a driver
    # older than its minimum, a GB200 tray without its NVLink domain
    "efa1": {"fabric": "efa", "ib_hcas": ["mlx5_0"]},
    "b200old": {"gpu_model": "B200-SXM-180GB", "nvidia_driver_version": "570.86.15-1"},
    "tray1": {"gpu_model": "GB200-186GB", "gpu_count": 4},
}
# (code, host or group the finding names) one per broken host/cluster above
EXPECTED = [
    ("HW001", "hw001"), ("HW002", "hw002"), ("HW003", "hw003"), ("HW005", "hw005"), ("HW006", "hw006"),
    ("HW007", "hw007b"), ("NCCL001", "nccl001"), ("NCCL003", "nccl003"), ("VAR001", "var001"),
    ("CL002", "cl002"), ("CL003", "cl003"), ("CL006", "cl006"), ("CL008", "cl008"), ("CL013", "cl013"),
    ("MEM001", "mem001"), ("MEM002", "mem002"), ("FLAG001", "flag001"),
    ("HW010", "efa1"), ("HW012", "efa1"), ("HW013", "efa1"), ("HW014", "b200old"), ("NVL001", "tray1"),
]


def _where(f: dict[str, Any]) -> set[str]:
    return {x for x in (f.get("host"), f.get("group")) if x}


def _broken(tmp_path: Path) -> Path:
    return write_inventory(tmp_path, ini=BROKEN_INI, group_vars=BROKEN_GROUP_VARS, host_vars=BROKEN_HOST_VARS)


def test_both_entry_points_give_the_same_findings(tmp_path: Path) -> None:
    """`provision validate` and validate.yml (escape hatch on, so the run carries on) on one inventory with one
    broken host or cluster per rule: the same errors (code, host, group, variable, message) and warnings."""
    inv = _broken(tmp_path)
    rc_cli, cli = cli_result(inv)
    rc_play, res = plugin_result(inv)
    assert rc_cli == 1 and rc_play == 0  # the escape hatch reports and carries on
    assert res["errors"] == cli["errors"]
    assert res["validation_warnings"] == cli["warnings"]
    for code, where in EXPECTED:
        assert any(f["code"] == code and where in _where(f) for f in res["errors"]), (code, where)
    # one line per error in the task's message: code, where, variable, what to fix
    lines = res["msg"].splitlines()[1:]
    assert len(lines) == len(cli["errors"])
    assert any(ln.startswith("NCCL001 nccl001 (nccl_ib_timeout): ") for ln in lines), lines


def test_a_script_inventory_validates_like_its_ini_twin(tmp_path: Path) -> None:
    """A dynamic inventory (script protocol) with the same hosts and variables: the same findings, both ways."""
    inv = _broken(tmp_path)
    script = script_twin(inv, tmp_path / "dynamic.py")
    _, cli_ini = cli_result(inv)
    rc, cli_script = cli_result(script)
    assert rc == 1 and _no_origin(cli_script["errors"]) == _no_origin(cli_ini["errors"])
    _, res = plugin_result(script)
    assert res["errors"] == cli_script["errors"]


def _no_origin(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages without " (set in FILE:LINE)": a script's own values carry no file:line, its INI twin's do."""
    return [{**f, "message": re.sub(r" \(set in [^()]*\)$", "", f["message"])} for f in findings]


def test_fails_without_the_escape_hatch(tmp_path: Path) -> None:
    p = play(write_inventory(tmp_path, group_vars=gpu_nodes(gpu_model="H100")))
    assert p.returncode != 0
    assert "HW003 n1 (gpu_model): " in p.stdout, p.stdout[-3000:]


def test_errors_outside_the_limit_are_warnings(tmp_path: Path) -> None:
    """As `provision run --limit`: a broken host outside the play does not stop it (its error is a warning)."""
    inv = write_inventory(tmp_path, ini=BASE_INI + "[gpu_nodes]\nbad ansible_host=10.0.0.9\n",
                          host_vars={"bad": {"gpu_count": "8"}})
    p = play(inv, "--limit", "n1,n2")
    assert p.returncode == 0, p.stdout[-3000:]
    assert "HW002 bad (gpu_count)" in p.stdout + p.stderr
    p = play(inv)
    assert p.returncode != 0 and "HW002 bad (gpu_count)" in p.stdout


def test_extra_vars_are_validated(tmp_path: Path) -> None:
    """-e values are what the play uses: validate.yml checks them (ansible's precedence, extra vars on top)."""
    inv = write_inventory(tmp_path)
    assert play(inv).returncode == 0
    p = play(inv, "-e", "nccl_ib_timeout=40")
    assert p.returncode != 0 and "NCCL001" in p.stdout, p.stdout[-3000:]


def test_hostile_values_are_refused_in_the_play(tmp_path: Path) -> None:
    """Rules TXT001/TXT002 run in the play as in the CLI: a newline in a group var or an -e value, a delimiter in
    a served name (issue 43, class 2)."""
    inv = write_inventory(tmp_path, group_vars={
        **gpu_nodes(nccl_extra={"NCCL_DEBUG": "WARN\nNCCL_NET=Socket"}),
        "c1": {"vllm_cluster": {"served_model_name": 'm" "@x'}}})
    p = play(inv, "-e", '{"vllm_env_extra": {"A": "1\\nVLLM_API_KEY=evil"}}')
    assert p.returncode != 0
    out = p.stdout
    assert "TXT001 n1 (nccl_extra): nccl_extra.NCCL_DEBUG holds a newline (U+000A)" in out, out[-3000:]
    assert "TXT001 n1 (vllm_env_extra): vllm_env_extra.A holds a newline" in out, out[-3000:]
    assert "TXT002 c1 (vllm_cluster.served_model_name)" in out, out[-3000:]
    rc, cli = cli_result(inv)
    assert rc == 1 and {f["code"] for f in cli["errors"]} >= {"TXT001", "TXT002"}
