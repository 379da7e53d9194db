"""The tier-1 probe (provisioner/drift/state.py PROBE) run for real on this machine as the drift runs it on a node (the
same shell command, the system's python3): files, directories, links and facts of its roots, the packages dpkg
knows, a venv's distributions; one JSON line (the state `parse_probe` reads); an environment's PYTHONPATH does not
reach it (`-I -S`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from provisioner.drift import state as hoststate

PY = shutil.which("python3", path="/usr/bin:/bin")
pytestmark = pytest.mark.skipif(PY is None or shutil.which("dpkg-query") is None, reason="needs python3 and dpkg")


def _run(cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", cmd.replace("python3 ", f"{PY} ", 1)], capture_output=True, text=True,
                          timeout=120, env=env)


def test_the_probe_reports_its_roots_packages_venvs_and_facts(tmp_path: Path) -> None:
    root = tmp_path / "etc-x"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.conf").write_bytes(b"alpha\n")
    (root / "sub" / "a.conf").chmod(0o640)
    (root / "link").symlink_to("sub/a.conf")
    venv = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (venv / "vllm-0.32.0.dist-info").mkdir(parents=True)
    fact = tmp_path / "version"
    fact.write_text("580.65.06\n")
    cmd = hoststate.probe_command(roots=[str(root), str(tmp_path / "missing")], venvs=[str(tmp_path / "venv")],
                                  facts=[str(fact)])
    # a module on PYTHONPATH named like what the probe imports must not be loaded into it
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "sitecustomize.py").write_text("raise SystemExit('loaded from PYTHONPATH')\n")
    r = _run(cmd, env=dict(os.environ, PYTHONPATH=str(evil)))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["version"] == hoststate.STATE_VERSION and doc["boot_id"]
    state = doc["state"]
    # this machine has unit files but no systemd running: the one error the probe may report here
    assert {k for k in state if k.startswith("error:")} <= {"error:systemctl"}
    if "error:systemctl" not in state:
        assert hoststate.parse_probe(r.stdout) == state
    st = (root / "sub" / "a.conf").stat()
    assert state[f"file:{root}/sub/a.conf"] == (f"{hashlib.sha256(b'alpha' + bytes([10])).hexdigest()} 640 "
                                                 f"{st.st_uid} {st.st_gid}")
    assert state[f"file:{root}/link"] == "link sub/a.conf"
    assert state[f"file:{root}/sub"].startswith("dir ")
    assert not any(k.startswith(f"file:{tmp_path}/missing") for k in state)
    assert state["package:dpkg"].split(" ", 1)[1] == "install ok installed"
    assert state[f"other:venv {tmp_path}/venv"] == hashlib.sha256(b"vllm-0.32.0.dist-info").hexdigest() + " 1"
    assert state[f"other:fact {fact}"] == "580.65.06"
    assert r.stdout.count("\n") == 1 and r.stdout.startswith('{"boot_id": ')
