"""The vllm role's venv steps (roles/vllm/tasks/venv.yml) in check mode from every state of the venv, through the real
drift path (ansible-runner, `--check --diff`, the event folder) on local-connection hosts: no venv, a venv without
vLLM, another vLLM version, the pinned one. Each is drift named by what a run would do, never a failed check (the
issue 16 bug: the version probe ran the missing venv's python), and check mode changes nothing on disk. The rack
matrix (tests/testbed/test_drift_tiers.py) covers the rest of the roles; no root, no network here.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from provisioner.runner import run_playbook

PLAY = """
- name: The vllm role's venv steps
  hosts: all
  gather_facts: false
  tasks:
    - name: Venv, pinned vLLM (tasks/venv.yml)
      ansible.builtin.include_role:
        name: vllm
        tasks_from: venv
"""


def _venv(path: Path, vllm: str | None) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    if vllm:  # what `pip install vllm==X` leaves for importlib.metadata: the distribution's metadata
        site = next(path.glob("lib/python3*/site-packages"))
        meta = site / f"vllm-{vllm}.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {vllm}\n")


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink()
            else f"{p.lstat().st_mode}" for p in sorted(root.rglob("*"))}


def test_venv_states_are_drift(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    venvs = {"bare": hosts / "bare" / "venv", "empty": hosts / "empty" / "venv", "other": hosts / "other" / "venv",
             "pinned": hosts / "pinned" / "venv"}
    for v in venvs.values():
        v.parent.mkdir(parents=True)
    _venv(venvs["empty"], None)
    _venv(venvs["other"], "0.31.0")
    _venv(venvs["pinned"], "0.32.0+cpu")
    inv = tmp_path / "hosts.ini"
    inv.write_text("".join(f"{h} ansible_connection=local ansible_python_interpreter={sys.executable} "
                           f"vllm_venv={v} vllm_python={sys.executable}\n" for h, v in venvs.items())
                   + "[all:vars]\nvllm_os_packages=[]\n")
    pb = tmp_path / "venv.yml"
    pb.write_text(PLAY)
    before = _tree(hosts)
    r = run_playbook(inv, command="drift", playbook=pb, check=True, diff=True, runs_dir=tmp_path / "runs",
                     envvars={"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts")})
    assert _tree(hosts) == before, "check mode changed a venv"
    assert not r.failures and not r.unreachable_hosts, [(f.host, f.task, f.message) for f in r.failures]
    got = {h: {(d.kind, d.resource, d.role) for d in r.hosts[h].drift} for h in venvs}
    assert got == {
        "bare": {("other", "The venv (created when missing)", "vllm"),
                 ("other", f"vLLM venv {venvs['bare']} missing, would install vllm==0.32.0", "vllm")},
        "empty": {("other", f"no vllm in {venvs['empty']}, would install vllm==0.32.0", "vllm")},
        "other": {("other", "vllm 0.31.0, would install vllm==0.32.0", "vllm")},
        "pinned": set(),  # 0.32.0+cpu (a local build of the pin) satisfies it
    }, got
