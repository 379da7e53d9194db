"""The curl line `provision onboard` prints for a launched cluster, run by a real shell: its key expansion prints the
testbed's key from the inventory file (the unit test tests/unit/test_endpoints.py checks the rest in-process)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from vllm_rack_inventory import write_vllm_rack_inventory

from provisioner.endpoints import cluster_endpoints, endpoint_lines, var_files
from provisioner.inventory import load_fleet
from provisioner_testbed import vllm_image


def test_the_printed_key_expansion_reads_the_key(tmp_path: Path) -> None:
    fleet = load_fleet(write_vllm_rack_inventory(tmp_path, model_config=False))
    eps = cluster_endpoints(fleet, ["vllm_single"], var_files(fleet, ["vllm_single"]), cwd=str(tmp_path))
    curl = endpoint_lines(eps)[-1].strip()
    assert curl.startswith("curl -s http://198.18.7.13:8000/v1/models -H ")
    # the same words, echoed instead of sent: what curl would get as its header
    out = subprocess.run(["sh", "-c", "printf '%s\\n' " + curl.removeprefix("curl -s ")], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["http://198.18.7.13:8000/v1/models", "-H", f"Authorization: Bearer {vllm_image.TESTBED_API_KEY}"]
