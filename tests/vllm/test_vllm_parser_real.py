"""FLAG003 with vLLM's real parser, from the controller: `provision validate --vllm-parser on --vllm-python PY`.

The controller has no vLLM (it is never a dependency of the CLI); PY is a tiny wrapper that runs the golden layer's
own interpreter (/opt/vllm/venv/bin/python, vLLM CPU) inside a running rack host with `nsenter` into that host's
namespaces: the same vLLM build the nodes serve with, reached the way an operator would point --vllm-python at any
vLLM venv. rack-a's clusters (real argvs of Qwen2-72B TP 8 x PP 2, Llama 3.1 70B, Mixtral) must pass; the same
inventory with one unknown flag must fail with vLLM's own message, naming the cluster.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from provisioner import INVENTORIES

from vllm_e2e import PROVISION, VllmRack  # noqa: E402

pytestmark = pytest.mark.vllm

VENV_PYTHON = "/opt/vllm/venv/bin/python"


def _vllm_python(vr: VllmRack, tmp_path: Path) -> Path:
    from provisioner_testbed import hosts
    from provisioner_testbed.state import RackState

    state = RackState.load(vr.handle.name)
    assert state is not None, f"rack {vr.handle.name} has no state"
    host = state.host(vr.handle.names[-1])
    assert host is not None
    pid = hosts.init_pid(host)
    assert pid, f"{host.name} is not running"
    wrapper = tmp_path / "vllm-python"
    wrapper.write_text(f'#!/bin/sh\nexec nsenter -t {pid} -m -u -i -n -p -w -- {VENV_PYTHON} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def _validate(inv: Path, py: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROVISION, "validate", str(inv), "--format", "json", "--vllm-parser", "on",
                           "--vllm-python", str(py)], capture_output=True, text=True, timeout=1200)


def test_validate_with_vllms_own_parser(vllm_rack: VllmRack, tmp_path: Path) -> None:
    if shutil.which("nsenter") is None:
        pytest.fail("nsenter is missing (Debian/Ubuntu package util-linux, part of every base system)")
    py = _vllm_python(vllm_rack, tmp_path)
    # the wrapper really reaches vLLM (no silent fallback to the controller's interpreter)
    v = subprocess.run([str(py), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True,
                       timeout=600)
    assert v.returncode == 0 and v.stdout.strip(), v.stderr[-2000:]

    ok = _validate(INVENTORIES / "rack-a.ini", py)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]

    inv = tmp_path / "inv"
    shutil.copytree(INVENTORIES, inv, ignore=shutil.ignore_patterns("testbed*"))
    gv = inv / "group_vars" / "qwen2_72b.yml"
    text = gv.read_text()
    assert "extra_args: [--enable-log-requests]" in text
    gv.write_text(text.replace("extra_args: [--enable-log-requests]",
                               "extra_args: [--enable-log-requests, --no-such-flag]"))
    bad = _validate(inv / "rack-a.ini", py)
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-3000:]
    errs = [e for e in json.loads(bad.stdout)["errors"] if e["code"] == "FLAG003"]
    assert errs, bad.stdout[-3000:]
    assert "--no-such-flag" in errs[0]["message"] and "qwen2_72b" in json.dumps(errs[0]), errs
