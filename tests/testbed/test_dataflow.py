"""One source of truth on the simulated rack (docs/development.md, "Data flow"): what Ansible resolved for the play,
`-e` extra vars included, is what the roles render; a dynamic inventory is as good as its INI twin.

Rack PROVISIONER_DATAFLOW_RACK (default `dataflow`, 2 plain hosts, the rack's own 2-node cluster `vllm_pp`). No vLLM
is needed: the play runs the vllm role's facts task (tag always) and vllm_launch (tag vllm_launch, its nccl_tuning
dependency included) with `--skip-tags vllm_launch_start`, so units, env file and /etc/nccl.conf are written and
nothing is started.
- `-e '{"nccl_ib_timeout": 19}'` and `-e '{"vllm_cluster": {... "max_num_seqs": 7}}'` show up in /etc/nccl.conf and
  in the unit's `vllm serve` line on the hosts;
- a script inventory with the rack's hosts and variables validates (`provision validate` and validate.yml's action
  plugin) and renders (`provision render`) exactly like the INI inventory, and the play writes the same files from it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import PLAYBOOKS, PROJECT_ROOT
from testbed_rigs import own_rack, vllm_files_play  # noqa: E402  (same directory)

from inventory_factory import script_twin  # noqa: E402  (tests/support, on pytest's pythonpath)

pytestmark = pytest.mark.testbed

BIN = Path(sys.executable).parent
FILES = ("/etc/nccl.conf", "/etc/vllm/vllm.env", "/etc/systemd/system/vllm.service")
CLEAN = "rm -rf /etc/vllm /etc/systemd/system/vllm.service /etc/systemd/system/vllm-ray.service /etc/nccl.conf"

PLAY = vllm_files_play("vLLM files only (plain rack, no vLLM, nothing started)")


@pytest.fixture(scope="module")
def rig() -> Iterator[Any]:
    with own_rack("PROVISIONER_DATAFLOW_RACK", "dataflow", 2) as h:
        yield h
        for host in h.names:
            h.ssh(host, CLEAN)


def _inventories(rig: Any, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the rack's inventory (no in-service gate: a plain rack is not onboarded) and its script twin."""
    src = Path(rig.inventory).parent
    d = tmp_path / "inv"
    shutil.copytree(src, d)
    gv = d / "group_vars" / "vllm_pp.yml"
    doc = yaml.safe_load(gv.read_text())
    doc["vllm_launch_require_in_service"] = False
    gv.write_text(yaml.safe_dump(doc, sort_keys=False))
    ini = d / Path(rig.inventory).name
    return ini, script_twin(ini, d / "dynamic.py")


def _play(inv: Path, play: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), **(env or {}))
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(play), "--tags", "vllm_launch",
                           "--skip-tags", "vllm_launch_start", *extra],
                          capture_output=True, text=True, cwd=PROJECT_ROOT, env=e, timeout=900)


def _keyless(env: bytes) -> bytes:
    """An env file with the value of its VLLM_API_KEY line left out (the line itself and its place kept)."""
    return re.sub(rb"(?m)^VLLM_API_KEY=.*$", b"VLLM_API_KEY=*", env)


def _read(rig: Any, host: str, path: str) -> str:
    p = rig.ssh(host, f"cat {path}")
    assert p.returncode == 0, (host, path, p.stderr)
    return p.stdout


def _serve_line(unit: str) -> str:
    return next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))


def test_extra_vars_reach_nccl_conf_and_the_vllm_command_line(rig: Any, tmp_path: Path) -> None:
    ini, _ = _inventories(rig, tmp_path)
    play = tmp_path / "files.yml"
    play.write_text(PLAY)
    vc = yaml.safe_load((ini.parent / "group_vars" / "vllm_pp.yml").read_text())["vllm_cluster"]
    count = tmp_path / "parses"
    p = _play(ini, play, "-e", json.dumps({"nccl_ib_timeout": 19}),
              "-e", json.dumps({"vllm_cluster": {**vc, "max_num_seqs": 7}}),
              env={"H7_COUNT_FILE": str(count), "PYTHONPATH": os.environ.get("H7_COUNT_PATH", "")})
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    for host in rig.names:
        assert "NCCL_IB_TIMEOUT=19\n" in _read(rig, host, "/etc/nccl.conf")
        line = _serve_line(_read(rig, host, "/etc/systemd/system/vllm.service"))
        assert " serve " in line and "--max-num-seqs 7 " in line, line
    if count.exists():  # H7_COUNT_PATH: a sitecustomize that counts InventoryManager() calls (docs/development.md)
        print("inventory parses in ansible-playbook:", count.read_text().count("\n"))
    # without -e: the inventory's values again (22 is nccl_tuning's default, 256 the cluster default)
    p = _play(ini, play)
    assert p.returncode == 0, p.stdout[-4000:]
    for host in rig.names:
        assert "NCCL_IB_TIMEOUT=22\n" in _read(rig, host, "/etc/nccl.conf")
        assert "--max-num-seqs 256 " in _serve_line(_read(rig, host, "/etc/systemd/system/vllm.service"))


def test_a_script_inventory_is_as_good_as_its_ini_twin(rig: Any, tmp_path: Path) -> None:
    ini, script = _inventories(rig, tmp_path)
    for inv in (ini, script):  # both entry points of the rules accept it
        p = subprocess.run([str(BIN / "provision"), "validate", str(inv), "--format", "json", "--vllm-parser", "off"],
                           capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300)
        assert p.returncode == 0 and json.loads(p.stdout)["ok"], p.stdout + p.stderr
        p = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(PLAYBOOKS / "validate.yml")],
                           capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300,
                           env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
        assert p.returncode == 0 and "failed=0" in p.stdout, p.stdout[-3000:]
    rendered = {}
    for inv in (ini, script):
        out = tmp_path / f"render-{inv.name}"
        for host in rig.names:
            p = subprocess.run([str(BIN / "provision"), "render", str(inv), "--host", host, "--out", str(out / host)],
                               capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300)
            assert p.returncode == 0, p.stderr
        rendered[inv.name] = {str(f.relative_to(out)): f.read_bytes() for f in sorted(out.rglob("*")) if f.is_file()}
    assert rendered[ini.name] == rendered[script.name] and len(rendered[ini.name]) == 3 * len(rig.names)
    # and the play, from the script, writes what `provision render` shows
    play = tmp_path / "files.yml"
    play.write_text(PLAY)
    p = _play(script, play)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    for host in rig.names:
        for path in FILES:
            have, shown = _read(rig, host, path).encode(), rendered[ini.name][f"{host}{path}"]
            if path.endswith("vllm.env"):  # the rack's key is vaulted: the node has it, render shows it redacted
                assert b"<redacted>" in shown and b"<redacted>" not in have, (host, path)
                have, shown = _keyless(have), _keyless(shown)
            assert have == shown, (host, path)
