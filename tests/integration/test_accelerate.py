"""`--accelerate` / $PROVISION_ACCELERATE (provisioner/accelerate.py): bad values are usage errors before anything
runs; `mitogen` really runs the playbook through Mitogen's persistent interpreter (two tasks, one module process),
and check mode under it still reports the diff and changes nothing. Real ansible-runner runs, local connection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from provisioner import accelerate
from provisioner.errors import UsageError
from provisioner.runner import run_playbook

PLAYBOOK = """
- name: Accelerated
  hosts: all
  gather_facts: false
  tasks:
    - name: Module process of task one
      ansible.builtin.shell: "echo $PPID > {{ root }}/{{ inventory_hostname }}.pid1"
      changed_when: false
      check_mode: false
    - name: Module process of task two
      ansible.builtin.shell: "echo $PPID > {{ root }}/{{ inventory_hostname }}.pid2"
      changed_when: false
      check_mode: false
    - name: Render nccl.conf
      ansible.builtin.copy:
        dest: "{{ root }}/{{ inventory_hostname }}.conf"
        content: "NCCL_SOCKET_IFNAME=eth0\\n"
        mode: "0644"
"""


@pytest.fixture()
def site(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "hosts"
    root.mkdir()
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"[gpu]\nalpha ansible_connection=local ansible_python_interpreter={sys.executable} root={root}\n")
    pb = tmp_path / "site.yml"
    pb.write_text(PLAYBOOK)
    return {"root": root, "inv": inv, "pb": pb, "tmp": tmp_path}


def _run(site: dict[str, Path], mode: str, **kw):  # type: ignore[no-untyped-def]
    return run_playbook(site["inv"], playbook=site["pb"], runs_dir=site["tmp"] / "runs", accelerate=mode,
                        envvars={"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(site["tmp"] / "facts")}, **kw)


def test_mode_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(accelerate.ENV_VAR, raising=False)
    assert accelerate.mode() == "none" and accelerate.env() == {}
    monkeypatch.setenv(accelerate.ENV_VAR, "Mitogen")
    assert accelerate.mode() == "mitogen"
    assert accelerate.mode("none") == "none"  # the option wins over the environment
    monkeypatch.setenv(accelerate.ENV_VAR, "turbo")
    with pytest.raises(UsageError, match="PROVISION_ACCELERATE: unknown accelerator 'turbo'"):
        accelerate.mode()


@pytest.mark.parametrize("command", ["run", "drift"])
def test_cli_rejects_unknown_accelerator_in_one_line(tmp_path: Path, command: str) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpu_nodes]\nnode01 ansible_host=198.18.250.1\n")
    p = subprocess.run([sys.executable, "-m", "provisioner.cli", command, str(inv), "--accelerate", "warp"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p
    assert "--accelerate: unknown accelerator 'warp'" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_mitogen_runs_tasks_in_one_interpreter_and_check_mode_is_read_only(site: dict[str, Path]) -> None:
    pytest.importorskip("ansible_mitogen", reason="the accelerate extra (mitogen) is not installed")
    root = site["root"]
    stock = _run(site, "none")
    assert stock.succeeded, stock.to_dict()
    # stock: a fresh module process (AnsiballZ) per task
    assert (root / "alpha.pid1").read_text() != (root / "alpha.pid2").read_text()

    fast = _run(site, "mitogen")
    assert fast.succeeded and fast.hosts["alpha"].changed == 0, fast.to_dict()
    # Mitogen: both tasks' shells are children of the same persistent interpreter
    assert (root / "alpha.pid1").read_text() == (root / "alpha.pid2").read_text()

    conf = root / "alpha.conf"
    conf.write_text("NCCL_SOCKET_IFNAME=eth9\n")
    drift = _run(site, "mitogen", command="drift", check=True)
    assert conf.read_text() == "NCCL_SOCKET_IFNAME=eth9\n", "check mode changed the file"
    [item] = drift.hosts["alpha"].drift
    assert (item.kind, item.resource) == ("file", str(conf))
    assert "-NCCL_SOCKET_IFNAME=eth9" in item.diff and "+NCCL_SOCKET_IFNAME=eth0" in item.diff
