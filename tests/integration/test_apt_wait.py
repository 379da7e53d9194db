"""`make deps` (.ci/install-deps.sh) waits for another apt/dpkg that holds the dpkg lock (a fresh Ubuntu machine's
unattended-upgrades) instead of failing at once: .ci/apt-wait.sh's `apt_wait`, on lock files of the test's own
(APT_LOCK_FILES), held with a POSIX lock as dpkg holds its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from provisioner import PROJECT_ROOT

HOLD = ("import fcntl, sys, time\nf = open(sys.argv[1], 'w')\nfcntl.lockf(f, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\ntime.sleep(float(sys.argv[2]))\n")


def _wait(lock: Path, bound: int) -> tuple[subprocess.CompletedProcess[str], float]:
    env = dict(os.environ, APT_LOCK_FILES=f"{lock.parent / 'absent'} {lock}")
    t = time.monotonic()
    r = subprocess.run(["bash", "-c", f". {PROJECT_ROOT / '.ci/apt-wait.sh'}; apt_wait {bound}"], env=env,
                       capture_output=True, text=True, timeout=60)
    return r, time.monotonic() - t


def _hold(lock: Path, seconds: float) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_free_locks_pass_at_once_and_silently(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    lock.touch()
    r, secs = _wait(lock, 5)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "" and secs < 3


def test_a_held_lock_is_waited_for_with_one_line(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    lock.touch()
    p = _hold(lock, 3)
    try:
        r, secs = _wait(lock, 30)
    finally:
        p.wait()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and f"(pid {p.pid}) to release {lock}" in lines[0] and "up to 30s" in lines[0]
    assert 1.5 < secs < 20


def test_the_wait_is_bounded(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    lock.touch()
    p = _hold(lock, 8)
    try:
        r, secs = _wait(lock, 2)
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 1 and f"still held by pid {p.pid} after 2s" in r.stderr and secs < 7


def test_install_deps_uses_it_before_every_apt_get() -> None:
    text = (PROJECT_ROOT / ".ci/install-deps.sh").read_text()
    calls = [ln for ln in text.splitlines() if "apt-get" in ln and not ln.lstrip().startswith("#")]
    assert calls and all('"${APT_LOCK_OPTS[@]}"' in ln for ln in calls), calls
    assert text.count("apt_wait\n") >= len(calls)
