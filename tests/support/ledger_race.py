"""Two `provision drain` processes, one per cluster of a model, interleaved deterministically at the last-cluster
check: process A is held right after its check said yes; B is started and released only once it has made its own
check (no atomic check-and-write: both drain, the bug of issue 43) or announced that it waits for the ledger's
write transaction (`Ledger.atomic`: A holds it); then both go on. No sleep orders anything: each step waits for a
file the other side writes. The hooks wrap `provisioner.day2.lifecycle.transition` and, where it exists,
`Ledger.atomic` from outside (a wrapper script), so the same test runs against code with or without the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

INI = """\
[gpu_nodes]
node01 ansible_host=127.0.0.1 ansible_port=1
node02 ansible_host=127.0.0.1 ansible_port=1

[c1]
node01

[c2]
node02
"""
CLUSTER = {"model": "/models/tiny", "served_model_name": "tiny", "tensor_parallel_size": 1, "max_model_len": 512,
           "max_num_seqs": 4}
GROUP_VARS = {"c1": {"vllm_cluster": {**CLUSTER, "port": 8000}}, "c2": {"vllm_cluster": {**CLUSTER, "port": 8001}}}

WRAPPER = r'''
import os, sys, time
from pathlib import Path
import provisioner.day2.lifecycle as lc
from provisioner.ledger.store import Ledger

sig, me = Path(os.environ["RACE_DIR"]), os.environ["RACE_NAME"]
real = lc.transition

def transition(current, target, **kw):
    res = real(current, target, **kw)  # a refusal raises here, before any wait
    if target == "draining" and not (sig / f"{me}.checked").exists():
        (sig / f"{me}.checked").write_text(str(os.getpid()))
        end = time.monotonic() + 120
        while not (sig / f"{me}.go").exists():
            if time.monotonic() > end:
                raise SystemExit(f"{me}: never released")
            time.sleep(0.01)
    return res

lc.transition = transition
if hasattr(Ledger, "atomic"):
    real_atomic = Ledger.atomic
    def atomic(self):
        (sig / f"{me}.locking").write_text(str(os.getpid()))
        return real_atomic(self)
    Ledger.atomic = atomic

from provisioner.cli import main
sys.argv = ["provision", *sys.argv[1:]]
main()
'''


def wait_for(what: Callable[[], bool], procs: list[subprocess.Popen[str]], timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not what():
        for p in procs:
            if p.poll() is not None:
                out, err = p.communicate()
                raise AssertionError(f"a drain exited early ({p.returncode}): {out}{err}")
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.01)


def race(tmp: Path, inv: Path, ledger: str, *, blocked: Callable[[], bool] | None = None,
         ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str], str]:
    """Drain c1 (A) and c2 (B) as above; `blocked()`: an extra check that B waits on the lock (PostgreSQL's
    pg_locks). Returns A's and B's results and how B was released: `checked` or `locking`."""
    sig = tmp / "race"
    sig.mkdir()
    script = tmp / "race_wrapper.py"
    script.write_text(WRAPPER)
    env = dict(os.environ, PROVISION_LEDGER=ledger, PROVISION_RUNS_DIR=str(tmp / "runs"), RACE_DIR=str(sig),
               COLUMNS="200")

    def start(name: str, cluster: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(script), "drain", str(inv), cluster, "--reason", f"race {name}",
                                 "--wait", "0"], env={**env, "RACE_NAME": name}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    a = start("A", "c1")
    procs = [a]
    try:
        wait_for(lambda: (sig / "A.checked").exists(), procs)
        b = start("B", "c2")
        procs.append(b)
        wait_for(lambda: (sig / "B.checked").exists() or (sig / "B.locking").exists(), procs)
        how = "checked" if (sig / "B.checked").exists() else "locking"
        if how == "locking" and blocked is not None:
            wait_for(blocked, procs)
        (sig / "A.go").touch()
        (sig / "B.go").touch()
        out = []
        for p in procs:
            o, e = p.communicate(timeout=300)
            out.append(subprocess.CompletedProcess(p.args, p.returncode, o, e))
        return out[0], out[1], how
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def open_site(ledger: str, inv: Path):  # type: ignore[no-untyped-def]
    """The ledger of `inv`'s site (its resolved path); a ledger without sites (the code before issue 43, which this
    harness also runs against to show the race) is opened as it is."""
    import inspect

    from provisioner.ledger import Ledger

    if "site" in inspect.signature(Ledger.open).parameters:
        return Ledger.open(ledger, site=str(Path(inv).resolve()))
    return Ledger.open(ledger)


def seed_serving(ledger: str, inv: Path) -> None:
    """node01 (c1) and node02 (c2) in service: c1 and c2 both serve the model."""
    with open_site(ledger, inv) as lg:
        for h in ("node01", "node02"):
            for a, b in (("new", "provisioning"), ("provisioning", "burn-in"), ("burn-in", "in-service")):
                lg.record_transition(h, a, b, reason="seed", actor="test")


def states(ledger: str, inv: Path) -> dict[str, str]:
    with open_site(ledger, inv) as lg:
        return {h: lg.state(h)[0] for h in ("node01", "node02")}
