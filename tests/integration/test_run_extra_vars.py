"""`provision run -e`: extra vars reach the CLI's own validation (as the play will see them) and the playbook; the
inventory is parsed once per run. Real runs of a tiny playbook on a local-connection host (no root, no network)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLAYBOOK = """
- name: Write what the play sees
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Record nccl_ib_timeout and marker
      ansible.builtin.copy:
        dest: "{{ out }}/{{ inventory_hostname }}.txt"
        content: "{{ nccl_ib_timeout }} {{ marker | default('none') }}\\n"
        mode: "0644"
"""

# Counts InventoryManager constructions (ansible-core's inventory parse) in the CLI process, then runs the CLI.
COUNTING_CLI = """
import atexit, sys
from ansible.inventory.manager import InventoryManager
calls = []
original = InventoryManager.__init__
def counted(self, *args, **kwargs):
    calls.append(1)
    original(self, *args, **kwargs)
InventoryManager.__init__ = counted
atexit.register(lambda: sys.stderr.write(f"\\nINVENTORY_PARSES={len(calls)}\\n"))
from provisioner.cli import main
main()
"""


@pytest.fixture()
def site(tmp_path: Path) -> dict[str, Path]:
    out = tmp_path / "out"
    out.mkdir()
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.ini").write_text("[gpu_nodes]\nalpha ansible_connection=local\n")
    (inv / "group_vars" / "gpu_nodes.yml").write_text(
        f"ansible_python_interpreter: {sys.executable}\nout: {out}\ngpu_model: H100-SXM5-80GB\ngpu_count: 8\n"
        "fabric: ethernet\nbootstrap_interface: eth0\nnccl_ib_timeout: 22\n")
    pb = tmp_path / "site.yml"
    pb.write_text(PLAYBOOK)
    return {"inv": inv / "hosts.ini", "pb": pb, "out": out, "runs": tmp_path / "runs", "tmp": tmp_path}


def cli(site: dict[str, Path], *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    env = dict(os.environ, PROVISION_RUNS_DIR=str(site["runs"]), COLUMNS="300",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(site["tmp"] / "facts"))
    p = subprocess.run([sys.executable, "-c", COUNTING_CLI, "run", str(site["inv"]), "--playbook", str(site["pb"]),
                        "--skip-preflight", *args], capture_output=True, text=True, env=env, timeout=600)
    parses = [int(x.split("=")[1]) for x in p.stderr.split() if x.startswith("INVENTORY_PARSES=")]
    assert "Traceback" not in p.stderr, p.stderr
    return p, parses[-1]


def test_invalid_override_is_refused_before_any_host_is_touched(site: dict[str, Path]) -> None:
    p, _ = cli(site, "-e", '{"nccl_ib_timeout": 40}')
    assert p.returncode == 1, p.stdout + p.stderr
    assert "NCCL001" in p.stderr and "nccl_ib_timeout = 40 is out of range: expected an integer 1-31" in p.stderr
    assert "refusing to run: 1 validation error(s)" in p.stderr
    assert not site["runs"].exists() and list(site["out"].iterdir()) == []  # no run started, nothing written
    # key=value gives a string, as ansible-playbook does: the rule sees the string the play would see
    s, _ = cli(site, "-e", "nccl_ib_timeout=20")
    assert s.returncode == 1 and "nccl_ib_timeout = '20' is a string" in s.stderr, s.stderr
    bad, _ = cli(site, "-e", "just-a-word")
    assert bad.returncode == 2 and "-e 'just-a-word': expected key=value" in bad.stderr


def test_valid_override_reaches_the_play_and_the_inventory_is_parsed_once(site: dict[str, Path]) -> None:
    (site["tmp"] / "more.yml").write_text("marker: from-file\n")
    more = f"@{site['tmp'] / 'more.yml'}"
    check, parses = cli(site, "--check", "--json", "-e", '{"nccl_ib_timeout": 20}', "-e", more)
    assert check.returncode == 0, check.stdout + check.stderr
    assert parses == 1  # load_fleet; the limit is resolved on the same InventoryManager (was 3 before)
    assert json.loads(check.stdout)["hosts"]["alpha"]["changed"] == 1
    assert list(site["out"].iterdir()) == []  # check mode

    run, _ = cli(site, "--json", "-e", '{"nccl_ib_timeout": 20}', "-e", "marker=from-cli")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (site["out"] / "alpha.txt").read_text() == "20 from-cli\n"
