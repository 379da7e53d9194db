"""The example inventory of each node shape (inventories/p5-pair, b200-rack, gb200-nvl72) validates clean with
`provision validate`, and renders the files that shape needs (provision render's own functions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_inproc import provision
from provisioner import PROJECT_ROOT
from provisioner.inventory import load_fleet
from provisioner.render import host_files

SHAPES = {"p5-pair": 2, "b200-rack": 4, "gb200-nvl72": 18}


def inventory(shape: str) -> Path:
    return PROJECT_ROOT / "inventories" / shape / "hosts.ini"


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_example_validates_clean(shape: str) -> None:
    p = provision("validate", str(inventory(shape)), "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] and out["errors"] == [] and out["warnings"] == [], out
    assert len(load_fleet(inventory(shape)).hosts) == SHAPES[shape]


def files(shape: str, host: str) -> dict[str, str]:
    return {f.dest: f.content for f in host_files(load_fleet(inventory(shape)), host)}


def settings(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k] = v.strip('"')
    return out


def test_p5_gets_the_efa_nccl_environment() -> None:
    f = files("p5-pair", "p5-a")
    assert set(f) == {"/etc/nccl.conf", "/etc/vllm/vllm.env", "/etc/systemd/system/vllm.service"}
    conf = settings(f["/etc/nccl.conf"])
    assert conf == {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1", "NCCL_SOCKET_IFNAME": "^docker,lo,veth",
                    "NCCL_TUNER_PLUGIN": "/opt/amazon/ofi-nccl/lib/libnccl-ofi-tuner.so"}
    env = settings(f["/etc/vllm/vllm.env"])
    assert env["LD_LIBRARY_PATH"] == "/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib"
    assert {k: env[k] for k in conf} == conf  # the env file carries the same NCCL lines
    assert not [k for k in env if k.startswith("NCCL_IB_") or k == "NCCL_ALGO"]


def test_b200_gets_infiniband_nccl_and_no_imex() -> None:
    f = files("b200-rack", "b200-02")
    assert "/etc/nvidia-imex/nodes_config.cfg" not in f
    conf = settings(f["/etc/nccl.conf"])
    assert conf["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}:1" for i in range(8))
    assert "FI_PROVIDER" not in conf and "LD_LIBRARY_PATH" not in settings(f["/etc/vllm/vllm.env"])


def test_gb200_trays_list_their_whole_domain_the_same_way() -> None:
    fleet = load_fleet(inventory("gb200-nvl72"))
    cfgs = {h: {f.dest: f.content for f in host_files(fleet, h)}["/etc/nvidia-imex/nodes_config.cfg"]
            for h in fleet.hosts}
    assert len(set(cfgs.values())) == 1  # every tray of the domain gets the same bytes
    (text,) = set(cfgs.values())
    assert text.splitlines() == [f"10.50.0.{i}" for i in range(11, 29)]
    assert settings(files("gb200-nvl72", "tray01")["/etc/nccl.conf"])["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"


def test_imex_address_and_domains_decide_nodes_config(tmp_path: Path) -> None:
    """Two domains, an imex_address override: each tray lists only its own domain, by imex_address."""
    from inventory_factory import BASE_INI, gpu_nodes, write_inventory

    ini = BASE_INI.replace("n2 ansible_host=10.0.0.2\n", "n2 ansible_host=10.0.0.2\nn3 ansible_host=10.0.0.3\n")
    inv = write_inventory(tmp_path, ini=ini,
                          group_vars={**gpu_nodes(gpu_model="GB200-186GB", gpu_count=4, nvlink_domain="a"),
                                      "c1": {"vllm_cluster": {"tensor_parallel_size": 8, "pipeline_parallel_size": 1}}},
                          host_vars={"n2": {"imex_address": "192.168.7.2"}, "n3": {"nvlink_domain": "b"}})
    fleet = load_fleet(inv)
    got = {h: {f.dest: f.content for f in host_files(fleet, h)}["/etc/nvidia-imex/nodes_config.cfg"] for h in fleet.hosts}
    assert got == {"n1": "10.0.0.1\n192.168.7.2\n", "n2": "10.0.0.1\n192.168.7.2\n", "n3": "10.0.0.3\n"}


def test_h100_rack_is_unchanged_by_the_new_shapes() -> None:
    f = {x.dest: x.content for x in host_files(load_fleet(PROJECT_ROOT / "inventories/rack-a.ini"),
                                                               "node01")}
    assert "/etc/nvidia-imex/nodes_config.cfg" not in f
    conf = settings(f["/etc/nccl.conf"])
    assert "FI_PROVIDER" not in conf and conf["NCCL_ALGO"] == "Ring" and conf["NCCL_IB_HCA"].startswith("=mlx5_0:1")


@pytest.mark.parametrize("shape,cluster,mib", [("gb200-nvl72", "llama31_405b", 189471), ("b200-rack", "qwen2_72b", 183359)])
def test_sizing_uses_the_new_memory_figures(shape: str, cluster: str, mib: int) -> None:
    """The KV cache a GPU gets is its catalog memory (nvidia-smi's memory.total) x gpu_memory_utilization - weights."""
    from provisioner.rules.result import validate

    (c,) = [c for c in validate(load_fleet(inventory(shape))).clusters if c.name == cluster]
    assert c.weight_bytes_per_gpu and c.kv_cache_bytes_per_gpu
    assert abs(c.weight_bytes_per_gpu + c.kv_cache_bytes_per_gpu - int(mib * 2**20 * 0.9)) <= 1
