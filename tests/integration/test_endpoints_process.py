"""The curl line `provision onboard` prints for a launched cluster, run by a real shell: its key expansion prints the
testbed's key from the inventory file (the unit test tests/unit/test_endpoints.py checks the rest in-process)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from provisioner.endpoints import cluster_endpoints, endpoint_lines, var_files
from provisioner.inventory import load_fleet
from provisioner_testbed import inventory_writer as invw
from provisioner_testbed import vllm_image


def test_the_printed_key_expansion_reads_the_key(tmp_path: Path) -> None:
    hosts = tuple(invw.InvHost(name=f"node{i:02d}", address=f"198.18.7.{10 + i}", gpu_count=1) for i in (1, 2, 3))
    extra, cluster_vars = vllm_image.testbed_rack_inventory(
        invw.clusters([h.name for h in hosts]), {h.name: 1 for h in hosts}, "198.18.7.1/24", tmp_path / "cache")
    r = invw.InvRack(name="v", hosts=hosts, key_file="/k", known_hosts="/kh", repo_url="http://198.18.7.1:8090/nvidia/",
                     proxy_url="http://198.18.7.1:3128", extra_vars=extra, cluster_vars=cluster_vars)
    fleet = load_fleet(invw.write(r, tmp_path / "inv"))
    eps = cluster_endpoints(fleet, ["vllm_single"], var_files(fleet, ["vllm_single"]), cwd=str(tmp_path))
    curl = endpoint_lines(eps)[-1].strip()
    assert curl.startswith("curl -s http://198.18.7.13:8000/v1/models -H ")
    # the same words, echoed instead of sent: what curl would get as its header
    out = subprocess.run(["sh", "-c", "printf '%s\\n' " + curl.removeprefix("curl -s ")], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["http://198.18.7.13:8000/v1/models", "-H", f"Authorization: Bearer {vllm_image.TESTBED_API_KEY}"]
