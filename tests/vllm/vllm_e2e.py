"""Helpers shared by the vLLM end-to-end tests (imported by conftest.py and the tests)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from makefile_recipe import make_recipe  # tests/support

PROVISION = str(Path(sys.executable).parent / "provision")
SPEC = Path(__file__).with_name("rack-spec.yaml")  # one GPU per simulated node: TP 1 x PP n is valid
NODES = 3
RUN_TIMEOUT = 3600
MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"
LB_HOST = "lb01"  # the balancer host (`testbed up --balancers 1`)
#: The README's demo: `make demo-vllm`. The session fixture runs exactly its commands (on its own rack name).
DEMO_TARGET = "demo-vllm"


def demo_commands(makefile: str, rack: str, provision: str = PROVISION) -> list[list[str]]:
    """`make demo-vllm`'s commands as argv lists, on rack `rack` instead of the Makefile's (same flags, same
    hosts, that rack's inventory)."""
    argvs = [shlex.split(cmd.replace("$(VENV)/bin/provision", provision))
             for cmd in make_recipe(makefile, DEMO_TARGET)]
    demo = next((argv[argv.index("--name") + 1] for argv in argvs if "--name" in argv), None)
    if demo is None or any(argv[0] != provision for argv in argvs):
        raise ValueError(f"`make {DEMO_TARGET}` must run only `provision` and name its rack with --name: {argvs}")
    from provisioner import PROJECT_ROOT
    from provisioner_testbed.inventory_writer import inventory_dir

    def inv(name: str) -> str:
        return str((inventory_dir(name) / "hosts.ini").relative_to(PROJECT_ROOT))

    swap = {demo: rack, inv(demo): inv(rack)}
    return [[swap.get(a, a) if (i and argv[i - 1] == "--name") or a == inv(demo) else a
             for i, a in enumerate(argv)] for argv in argvs]


def http(url: str, *, data: dict | None = None, key: str | None = None, timeout: float = 60) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(data).encode() if data is not None else None)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - our own test hosts
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


@dataclass
class VllmRack:
    handle: object
    inventory: Path
    heads: dict[str, str]  # cluster -> head address
    ports: dict[str, int]
    api_key: str
    first_healthy_s: dict[str, float] = field(default_factory=dict)
    run_rc: int = -1
    run_s: float = 0.0
    up_s: float = 0.0
    run_output: str = ""
    edge_rc: int = -1  # `provision run INV --limit lb`: nginx on the balancer host
    edge_s: float = 0.0
    edge_output: str = ""
    commands: list[list[str]] = field(default_factory=list)  # what the fixture ran (the demo's CLI calls)

    def url(self, cluster: str, path: str) -> str:
        return f"http://{self.heads[cluster]}:{self.ports[cluster]}{path}"

    def ssh(self, host: str, command: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return self.handle.ssh(host, command, timeout=timeout)  # type: ignore[attr-defined]

    def wait_healthy(self, cluster: str, timeout: float) -> float | None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if http(self.url(cluster, "/health"), timeout=10)[0] == 200:
                return time.monotonic() - t0
            time.sleep(2)
        return None

    def out_of_balancer(self) -> list[str]:
        """Clusters whose head the balancer's live configuration has `down` (drained or failing its check)."""
        from provisioner_testbed import wedge

        return [c for c in self.heads
                if wedge.marked_down(self.handle, LB_HOST, f"{self.heads[c]}:{self.ports[c]}")]  # type: ignore[arg-type]

    def wait_in_balancer(self, timeout: float) -> float | None:
        """Seconds until the balancer has every head up again (its active check takes a head back at its first
        passing probe, up to one timer interval after the head answers), None when it did not within timeout.
        A head healthy at its own port is not yet one the balancer sends requests to (seen in CI: six requests
        all went to one cluster right after the other's worker restarted)."""
        from provisioner_testbed import wedge

        return wedge.wait_for(lambda: not self.out_of_balancer(), timeout, poll=2)

    def balancer_why(self) -> str:
        """The live configuration's server lines and the active check's last runs, for a failure message."""
        from provisioner_testbed import wedge

        r = self.ssh(LB_HOST, f"grep -n server {wedge.LB_CONF}; journalctl -u vllm-lb-healthcheck.service -n 12 "
                              "-o cat --no-pager")
        return (r.stdout + r.stderr)[-4000:]
