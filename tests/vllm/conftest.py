"""A simulated rack with the vLLM golden layer, provisioned once per session with `provision run`.

Session fixture `vllm_rack`: brings up (or reuses) rack PROVISIONER_VLLM_RACK (default `vllm`, 3 nodes,
`--with-vllm`, one GPU per node: tests/vllm/rack-spec.yaml) (its inventory is CPU-vLLM ready as `testbed up` writes it), runs
`provision onboard INVENTORY node01 node02 node03 --serial 3` (preflight, site.yml without the vLLM launch, health gate,
in-service mark, then the vLLM launch that requires the mark) while polling each cluster head's /health from the controller, and records the time
from the run's start to the first 200 of each cluster (printed, and written to .runs/vllm-testbed-timings.json).
PROVISIONER_TESTBED_TEARDOWN=1 removes the rack at the end when this session created it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from provisioner import PROJECT_ROOT

from vllm_e2e import NODES, PROVISION, RUN_TIMEOUT, SPEC, VllmRack, http  # noqa: E402


@pytest.fixture(scope="session")
def vllm_rack() -> Iterator[VllmRack]:
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root")
    from provisioner.inventory import load_fleet
    from provisioner.testbed import rack, vllm_image

    name = os.environ.get("PROVISIONER_VLLM_RACK", "vllm")
    existed = rack.RackState.load(name) is not None
    h = rack.ensure(name, NODES, with_vllm=True, spec_file=SPEC, log=lambda m: print(f"testbed: {m}"))
    inv = Path(h.inventory)
    fleet = load_fleet(inv)
    heads = {c.name: str(fleet.hosts[c.head].get("vllm_host_ip") or fleet.hosts[c.head].address)
             for c in fleet.clusters.values()}
    ports = {c.name: int(c.settings.get("port", 8000)) for c in fleet.clusters.values()}
    vr = VllmRack(h, inv, heads, ports, vllm_image.TESTBED_API_KEY)

    stop = threading.Event()
    t0 = time.monotonic()

    def poll() -> None:
        while not stop.is_set() and len(vr.first_healthy_s) < len(heads):
            for c in heads:
                if c not in vr.first_healthy_s and http(vr.url(c, "/health"), timeout=5)[0] == 200:
                    vr.first_healthy_s[c] = round(time.monotonic() - t0, 1)
            stop.wait(2)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    if os.environ.get("PROVISIONER_VLLM_SKIP_RUN") == "1":  # developer loop on an already provisioned rack
        vr.run_rc, vr.run_output = 0, "skipped (PROVISIONER_VLLM_SKIP_RUN=1)"
    else:
        # the real onboarding path: preflight, site.yml without the vLLM launch (all hosts in one batch), the
        # health gate, the in-service mark, then the vLLM launch (the launch starts only on marked clusters)
        gpu_hosts = [n for n in h.names if fleet.hosts[n].is_gpu_node]
        p = subprocess.run([PROVISION, "onboard", str(inv), *gpu_hosts, "--serial", str(len(gpu_hosts))],
                           capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=PROJECT_ROOT)
        vr.run_rc, vr.run_output = p.returncode, p.stdout + p.stderr
    vr.run_s = round(time.monotonic() - t0, 1)
    # the run waits for /health itself; give the poller a last look
    deadline = time.monotonic() + 30
    while len(vr.first_healthy_s) < len(heads) and time.monotonic() < deadline:
        time.sleep(1)
    stop.set()
    timings = {"rack": name, "reused_rack": existed, "run_rc": vr.run_rc, "run_s": vr.run_s,
               "first_healthy_s": vr.first_healthy_s}
    print(f"vllm testbed timings: {json.dumps(timings)}")
    runs = PROJECT_ROOT / ".runs"
    runs.mkdir(exist_ok=True)
    (runs / "vllm-testbed-timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    yield vr
    if not existed and os.environ.get("PROVISIONER_TESTBED_TEARDOWN") == "1":
        rack.down(name)
