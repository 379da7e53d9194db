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
    assert [c[1] for c in vllm_rack.commands] == ["testbed", "onboard", "run"]
    assert vllm_rack.run_rc == 0, vllm_rack.run_output[-4000:]
    assert vllm_rack.edge_rc == 0, vllm_rack.edge_output[-4000:]
    for cluster in ("vllm_pp", "vllm_single"):
        assert http(vllm_rack.url(cluster, "/health"))[0] == 200, cluster
        body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
        code, text = http(vllm_rack.url(cluster, "/v1/completions"), data=body, key=vllm_rack.api_key, timeout=300)
        assert code == 200, (cluster, text)
        assert json.loads(text)["usage"]["completion_tokens"] == 4


def test_the_demo_says_where_each_cluster_answers_and_its_curl_works(vllm_rack: VllmRack) -> None:
    """Issue 28 item 9: onboard ends with each launched cluster's endpoint, model, where the key is and a curl line
    that works as printed (run from the checkout, as the operator would paste it); the key itself is never printed."""
    import subprocess

    from provisioner import PROJECT_ROOT

    if os.environ.get("PROVISIONER_VLLM_SKIP_RUN") == "1":
        pytest.skip("PROVISIONER_VLLM_SKIP_RUN=1: the onboard step was not run")
    out = vllm_rack.run_output
    assert "serving: 2 vLLM clusters" in out, out[-3000:]
    assert vllm_rack.api_key not in out
    curls = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("curl -s http")]
    assert len(curls) == 2, curls
    lines = [ln.strip() for ln in out.splitlines()]
    for cluster in ("vllm_pp", "vllm_single"):
        assert any(ln.startswith(f"{cluster}: http://") and "model tiny-llama" in ln for ln in lines), cluster
    # the rack's key is vaulted (as a site's is): the lines say so and tell the operator to export it, and the curl
    # line reads $VLLM_API_KEY; the test does what the line says, then runs the curl as printed
    assert any("vaulted" in ln and "export VLLM_API_KEY" in ln for ln in lines), out[-3000:]
    env = {**os.environ, "VLLM_API_KEY": vllm_rack.api_key}
    for line in curls:
        assert "$VLLM_API_KEY" in line, line
        p = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT, env=env)
        assert p.returncode == 0 and "tiny-llama" in p.stdout, (line, p.stdout[-500:], p.stderr[-500:])


def test_the_demo_balancer_host_fronts_both_clusters(vllm_rack: VllmRack) -> None:
    """The demo's third command put nginx on lb01 (group lb, no GPU stack): the model answers through it on port
    8000 with the API key, and lb01 is not a GPU node of the inventory. It is the rack's monitoring host too."""
    from provisioner.inventory import load_fleet

    if os.environ.get("PROVISIONER_VLLM_SKIP_RUN") == "1":
        pytest.skip("PROVISIONER_VLLM_SKIP_RUN=1: the demo's commands were not run")
    fleet = load_fleet(vllm_rack.inventory)
    lb = fleet.hosts["lb01"]
    assert not lb.is_gpu_node and "lb" in lb.groups
    assert [h.name for h in fleet.gpu_nodes] == ["node01", "node02", "node03"]
    body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    code, text = http(f"http://{lb.address}:8000/v1/completions", data=body, key=vllm_rack.api_key, timeout=300)
    assert code == 200, text
    assert json.loads(text)["usage"]["completion_tokens"] == 4
    assert vllm_rack.handle.ssh("lb01", "systemctl is-active nginx").stdout.strip() == "active"  # type: ignore[attr-defined]
    # lb01 is also the rack's monitoring host: the alert loop's Prometheus and Alertmanager run from the start
    assert "monitoring" in lb.groups
    assert vllm_rack.handle.ssh(  # type: ignore[attr-defined]
        "lb01", "systemctl is-active prometheus prometheus-alertmanager").stdout.split() == ["active", "active"]
