"""playbooks/validate.yml: the same rules as Ansible asserts. Passes on rack-a, fails on broken inventories with the
rule code and a message that says what to fix. Runs the real ansible-playbook (no host is contacted)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from inventory_factory import BASE_INI, DELETE, TINY_CONFIG, cluster, gpu_nodes, write_inventory
from provisioner import INVENTORIES, PLAYBOOKS, PROJECT_ROOT
from provisioner.inventory import VLLM_CLUSTER_DEFAULTS

PLAYBOOK = PLAYBOOKS / "validate.yml"
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def play(inv: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(inv), str(PLAYBOOK)], capture_output=True, text=True,
                          timeout=300, cwd=PROJECT_ROOT, env=env)


def test_defaults_match_the_python_loader() -> None:
    doc = yaml.safe_load(PLAYBOOK.read_text())
    (cluster_play,) = [p for p in doc if p["name"] == "Validate vLLM clusters"]
    assert cluster_play["vars"]["_vc_defaults"] == VLLM_CLUSTER_DEFAULTS


def test_every_play_skips_facts() -> None:
    assert all(p.get("gather_facts") is False for p in yaml.safe_load(PLAYBOOK.read_text()))


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
}
# (code, host whose task fails, text its message must hold)
EXPECTED = [
    ("HW001", "hw001", "bootstrap_interface is not set"),
    ("HW002", "hw002", "expected an integer 1-16"),
    ("HW003", "hw003", "not in provisioner/catalog/gpus.yaml"),
    ("HW005", "hw005", "ib_hcas is empty"),
    ("HW006", "hw006", "like mlx5_0"),
    ("HW007", "localhost", "10.1.9.9:22"),
    ("NCCL001", "nccl001", "expected an integer 1-31"),
    ("NCCL003", "nccl003", "ringg"),
    ("VAR001", "var001", "quote it"),
    ("CL002", "c2n1", "Qwen3-999B"),
    ("CL003", "c3n1", "make them equal"),
    ("CL006/CL007", "c6n2", "must be 0..1"),
    ("CL008", "c8n1", "do not split"),
    ("CL013", "c13n1", "wrong type"),
    ("MEM001", "m1n1", "fp8 quantization"),
    ("MEM002", "m2n1", "refuse"),
    ("FLAG001", "f1n1", "--swap-space is no longer accepted"),
]


def _failures(stdout: str) -> dict[str, str]:
    """host -> the text of all its failed tasks (ansible's output, one 'fatal: [host]' block per failure)."""
    out: dict[str, str] = {}
    for chunk in re.split(r"(?:fatal|failed): \[", stdout)[1:]:
        host, _, rest = chunk.partition("]")
        out[host] = out.get(host, "") + rest.split("TASK [")[0]
    return out


def test_each_rule_fails_on_its_broken_host(tmp_path: Path) -> None:
    """One run over an inventory with one broken host or cluster per rule (escape hatch on, so every host
    reports), then the same inventory without it must fail."""
    inv = write_inventory(tmp_path, ini=BROKEN_INI, group_vars=BROKEN_GROUP_VARS, host_vars=BROKEN_HOST_VARS)
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    p = subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(inv), str(PLAYBOOK), "-e", "validate_ignore_assert_errors=true"],
                       capture_output=True, text=True, timeout=600, cwd=PROJECT_ROOT, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr  # the escape hatch reports and carries on
    fails = _failures(p.stdout)
    for code, host, needle in EXPECTED:
        assert f"{code}:" in fails.get(host, ""), (code, host, fails.get(host, "")[:2000])
        assert needle in fails[host], (code, host, fails[host][:2000])
    # the broken hosts fail for their own reason only: HW rules do not fire on the valid cluster members
    assert "HW0" not in fails.get("m2n2", "")


def test_fails_without_the_escape_hatch(tmp_path: Path) -> None:
    p = play(write_inventory(tmp_path, group_vars=gpu_nodes(gpu_model="H100")))
    assert p.returncode != 0 and "HW003:" in p.stdout
