"""The ledger across a real kill: `provision run` killed (SIGKILL) while its playbook runs leaves the run, and the
host's outcome, reading `interrupted` in `provision status` / `history`; a run that finishes reads its outcome.
A local-connection host and a playbook that waits (no root, no network)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

SLOW = """
- name: Wait long enough to be killed
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Wait
      ansible.builtin.wait_for:
        timeout: {seconds}
"""


@pytest.fixture()
def site(tmp_path: Path) -> dict[str, Path]:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.ini").write_text("[gpu_nodes]\nalpha ansible_connection=local\n")
    (inv / "group_vars" / "gpu_nodes.yml").write_text(
        f"ansible_python_interpreter: {sys.executable}\ngpu_model: H100-SXM5-80GB\ngpu_count: 8\n"
        "fabric: ethernet\nbootstrap_interface: eth0\n")
    for name, seconds in (("slow.yml", 120), ("quick.yml", 0)):
        (tmp_path / name).write_text(SLOW.format(seconds=seconds))
    return {"inv": inv / "hosts.ini", "tmp": tmp_path, "db": tmp_path / "ledger.sqlite3"}


def env(site: dict[str, Path]) -> dict[str, str]:
    return dict(os.environ, PROVISION_RUNS_DIR=str(site["tmp"] / "runs"), PROVISION_LEDGER=str(site["db"]),
                COLUMNS="300", ANSIBLE_CACHE_PLUGIN_CONNECTION=str(site["tmp"] / "facts"))


def provision(site: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provisioner.cli", *args], capture_output=True, text=True,
                          env=env(site), timeout=300)


def status(site: dict[str, Path]) -> dict[str, object]:
    p = provision(site, "status", str(site["inv"]), "--format", "json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["hosts"][0]["last_run"]


def test_a_killed_run_reads_interrupted_and_a_finished_one_its_outcome(site: dict[str, Path]) -> None:
    cmd = [sys.executable, "-m", "provisioner.cli", "run", str(site["inv"]), "--playbook",
           str(site["tmp"] / "slow.yml"), "--skip-preflight", "--quiet"]
    proc = subprocess.Popen(cmd, env=env(site), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group: the kill takes ansible with it
    _kill_once_under_way(proc, site, "run")
    last = status(site)
    assert last["status"] == "interrupted" and last["outcome"] == "interrupted", last
    h = json.loads(provision(site, "history", "alpha", "--format", "json").stdout)
    assert h["runs"][0]["status"] == "interrupted"

    p = provision(site, "run", str(site["inv"]), "--playbook", str(site["tmp"] / "quick.yml"), "--skip-preflight",
                  "--quiet")
    assert p.returncode == 0 and "warning: ledger" not in p.stderr, p.stdout + p.stderr
    last = status(site)
    assert (last["status"], last["outcome"], last["command"]) == ("ok", "ok", "run"), last
    runs = json.loads(provision(site, "history", "alpha", "--format", "json").stdout)["runs"]
    assert [r["status"] for r in runs] == ["ok", "interrupted"]


UPGRADE_RUN = """
import sys
from pathlib import Path
from provisioner.runner import make_progress, run_playbook
# what `provision upgrade` does for a batch: the roles on the members by --limit, no `targeted` list given
run_playbook(Path(sys.argv[1]), command="upgrade", limit="alpha,beta", playbook=Path(sys.argv[2]),
             skip_tags="vllm", extravars={"provision_allow_reboot": True}, progress=make_progress("none"))
"""


def test_a_killed_upgrade_run_is_interrupted_for_every_host_it_targeted(site: dict[str, Path]) -> None:
    """Issue 43: a SIGKILLed `provision upgrade` left its run `running` with no per-host rows, and `history` showed
    nothing of it. The upgrade's playbook run (run_playbook with a --limit, as upgrade.py calls it) is killed: both
    members read `interrupted` in `status` and `history`, and the next open writes it into the ledger."""
    (site["inv"]).write_text("[gpu_nodes]\nalpha ansible_connection=local\nbeta ansible_connection=local\n")
    script = site["tmp"] / "upgrade_run.py"
    script.write_text(UPGRADE_RUN)
    proc = subprocess.Popen([sys.executable, str(script), str(site["inv"]), str(site["tmp"] / "slow.yml")],
                            env=env(site), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    _kill_once_under_way(proc, site, "upgrade")
    p = provision(site, "status", str(site["inv"]), "--format", "json")
    assert p.returncode == 0, p.stderr
    rows = {h["host"]: h["last_run"] for h in json.loads(p.stdout)["hosts"]}
    for host in ("alpha", "beta"):
        assert rows[host] is not None and rows[host]["command"] == "upgrade", rows
        assert rows[host]["status"] == rows[host]["outcome"] == "interrupted", rows
        h = json.loads(provision(site, "history", host, "-i", str(site["inv"]), "--format", "json").stdout)
        assert [(r["command"], r["status"], r["outcome"]) for r in h["runs"]] == [
            ("upgrade", "interrupted", "interrupted")], h
    db = sqlite3.connect(site["db"])  # written, not only read so: another controller sees it too
    assert db.execute("SELECT status FROM runs").fetchall() == [("interrupted",)]
    assert sorted(db.execute("SELECT host, status FROM host_outcomes").fetchall()) == [
        ("alpha", "interrupted"), ("beta", "interrupted")]


def _kill_once_under_way(proc: subprocess.Popen[str], site: dict[str, Path], kind: str) -> None:
    """SIGKILL `proc`'s process group once its run row is open and its playbook (run dir `*-KIND`) is under way."""
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if site["db"].exists() and list((site["tmp"] / "runs").glob(f"*-{kind}/artifacts/ansible/job_events/*")):
                with closing(sqlite3.connect(site["db"])) as db:
                    if db.execute("SELECT COUNT(*) FROM runs WHERE ended IS NULL").fetchone()[0]:
                        break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.5)
        else:
            pytest.fail("the run never started")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
