"""Shared scaffolding for the rack tests: a module-scoped rack of their own, the "vLLM files only" play, the CLI as
a rack test runs it, and the read-only proof's host snapshot.

`own_rack(env, default, nodes)`: skip without root; bring up (or reuse) rack `$env` (default name `default`) with
`nodes` hosts; after the module, remove it when this run created it and PROVISIONER_TESTBED_TEARDOWN=1.
`CliRig(handle, runs)`: `cli(*args)` runs `provision` with its own run directory, never a traceback.
`HOST_SNAPSHOT`: a shell script whose output changes with any change a run could make on a host.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import PROJECT_ROOT

PROVISION = [sys.executable, "-m", "provisioner.cli"]

# Everything a run could change on a host (drift's read-only proof compares it before/after): file contents and
# metadata under the managed trees, dpkg selections and states, unit states (enabled/active/masked), the nft ruleset.
HOST_SNAPSHOT = r"""
set -u
export LC_ALL=C
echo "## content"
find /etc /opt /usr/local /usr/lib/systemd /var/lib/dpkg /var/lib/apt/extended_states /var/lib/vllm -xdev -type f \
  ! -path '/var/lib/dpkg/lock*' ! -name '*-old' -print0 2>/dev/null | sort -z | xargs -0 sha256sum
echo "## metadata"
find /etc /usr /opt /var/lib -xdev \( -path /var/lib/apt/lists/partial -o -path /var/lib/systemd \
  -o -path /var/lib/dhcp -o -path /var/lib/private \) -prune -o ! -path '/var/lib/dpkg/lock*' \
  ! -path /var/lib/apt/lists/lock -printf '%p %y %m %U %G %s %T@ %l\n' 2>/dev/null | sort
echo "## packages"
dpkg-query -W -f='${Package} ${Version} ${Status}\n' | sort
dpkg --get-selections | sort
echo "## units"
for u in nvidia-persistenced nvidia-fabricmanager provisioner-firewall vllm vllm-worker; do
  echo "$u $(systemctl is-active $u) $(systemctl is-enabled $u 2>&1)"
done
echo "## nft"
nft list ruleset 2>&1 || echo "(no nft)"
"""


class CliRig:
    """A rack and a run directory of its own; `cli` runs `provision` as an operator does (fails on a traceback)."""

    def __init__(self, handle: Any, runs: Path) -> None:
        self.h = handle
        self.inv = str(handle.inventory)
        self.runs = runs

    def cli(self, *args: str, timeout: float = 2400) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PROVISION_RUNS_DIR=str(self.runs))
        p = subprocess.run([*PROVISION, *args], capture_output=True, text=True, env=env, timeout=timeout,
                           cwd=PROJECT_ROOT)
        assert "Traceback" not in p.stderr, p.stderr
        return p


@contextmanager
def own_rack(env: str, default: str, nodes: int) -> Iterator[Any]:
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root")
    from provisioner_testbed import rack

    name = os.environ.get(env, default)
    existed = rack.RackState.load(name) is not None
    h = rack.ensure(name, nodes, log=lambda m: print(f"testbed: {m}"))
    try:
        yield h
    finally:
        if not existed and os.environ.get("PROVISIONER_TESTBED_TEARDOWN") == "1":
            rack.down(name)


def vllm_files_play(name: str, play_vars: dict[str, Any] | None = None) -> str:
    """A play that runs the vllm role's rendering and vllm_launch (tag vllm_launch) on a plain rack (no vLLM)."""
    play: dict[str, Any] = {"name": name, "hosts": "gpu_nodes", "gather_facts": False, "become": True}
    if play_vars:
        play["vars"] = play_vars
    play["pre_tasks"] = [{
        "name": "What the vllm role would have made (service group, helper directory)",
        "tags": ["vllm_launch"],
        "block": [
            {"name": "Group", "ansible.builtin.group": {"name": "vllm", "system": True}},
            {"name": "Helper directory",
             "ansible.builtin.file": {"path": "/usr/local/libexec/provisioner", "state": "directory", "mode": "0755"}},
        ],
    }]
    play["roles"] = [{"role": "vllm"}, {"role": "vllm_launch", "tags": ["vllm_launch"]}]
    return "---\n" + yaml.safe_dump([play], sort_keys=False)
