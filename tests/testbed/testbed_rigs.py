"""Shared scaffolding for the rack tests: a module-scoped rack of their own, and the "vLLM files only" play.

`own_rack(env, default, nodes)`: skip without root; bring up (or reuse) rack `$env` (default name `default`) with
`nodes` hosts; after the module, remove it when this run created it and PROVISIONER_TESTBED_TEARDOWN=1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml


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
