"""The holder scan that `provision upgrade` and remediation's GPU reset run on a node (`remedy.holders_script`), run
by a real shell against real processes of this machine holding files of a stand-in device directory: every NVIDIA
device kind is found and named (pid, device, command), the suite's own daemons are not, and nothing else is."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.probes.remedy import holder_names, holders_script

#: open FILE, rename this process (its /proc comm) to NAME, and wait
HOLD = ("import ctypes, sys, time; f = open(sys.argv[1]); "
        "ctypes.CDLL(None).prctl(15, sys.argv[2].encode(), 0, 0, 0); print('ready', flush=True); time.sleep(300)")


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[dict[str, int]]:
    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in ("nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-caps/nvidia-cap1", "nvidia-modeset", "not-nvidia"):
        (dev / name).touch()
    who = {"gpu-job": "nvidia3", "ctl-job": "nvidiactl", "uvm-job": "nvidia-uvm", "caps-job": "nvidia-caps/nvidia-cap1",
           "nvidia-persiste": "nvidia3", "nv-fabricmanage": "nvidiactl", "bystander": "not-nvidia"}
    procs = {name: subprocess.Popen([sys.executable, "-c", HOLD, str(dev / f), name], stdout=subprocess.PIPE, text=True)
             for name, f in who.items()}
    try:
        for p in procs.values():
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield {"dev": str(dev), **{n: p.pid for n, p in procs.items()}}  # type: ignore[dict-item]
    finally:
        for p in procs.values():
            p.kill()
            p.wait(timeout=10)


def test_every_device_kind_is_named_and_the_suites_daemons_are_not(holders: dict) -> None:
    dev = holders["dev"]
    out = subprocess.run(["sh", "-c", holders_script(dev)], capture_output=True, text=True, timeout=60).stdout
    found = {ln.split(" ", 2)[2]: ln for ln in out.splitlines()}
    want = {"gpu-job": "nvidia3", "ctl-job": "nvidiactl", "uvm-job": "nvidia-uvm",
            "caps-job": "nvidia-caps/nvidia-cap1"}
    assert set(found) == set(want), out
    for name, f in want.items():
        assert found[name] == f"{holders[name]} {dev}/{f} {name}", out
    names = holder_names(out)
    assert f"pid {holders['ctl-job']} (ctl-job) on {dev}/nvidiactl" in names, names


def test_nothing_held_prints_nothing(tmp_path: Path) -> None:
    (tmp_path / "nvidia0").touch()
    out = subprocess.run(["sh", "-c", holders_script(str(tmp_path))], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "", out
