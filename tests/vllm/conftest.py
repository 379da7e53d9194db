"""A simulated rack with the vLLM golden layer, brought up and onboarded once per session by `make demo-vllm`'s
own commands.

Session fixture `vllm_rack`: runs the commands of the Makefile's `demo-vllm` target (the README's demo) through
`.venv/bin/provision`, on rack PROVISIONER_VLLM_RACK (default `vllm`) instead of the Makefile's `demo-vllm`:
`provision testbed up --name NAME --nodes 3 --balancers 1 --with-vllm --spec tests/vllm/rack-spec.yaml` (builds or
reuses the base root and the golden layer; its inventory writer makes the inventory CPU-vLLM ready, nothing is
patched afterwards), then `provision onboard inventories/testbed-NAME/hosts.ini node01 node02 node03 --serial 3`
(preflight, site.yml without the vLLM launch, health gate, in-service mark, then the vLLM launch that requires the
mark), while polling each cluster head's /health from the controller, and alongside it `provision run ... --limit
lb` (nginx on lb01, the balancer host, which is also the rack's monitoring host: Prometheus and Alertmanager of the
alert loop, whose fault watch on the nodes the onboarding's site.yml installs). It records the time from the
onboard's start to the first 200 of each cluster (printed, and written to .runs/vllm-testbed-timings.json).
A broken demo therefore fails the suite (test_demo_vllm.py names it).
PROVISIONER_TESTBED_TEARDOWN=1 removes the rack at the end when this session created it.

The lane keeps its own ledger (PROVISION_LEDGER, unless set): the rack lanes run beside it with hosts of the same
names, and lifecycle states are per host name, so one shared ledger mixed their transitions (a rack-b onboarding
moved this rack's node02 in the middle of the quarantine test).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# the racks' inventories vault their secrets: the password file through ANSIBLE_VAULT_PASSWORD_FILE, as a site's
from provisioner_testbed import vault

vault.export_for_tests()

from vllm_e2e import MAKEFILE, RUN_TIMEOUT, VllmRack, demo_commands, http  # noqa: E402

from provisioner import PROJECT_ROOT  # noqa: E402  (after the vault environment)

os.environ.setdefault("PROVISION_LEDGER", str(PROJECT_ROOT / ".runs" / "ledger-vllm-lane.sqlite3"))


@pytest.fixture(scope="session")
def vllm_rack() -> Iterator[VllmRack]:
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root")
    from provisioner.inventory import load_fleet
    from provisioner_testbed import rack, vllm_image

    name = os.environ.get("PROVISIONER_VLLM_RACK", "vllm")
    existed = rack.RackState.load(name) is not None
    up_cmd, onboard_cmd, edge_cmd = demo_commands(MAKEFILE.read_text(), name)
    t_up = time.monotonic()
    p = subprocess.run(up_cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=PROJECT_ROOT)
    up_s = round(time.monotonic() - t_up, 1)
    print(f"testbed up ({up_s} s): {p.stderr.strip()[-3000:]}")
    if p.returncode != 0:
        pytest.fail(f"`{' '.join(up_cmd)}` exited {p.returncode}:\n{(p.stdout + p.stderr)[-4000:]}")
    h = rack.handle(rack.load(name))
    inv = PROJECT_ROOT / onboard_cmd[2]
    assert inv == Path(h.inventory), (inv, h.inventory)
    fleet = load_fleet(inv)
    heads = {c.name: str(fleet.hosts[c.head].get("vllm_host_ip") or fleet.hosts[c.head].address)
             for c in fleet.clusters.values()}
    ports = {c.name: int(c.settings.get("port", 8000)) for c in fleet.clusters.values()}
    vr = VllmRack(h, inv, heads, ports, vllm_image.TESTBED_API_KEY, up_s=up_s, commands=[up_cmd])

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
    skip_run = os.environ.get("PROVISIONER_VLLM_SKIP_RUN") == "1"  # developer loop on an already provisioned rack
    edge: subprocess.Popen[str] | None = None
    if not skip_run:
        # the balancer host (nginx in front of both heads; Prometheus + Alertmanager: lb01 is the rack's monitoring
        # host) alongside the onboarding: it needs nothing of the nodes but their addresses
        t_edge = time.monotonic()
        edge = subprocess.Popen(edge_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=PROJECT_ROOT)
    if skip_run:
        vr.run_rc, vr.run_output = 0, "skipped (PROVISIONER_VLLM_SKIP_RUN=1)"
    else:
        # the real onboarding path: preflight, site.yml without the vLLM launch (all hosts in one batch), the
        # health gate, the in-service mark, then the vLLM launch (the launch starts only on marked clusters)
        p = subprocess.run(onboard_cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=PROJECT_ROOT)
        vr.run_rc, vr.run_output = p.returncode, p.stdout + p.stderr
        vr.commands.append(onboard_cmd)
    vr.run_s = round(time.monotonic() - t0, 1)
    if edge is not None:
        out, _ = edge.communicate(timeout=RUN_TIMEOUT)
        vr.edge_rc, vr.edge_output, vr.edge_s = edge.returncode, out, round(time.monotonic() - t_edge, 1)
        vr.commands.append(edge_cmd)
    # the run waits for /health itself; give the poller a last look
    deadline = time.monotonic() + 30
    while len(vr.first_healthy_s) < len(heads) and time.monotonic() < deadline:
        time.sleep(1)
    stop.set()
    timings = {"rack": name, "reused_rack": existed, "up_s": up_s, "run_rc": vr.run_rc, "run_s": vr.run_s,
               "first_healthy_s": vr.first_healthy_s, "edge_rc": vr.edge_rc, "edge_s": vr.edge_s}
    print(f"vllm testbed timings: {json.dumps(timings)}")
    runs = PROJECT_ROOT / ".runs"
    runs.mkdir(exist_ok=True)
    (runs / "vllm-testbed-timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    yield vr
    if not existed and os.environ.get("PROVISIONER_TESTBED_TEARDOWN") == "1":
        rack.down(name)


#: Modules that run after all others, in this order (pytest keeps the others' order).
LAST = ("test_vllm_balancer.py", "test_airgap.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """test_vllm_balancer.py runs after the others: its rolling driver upgrade leaves the nodes on the newer driver,
    which only its own inventory says (the other modules read the rack's inventory and expect a second run to change
    nothing). test_airgap.py last of all: it resets node03 to a bare host and makes node01 an isolated site's mirror."""
    items.sort(key=lambda item: (LAST.index(n) + 1) if (n := Path(str(item.fspath)).name) in LAST else 0)
