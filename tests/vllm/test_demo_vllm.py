"""`make demo-vllm` (the README's demo) works: the session rack was made by exactly its CLI calls, and both
clusters serve. A broken demo (a Makefile edit, an inventory that needs patching after `testbed up`) fails here."""

from __future__ import annotations

import json
import os

import pytest

from vllm_e2e import MAKEFILE, VllmRack, demo_commands, http

pytestmark = pytest.mark.vllm


def test_the_session_rack_is_make_demo_vllm(vllm_rack: VllmRack) -> None:
    if os.environ.get("PROVISIONER_VLLM_SKIP_RUN") == "1":
        pytest.skip("PROVISIONER_VLLM_SKIP_RUN=1: the onboard step was not run")
    # the fixture ran the Makefile's recipe, command for command (only the rack's name differs)
    assert vllm_rack.commands == demo_commands(MAKEFILE.read_text(), vllm_rack.handle.name)  # type: ignore[attr-defined]
    assert [c[1] for c in vllm_rack.commands] == ["testbed", "onboard"]
    assert vllm_rack.run_rc == 0, vllm_rack.run_output[-4000:]
    for cluster in ("vllm_pp", "vllm_single"):
        assert http(vllm_rack.url(cluster, "/health"))[0] == 200, cluster
        body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
        code, text = http(vllm_rack.url(cluster, "/v1/completions"), data=body, key=vllm_rack.api_key, timeout=300)
        assert code == 200, (cluster, text)
        assert json.loads(text)["usage"]["completion_tokens"] == 4
