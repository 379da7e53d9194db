"""A PP cluster that loses a member recovers without an operator (issue 16), on the CPU rack.

Three failures of the 2-host cluster vllm_pp (head node01, worker node02), each from a serving cluster:

- head killed: `kill -9` of the head's vLLM;
- worker network cut: every IPv4 frame to or from node02 dropped on the rack bridge, on the controller (an nftables
  `bridge` table of this test's own), restored after the head went down;
- worker power lost: the same cut first (so nothing node02 sends on the way down reaches anyone, as when the power
  goes), then `provision testbed stop node02`, then the cut is removed (the host is gone) and node02 started again.

Each asserts that the head stops answering /health with 200 within DETECT_BOUND_S (so the balancer takes it out
and VllmHeadDown / VllmClusterMemberDown fire: tests/fixtures/monitoring/alerts_test.yml), that it serves a
completion again on its own once the member is back, and records the times in .runs/vllm-testbed-recovery.json
(benchmarks/README.md, "Cluster recovery").
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from provisioner import PROJECT_ROOT

from vllm_e2e import PROVISION, VllmRack, http

pytestmark = pytest.mark.vllm

#: The documented detection bound: the head's watchdog probes each worker's member /health every
#: vllm_watch_interval (2 s, 3 s timeout) and stops after vllm_watch_misses (3) failures: <= 3 x 5 s + the stop.
DETECT_BOUND_S = 30
#: Back to serving after the member returns: both units restart, then vLLM's CPU start-up (75-125 s idle, several
#: times that on a shared 2-core machine).
RECOVERY_BOUND_S = 900
CLUSTER = "vllm_pp"
WORKER = "node02"
VLLM_PID = "pgrep -u vllm -f '^/opt/vllm/venv/bin/python[0-9.]* /opt/vllm/venv/bin/vllm serve'"
RESULTS = PROJECT_ROOT / ".runs/vllm-testbed-recovery.json"


def _record(key: str, value: dict) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    data[key] = value
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")


def _serving(rack: VllmRack) -> None:
    """Start from a serving cluster (a previous test may have left it restarting)."""
    assert rack.wait_healthy(CLUSTER, RECOVERY_BOUND_S) is not None, f"{CLUSTER} not serving before the fault"


def _wait_down(rack: VllmRack, t0: float) -> float:
    while time.monotonic() - t0 < DETECT_BOUND_S + 60:
        if http(rack.url(CLUSTER, "/health"), timeout=3)[0] != 200:
            return round(time.monotonic() - t0, 1)
        time.sleep(0.5)
    pytest.fail(f"the head of {CLUSTER} kept answering /health 200 for {DETECT_BOUND_S + 60} s after the fault")


def _back(rack: VllmRack, t_restored: float) -> float:
    back = rack.wait_healthy(CLUSTER, RECOVERY_BOUND_S)
    assert back is not None, f"{CLUSTER} not serving {RECOVERY_BOUND_S} s after the member came back"
    code, text = http(rack.url(CLUSTER, "/v1/completions"), key=rack.api_key, timeout=300,
                      data={"model": "tiny-llama", "prompt": "Hello", "max_tokens": 4})
    assert code == 200, text
    return round(time.monotonic() - t_restored, 1)


def _address(rack: VllmRack, host: str) -> str:
    return rack.handle.hosts[host]  # type: ignore[attr-defined]


@contextmanager
def _cut(rack: VllmRack, host: str) -> Iterator[None]:
    """Drop every IPv4 frame to/from `host` on its rack's bridge (forward: the other hosts; input/output: the
    controller). Our own table, removed on exit."""
    addr = _address(rack, host)
    table = re.sub(r"[^a-z0-9_]", "_", f"pvcut_{rack.handle.name}_{host}".lower())  # type: ignore[attr-defined]
    chains = "".join(
        f"\tchain {hook} {{\n\t\ttype filter hook {hook} priority -200; policy accept;\n"
        f"\t\tip saddr {addr} drop\n\t\tip daddr {addr} drop\n\t}}\n" for hook in ("forward", "input", "output"))
    subprocess.run(["nft", "-f", "-"], input=f"table bridge {table} {{\n{chains}}}\n", text=True, check=True)
    try:
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "bridge", table], check=False)


def _testbed(rack: VllmRack, action: str, host: str) -> None:
    p = subprocess.run([PROVISION, "testbed", action, "--name", rack.handle.name, host],  # type: ignore[attr-defined]
                       capture_output=True, text=True, timeout=600, cwd=PROJECT_ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]


def _journal_line(rack: VllmRack, host: str, pattern: str) -> str:
    out = rack.ssh(host, f"journalctl -u vllm --no-pager -o cat --since '-30min' | grep -E '{pattern}' | tail -1")
    return out.stdout.strip()


def test_killed_head_stops_serving_and_the_cluster_comes_back(vllm_rack: VllmRack) -> None:
    _serving(vllm_rack)
    pid = vllm_rack.ssh("node01", VLLM_PID).stdout.strip()
    assert pid.isdigit()
    t0 = time.monotonic()
    assert vllm_rack.ssh("node01", f"kill -9 {pid}").returncode == 0
    detect_s = _wait_down(vllm_rack, t0)
    assert detect_s <= DETECT_BOUND_S
    recover_s = _back(vllm_rack, t0)
    print(f"head kill: /health not 200 after {detect_s} s, serving again after {recover_s} s")
    _record("head_kill", {"detect_s": detect_s, "recover_s": recover_s, "bound_s": DETECT_BOUND_S})


def test_worker_network_cut_stops_the_head_and_the_cluster_comes_back(vllm_rack: VllmRack) -> None:
    _serving(vllm_rack)
    t0 = time.monotonic()
    with _cut(vllm_rack, WORKER):
        detect_s = _wait_down(vllm_rack, t0)
        # the worker's side gives up on its head too (its wrapper: head port gone)
        time.sleep(10)
        t_restored = time.monotonic()
    assert detect_s <= DETECT_BOUND_S, detect_s
    recover_s = _back(vllm_rack, t_restored)
    assert "member /health probes failed" in _journal_line(vllm_rack, "node01", "worker .* gone")
    print(f"network cut: /health not 200 after {detect_s} s; serving {recover_s} s after the network was back")
    _record("worker_network_cut", {"detect_s": detect_s, "recover_after_restore_s": recover_s,
                                   "bound_s": DETECT_BOUND_S})


def test_worker_power_loss_stops_the_head_and_the_cluster_comes_back(vllm_rack: VllmRack) -> None:
    _serving(vllm_rack)
    t0 = time.monotonic()
    try:
        with _cut(vllm_rack, WORKER):  # nothing the host sends while it goes down reaches anyone: a power cut
            _testbed(vllm_rack, "stop", WORKER)
        detect_s = _wait_down(vllm_rack, t0)
    finally:  # the worker comes back whatever happened: the lane's later tests need vllm_pp
        t_on = time.monotonic()
        _testbed(vllm_rack, "start", WORKER)  # boots; vllm.service is enabled
        boot_s = round(time.monotonic() - t_on, 1)
    assert detect_s <= DETECT_BOUND_S, detect_s
    recover_s = _back(vllm_rack, t_on)
    print(f"power loss: /health not 200 after {detect_s} s; host booted in {boot_s} s, serving {recover_s} s "
          "after power-on")
    _record("worker_power_loss", {"detect_s": detect_s, "boot_s": boot_s, "recover_after_power_on_s": recover_s,
                                  "bound_s": DETECT_BOUND_S})
