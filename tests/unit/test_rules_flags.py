"""vLLM flags: removed flags, malformed extra_args, and the argv serve_args renders."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from inventory_factory import BASE_INI, cluster, write_inventory
from provisioner import INVENTORIES
from provisioner.inventory import load_fleet
from provisioner.rules import build_context, run_rules
from provisioner.vllm_args import REMOVED_FLAGS, removed_flags, serve_args, serve_command
from rules_helpers import findings


def test_removed_flag_names_replacement(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "FLAG001", group_vars=cluster(extra_args=["--disable-log-requests"]))
    assert "--enable-log-requests" in f.message and f.group == "c1" and f.var == "vllm_cluster.extra_args"


def test_removed_flags_with_values() -> None:
    assert removed_flags(["--swap-space=4", "--seed", "1"]) == [("--swap-space", REMOVED_FLAGS["--swap-space"])]


def test_serve_args_head_and_worker() -> None:
    fleet = load_fleet(INVENTORIES / "rack-a.ini")
    c = fleet.clusters["qwen2_72b"]
    head = serve_args(c, "node01", fleet)
    worker = serve_args(c, "node02", fleet)
    assert head[:12] == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.20.0.11", "--master-port",
                         "29501", "-tp", "8", "-pp", "2"]
    assert worker[:4] == ["--nnodes", "2", "--node-rank", "1"] and worker[-1] == "--headless"
    assert "--headless" not in head and "--port" in head and "--port" not in worker
    assert "--distributed-executor-backend" not in head  # mp is vLLM's default with --nnodes
    assert serve_command(c, "node01", fleet)[:3] == ["vllm", "serve", "/models/Qwen2-72B-Instruct"]


def test_single_node_has_no_multinode_flags() -> None:
    fleet = load_fleet(INVENTORIES / "rack-a.ini")
    argv = serve_args(fleet.clusters["llama31_70b"], "node03", fleet)
    assert "--nnodes" not in argv and argv[:4] == ["-tp", "8", "-pp", "1"]
    assert argv[argv.index("--quantization") + 1] == "fp8"


def test_ray_backend_on_head_only(tmp_path: Path) -> None:
    fleet = load_fleet(write_inventory(tmp_path, group_vars=cluster(executor="ray")))
    c = fleet.clusters["c1"]
    head = serve_args(c, "n1", fleet)
    assert "--distributed-executor-backend" in head and head[head.index("--distributed-executor-backend") + 1] == "ray"
    assert "--nnodes" not in head
    assert serve_args(c, "n2", fleet) == [] and serve_command(c, "n2", fleet) == []


def test_vllm_host_ip_is_master_addr(tmp_path: Path) -> None:
    ini = BASE_INI.replace("n1 ansible_host=10.0.0.1", "n1 ansible_host=10.0.0.1 vllm_host_ip=192.168.5.1")
    fleet = load_fleet(write_inventory(tmp_path, ini=ini))
    argv = serve_args(fleet.clusters["c1"], "n2", fleet)
    assert argv[argv.index("--master-addr") + 1] == "192.168.5.1"


def test_flag_checker_is_used_for_every_distinct_argv(tmp_path: Path) -> None:
    """FLAG003 with a checker that rejects one flag (a stand-in for vLLM's parser, which is not installed here)."""
    fleet = load_fleet(write_inventory(tmp_path, group_vars=cluster(extra_args=["--no-such-flag"])))
    seen: list[list[str]] = []

    def checker(model: str, argv: list[str]) -> str | None:
        seen.append(list(argv))
        return "unrecognized arguments: --no-such-flag" if "--no-such-flag" in argv else None

    fs = [f for f in run_rules(fleet, build_context(fleet, flag_checker=checker)) if f.code == "FLAG003"]
    assert len(seen) == 2 and {f.host for f in fs} == {"n1", "n2"}
    assert "unrecognized arguments" in fs[0].message


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not importable in this venv")
def test_real_vllm_parser(tmp_path: Path) -> None:
    from provisioner.vllm_args import vllm_parser_error

    fleet = load_fleet(INVENTORIES / "rack-a.ini")
    c = fleet.clusters["qwen2_72b"]
    assert vllm_parser_error("/m", serve_args(c, "node01", fleet)) is None
    assert vllm_parser_error("/m", ["--swap-space", "4"]) is not None


VLLM_PYTHON = os.environ.get("PROVISION_VLLM_PYTHON")


@pytest.mark.skipif(not VLLM_PYTHON, reason="set PROVISION_VLLM_PYTHON (and PROVISION_VLLM_PYTHONPATH) to a vLLM env")
def test_real_vllm_parser_through_the_cli(tmp_path: Path) -> None:
    """FLAG003 with vLLM's real parser in another interpreter: rack-a's argvs pass, an unknown flag fails."""
    import json
    import subprocess
    import sys

    exe = str(Path(sys.executable).parent / "provision")
    ok = subprocess.run([exe, "validate", str(INVENTORIES / "rack-a.ini"), "--format", "json", "--vllm-parser", "on"],
                        capture_output=True, text=True, timeout=1200)
    assert ok.returncode == 0, ok.stderr
    inv = write_inventory(tmp_path, group_vars=cluster(extra_args=["--no-such-flag"]))
    bad = subprocess.run([exe, "validate", str(inv), "--format", "json", "--vllm-parser", "on"],
                         capture_output=True, text=True, timeout=1200)
    assert bad.returncode == 1, bad.stderr
    errs = [e for e in json.loads(bad.stdout)["errors"] if e["code"] == "FLAG003"]
    assert errs and "--no-such-flag" in errs[0]["message"]
