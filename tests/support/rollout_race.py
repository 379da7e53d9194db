"""Two `provision upgrade` processes started at once on one ledger, interleaved deterministically: A is held right
after its open-rollout check found none; B is started and released once it has made its own check (no atomic
check-and-claim: both start a rollout) or announced that it waits for the ledger's write transaction
(`Ledger.atomic`: A holds it). A then records its rollout and is held in its rollout loop (alive, `running`) until
B has finished. No sleep orders anything: each step waits for a file the other side writes. The hooks wrap
`Ledger.open_rollout`, `Ledger.atomic` and the executor's rollout loop from outside (a wrapper script). The
inventory: tests/support/two_clusters.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ledger_race import wait_for

WRAPPER = r'''
import os, sys, time
from pathlib import Path
from provisioner.ledger.store import Ledger
import provisioner.day2.executor as executor

sig, me = Path(os.environ["RACE_DIR"]), os.environ["RACE_NAME"]

def hold(name):
    (sig / f"{me}.{name}").write_text(str(os.getpid()))
    end = time.monotonic() + 120
    while not (sig / f"{me}.{name}.go").exists():
        if time.monotonic() > end:
            raise SystemExit(f"{me}: never released at {name}")
        time.sleep(0.01)

real_open = Ledger.open_rollout
def open_rollout(self, *a, **kw):
    ro = real_open(self, *a, **kw)
    if me == "A" and not (sig / "A.checked").exists():
        hold("checked")
    elif me == "B":
        (sig / "B.checked").write_text(str(os.getpid()))
    return ro
Ledger.open_rollout = open_rollout

real_atomic = Ledger.atomic
def atomic(self):
    (sig / f"{me}.locking").write_text(str(os.getpid()))
    return real_atomic(self)
Ledger.atomic = atomic

def roll(ops, ledger, rid, *a, **kw):  # no node is touched: A stays alive and running until released
    if me == "A":
        hold("rolling")
    return True
executor.roll = roll  # `provision upgrade` imports it from the day-2 executor when it runs

from provisioner.cli import main
sys.argv = ["provision", *sys.argv[1:]]
main()
'''


def race(tmp: Path, inv: Path, ledger: str, *, blocked: Callable[[], bool] | None = None,
         ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str], str]:
    """A's and B's results, and how B was let go: `checked` (it checked while A was between its check and its
    claim) or `locking` (it waited for A's transaction); `blocked()`: an extra check that B waits on the lock
    (PostgreSQL's pg_locks)."""
    sig = tmp / "race"
    sig.mkdir()
    script = tmp / "rollout_race_wrapper.py"
    script.write_text(WRAPPER)
    env = dict(os.environ, PROVISION_LEDGER=ledger, PROVISION_RUNS_DIR=str(tmp / "runs"), RACE_DIR=str(sig),
               COLUMNS="200")

    def start(name: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(script), "upgrade", str(inv), "--wait", "0"],
                                env={**env, "RACE_NAME": name}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    a = start("A")
    procs = [a]
    try:
        wait_for(lambda: (sig / "A.checked").exists(), procs)
        b = start("B")
        procs.append(b)
        wait_for(lambda: (sig / "B.checked").exists() or (sig / "B.locking").exists() or b.poll() is not None,
                 [a])
        how = "checked" if (sig / "B.checked").exists() else "locking"
        if how == "locking" and blocked is not None:
            wait_for(blocked, procs)
        (sig / "A.checked.go").touch()
        wait_for(lambda: (sig / "A.rolling").exists(), [a])  # A recorded its rollout and is in its loop
        bo, be = b.communicate(timeout=300)
        (sig / "A.rolling.go").touch()
        ao, ae = a.communicate(timeout=300)
        return (subprocess.CompletedProcess(a.args, a.returncode, ao, ae),
                subprocess.CompletedProcess(b.args, b.returncode, bo, be), how)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
