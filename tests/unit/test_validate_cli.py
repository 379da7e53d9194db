"""`provision validate` end to end through the CLI's entry point (in-process), on inventories written to tmp_path.

Every rule code has at least one inventory that triggers it and one (minimally different) that does not. The real
console script's exit codes and stderr: tests/integration/test_cli_process.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli_inproc import ROOT, provision
from inventory_factory import BASE_GROUP_VARS, BASE_INI, DELETE, TINY_CONFIG, cluster, gpu_nodes, write_inventory


def validate_json(inv: Path) -> tuple[int, dict[str, Any]]:
    p = provision("validate", str(inv), "--format", "json")
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode in (0, 1), (p.returncode, p.stderr)
    return p.returncode, json.loads(p.stdout)


TWO_CLUSTERS_INI = """\
[gpu_nodes]
n1 ansible_host=10.0.0.1
n2 ansible_host=10.0.0.2
n3 ansible_host=10.0.0.3

[c1]
n1 node_rank=0
n2 node_rank=1

[c2]
{c2}
"""
# a host's BMC, credentials from the environment (docs/bmc.md)
BMC = {"bmc_address": "10.1.0.1", "bmc_username": "admin", "bmc_password_env": "BMC_PASSWORD"}

C2 = {"c2": {"vllm_cluster": {"model": "/m", "model_arch": "Qwen2-72B", "tensor_parallel_size": 8,
                              "max_model_len": 4096, "max_num_seqs": 32}}}
TINY = {"files": {"models/tiny/config.json": json.dumps(TINY_CONFIG)}}

SHA = "0" * 63 + "1"
# a valid AWS p5 pair (fabric efa) and a valid GB200 NVL72 slice (two 4-GPU trays of one domain, TP 8 across them)
EFA = {"fabric": "efa", "ib_hcas": DELETE, "efa_device_count": 32, "efa_installer_sha256": SHA,
       "efa_installer_url": "https://mirror.example/efa/aws-efa-installer-1.43.2.tar.gz"}
GB = {"gpu_model": "GB200-186GB", "gpu_count": 4, "nvlink_domain": "nvl72-a"}
# the quarantine/remediation policy of docs/lifecycle.md
POLICY = {"quarantine_on": ["ecc", "xid", "fabricmanager", "ib"], "remediation": ["gpu_reset", "reboot"],
          "replace_after": {"quarantines": 3, "window_days": 30}}
# a bundle mirror (docs/airgap.md) and the PEM texts role bundle_mirror needs (SUP006)
MIRROR_INI = BASE_INI + "\n[bundle_mirror]\nm1 ansible_host=10.0.0.9\n"
MIRROR_TLS = {"bundle_mirror_tls_certificate": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
              "bundle_mirror_tls_key": "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"}
GB_TP8 = cluster(tensor_parallel_size=8, pipeline_parallel_size=1)


def gb(**over: Any) -> dict[str, Any]:
    return {**gpu_nodes(**{**GB, **over}), **GB_TP8}


def trays(n: int) -> str:
    return BASE_INI.replace("n2 ansible_host=10.0.0.2\n", "n2 ansible_host=10.0.0.2\n" + "".join(
        f"n{i} ansible_host=10.0.1.{i}\n" for i in range(3, n + 1)))


# code -> (failing inventories, passing inventories); each inventory = write_inventory kwargs
CASES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
    "HW001": ([{"group_vars": gpu_nodes(gpu_model=DELETE)}, {"group_vars": gpu_nodes(bootstrap_interface=DELETE)}],
              [{}]),
    "HW002": ([{"group_vars": gpu_nodes(gpu_count="8")}, {"group_vars": gpu_nodes(ib_hcas="mlx5_0,mlx5_1")},
               {"group_vars": gpu_nodes(gpu_count=17)}, {"group_vars": gpu_nodes(bootstrap_interface="eth 0")}],
              [{"group_vars": gpu_nodes(gpu_count=8, ib_hcas=["mlx5_0"])}]),
    "HW003": ([{"group_vars": gpu_nodes(gpu_model="H100-SXM-80GB")}], [{"group_vars": gpu_nodes(gpu_model="H100-SXM5-80GB")}]),
    "HW004": ([{"group_vars": gpu_nodes(fabric="ib")}], [{"group_vars": gpu_nodes(fabric="roce")}]),
    "HW005": ([{"group_vars": gpu_nodes(ib_hcas=[])}, {"group_vars": gpu_nodes(ib_hcas=DELETE)}],
              [{"group_vars": gpu_nodes(fabric="ethernet", ib_hcas=DELETE)}]),
    "HW006": ([{"group_vars": gpu_nodes(ib_hcas=["mlx5_0", "mlx5 1"])}, {"group_vars": gpu_nodes(ib_hcas=["=mlx5_0"])},
               {"group_vars": gpu_nodes(ib_hcas=["mlx5_0", "mlx5_0"])}],
              [{"group_vars": gpu_nodes(ib_hcas=["mlx5_0:1", "mlx5_0:2", "mlx5_bond_0"])}]),
    "HW007": ([{"ini": BASE_INI.replace("10.0.0.2", "10.0.0.1")}], [{}]),
    "HW008": ([{"ini": TWO_CLUSTERS_INI.format(c2="n2 node_rank=0"), "group_vars": C2}],
              [{"ini": TWO_CLUSTERS_INI.format(c2="n3 node_rank=0"), "group_vars": C2}]),
    "HW009": ([{"group_vars": gpu_nodes(fabric="roce", ib_hcas=DELETE)}], [{"group_vars": gpu_nodes(fabric="roce")}]),
    "HW010": ([{"group_vars": gpu_nodes(**{**EFA, "efa_device_count": DELETE})},
               {"group_vars": gpu_nodes(**{**EFA, "efa_device_count": 64})}],
              [{"group_vars": gpu_nodes(**EFA)}, {"group_vars": gpu_nodes(**{**EFA, "bootstrap_interface": DELETE})}]),
    "HW011": ([{"group_vars": gpu_nodes(**{**EFA, "efa_device_count": 2, "efa_devices": ["rdmap79s0", "eth0"]})},
               {"group_vars": gpu_nodes(**{**EFA, "efa_device_count": 2, "efa_devices": ["rdmap79s0", "rdmap79s0"]})},
               {"group_vars": gpu_nodes(**{**EFA, "efa_device_count": 4, "efa_devices": ["rdmap79s0", "rdmap80s0"]})}],
              [{"group_vars": gpu_nodes(**{**EFA, "efa_device_count": 2, "efa_devices": ["rdmap79s0", "rdmap80s0"]})}]),
    "HW012": ([{"group_vars": gpu_nodes(**{**EFA, "ib_hcas": ["mlx5_0"]})},
               {"group_vars": gpu_nodes(**{**EFA, "nccl_ib_hca": "=mlx5_0:1"})}],
              [{"group_vars": gpu_nodes(**EFA)}]),
    "HW013": ([{"group_vars": gpu_nodes(**{**EFA, "efa_installer_url": DELETE})},
               {"group_vars": gpu_nodes(**{**EFA, "efa_installer_sha256": "abc"})},
               {"group_vars": gpu_nodes(**{**EFA, "efa_installer_url": "mirror/aws-efa-installer.tar.gz"})}],
              [{"group_vars": gpu_nodes(**EFA)}]),
    "HW014": ([{"group_vars": gpu_nodes(gpu_model="B200-SXM-180GB", nvidia_driver_branch="570",
                                        nvidia_driver_version="570.124.06-1")}],
              [{"group_vars": gpu_nodes(gpu_model="B200-SXM-180GB", nvidia_driver_branch="570",
                                        nvidia_driver_version="570.133.20-1")},
               {"group_vars": gpu_nodes(gpu_model="B200-SXM-180GB")}]),
    "HW015": ([{"group_vars": gb(ansible_architecture="x86_64")},
               {"group_vars": gpu_nodes(ansible_architecture="aarch64")}],
              [{"group_vars": gb(ansible_architecture="aarch64")}, {"group_vars": gb(ansible_architecture="arm64")}]),
    "HW016": ([{"group_vars": gpu_nodes(gpu_model="H100-PCIe-80GB", gpu_needs_fabric_manager=True)},
               {"group_vars": gb(gpu_count=8)}, {"group_vars": gpu_nodes(gpu_needs_imex="maybe")}],
              [{"group_vars": gpu_nodes(gpu_needs_fabric_manager=True, gpu_needs_imex=False,
                                        node_health_gpu_names=["NVIDIA H100 80GB HBM3"])},
               {"group_vars": gpu_nodes(gpu_count=1, gpu_needs_fabric_manager=False)}]),
    "NVL001": ([{"group_vars": gb(nvlink_domain=DELETE)}, {"group_vars": gb(nvlink_domain=7)}],
               [{"group_vars": gb()}]),
    "NVL002": ([{"ini": trays(19), "group_vars": gb()}], [{"ini": trays(18), "group_vars": gb()}]),
    "NVL003": ([{"group_vars": gb(), "host_vars": {"n2": {"nvidia_driver_version": "580.82.07-1"}}}],
               [{"group_vars": gb(), "host_vars": {"n2": {"nvidia_driver_version": "580.95.05-1"}}}]),
    "NVL004": ([{"group_vars": gb(), "host_vars": {"n2": {"imex_address": "10.0.0.1"}}}],
               [{"group_vars": gb(), "host_vars": {"n1": {"imex_address": "10.1.0.1"},
                                                   "n2": {"imex_address": "10.1.0.2"}}}]),
    "NVL005": ([{"group_vars": gpu_nodes(nvlink_domain="nvl72-a")}], [{}]),
    "NCCL001": ([{"group_vars": gpu_nodes(nccl_ib_timeout=32)}, {"group_vars": gpu_nodes(nccl_ib_timeout="22")}],
                [{"group_vars": gpu_nodes(nccl_ib_timeout=31)}]),
    "NCCL002": ([{"group_vars": gpu_nodes(nccl_ib_retry_cnt=8)}], [{"group_vars": gpu_nodes(nccl_ib_retry_cnt=0)}]),
    "NCCL003": ([{"group_vars": gpu_nodes(nccl_algo="Ring,Foo")}, {"group_vars": gpu_nodes(nccl_algo="allreduce:ringg")},
                 {"group_vars": gpu_nodes(nccl_algo="alreduce:ring")}],
                [{"group_vars": gpu_nodes(nccl_algo="allreduce:ring;broadcast:tree")},
                 {"group_vars": gpu_nodes(nccl_algo="^NVLS,pat")}]),
    "NCCL004": ([{"group_vars": gpu_nodes(nccl_cross_nic=3)}, {"group_vars": gpu_nodes(nccl_extra={"debug": "INFO"})},
                 {"group_vars": gpu_nodes(nccl_extra="NCCL_DEBUG=INFO")}],
                [{"group_vars": gpu_nodes(nccl_cross_nic=0, nccl_extra={"NCCL_DEBUG": "WARN"}, nccl_ib_gid_index=3)}]),
    "NCCL005": ([{"group_vars": gpu_nodes(nccl_extra={"NCCL_PROTO": "LL128"})},
                 {"group_vars": gpu_nodes(nccl_ib_hca="mlx5_0:1,mlx5_1:1")}],
                [{"group_vars": gpu_nodes(nccl_ib_hca="=mlx5_0:1,mlx5_1:1")}]),
    "NCCL006": ([{"group_vars": gpu_nodes(nccl_extra={"NCCL_IB_TIMEOUT": 20})},
                 {"group_vars": gpu_nodes(nccl_extra={"NCCL_SOCKET_IFNAME": "=eth0"})},
                 {"group_vars": gpu_nodes(**{**EFA, "nccl_extra": {"NCCL_ALGO": "Tree"}})}],
                [{"group_vars": gpu_nodes(nccl_extra={"NCCL_IB_QPS_PER_CONNECTION": 4, "NCCL_TUNER_PLUGIN": "x.so"})}]),
    "NCCL007": ([{"group_vars": gpu_nodes(**{**EFA, "nccl_extra": {"NCCL_IB_QPS_PER_CONNECTION": 4}})},
                 {"group_vars": gpu_nodes(**{**EFA, "nccl_extra": {"NCCL_NET": "Socket"}})},
                 {"group_vars": gpu_nodes(nccl_extra={"NCCL_NET": "Socket"})},
                 {"group_vars": gpu_nodes(nccl_extra={"NCCL_NET_PLUGIN": "ofi"})}],
                [{"group_vars": gpu_nodes(**{**EFA, "nccl_extra": {"NCCL_NET": "Libfabric"}})},
                 {"group_vars": gpu_nodes(nccl_extra={"NCCL_NET": "IB"})}]),
    "ENV001": ([{"group_vars": gpu_nodes(vllm_env_extra={"VLLM_HOST_IP": "10.0.0.9"})},
                {"group_vars": gpu_nodes(vllm_env_extra={"NCCL_DEBUG": "INFO"})},
                {"group_vars": gpu_nodes(vllm_env_extra="HF_HUB_OFFLINE=1")}],
               [{"group_vars": gpu_nodes(vllm_env_extra={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": 1})}]),
    "VAR001": ([{"ini": BASE_INI + "\n[gpu_nodes:vars]\ncuda_version=12.10\n"},
                {"ini": BASE_INI.replace("n1 ansible_host=10.0.0.1", "n1 ansible_host=10.0.0.1 driver_version=580.95")}],
               [{"ini": BASE_INI + "\n[gpu_nodes:vars]\ncuda_version='12.10'\n"},
                {"group_vars": gpu_nodes(cuda_version="12.10")}]),
    "CL001": ([{"group_vars": cluster(model_arch=DELETE)}, {"group_vars": cluster(model=DELETE)},
               {"group_vars": {"c1": {"vllm_cluster": "Qwen2-72B"}}}], [{}]),
    "CL002": ([{"group_vars": cluster(model_arch="Qwen2-72")},
               {"group_vars": cluster(model_arch=DELETE, model_config="models/missing/config.json")},
               {"group_vars": cluster(model_arch=DELETE, model_config="models/bad.json"),
                "files": {"models/bad.json": "{not json"}}],
              [{"group_vars": cluster(model_arch=DELETE, model_config="models/tiny/config.json", pipeline_parallel_size=1,
                                      tensor_parallel_size=16), **TINY}]),
    "CL003": ([{"group_vars": cluster(pipeline_parallel_size=1)}], [{"group_vars": cluster(pipeline_parallel_size=2)}]),
    "CL004": ([{"host_vars": {"n2": {"gpu_count": 4}}}, {"host_vars": {"n2": {"gpu_model": "H200-SXM-141GB"}}}], [{}]),
    "CL005": ([{"ini": BASE_INI.replace("n2 node_rank=1", "n2")}, {"host_vars": {"n2": {"node_rank": "1"}}}], [{}]),
    "CL006": ([{"ini": BASE_INI.replace("n2 node_rank=1", "n2 node_rank=0")}], [{}]),
    "CL007": ([{"ini": BASE_INI.replace("n2 node_rank=1", "n2 node_rank=2")},
               {"ini": BASE_INI.replace("n1 node_rank=0", "n1 node_rank=2")}], [{}]),
    "CL008": ([{"group_vars": cluster(model_arch="Qwen2-7B")}],
              [{"group_vars": cluster(model_arch="Qwen2-7B", tensor_parallel_size=4, pipeline_parallel_size=4)}]),
    "CL009": ([{"group_vars": cluster(model_arch=DELETE, model_config="models/tiny/config.json"), **TINY}],
              [{"group_vars": cluster(model_arch=DELETE, model_config="models/tiny", pipeline_parallel_size=1,
                                      tensor_parallel_size=16), **TINY}]),
    "CL010": ([{"group_vars": cluster(tensor_parallel_size=16, pipeline_parallel_size=1)},
               {"group_vars": gb(), "host_vars": {"n2": {"nvlink_domain": "nvl72-b"}}}],
              [{}, {"group_vars": gb()}]),
    "CL017": ([{"group_vars": {**gb(), **cluster(tensor_parallel_size=4, pipeline_parallel_size=2)},
                "host_vars": {"n2": {"nvlink_domain": "nvl72-b"}}}],
              [{"group_vars": {**gb(), **cluster(tensor_parallel_size=4, pipeline_parallel_size=2)}}]),
    "CL018": ([{"group_vars": {**gpu_nodes(vllm_device="cpu"), **cluster(executor="ray")}},
               {"group_vars": gpu_nodes(vllm_device="tpu")}],
              [{"group_vars": {**gpu_nodes(vllm_device="cpu"), **cluster(executor="mp")}},
               {"group_vars": cluster(executor="ray")}]),
    "CL019": ([{"host_vars": {"n1": {"vllm_cluster": {**BASE_GROUP_VARS["c1"]["vllm_cluster"], "max_num_seqs": 8}}}},
               {"ini": BASE_INI + "\n[a_row]\nn1\nn2\n"}],
              [{"ini": BASE_INI + "\n[row1]\nn1\n\n[vllm_clusters:children]\nc1\n"}]),
    "CL011": ([{"ini": BASE_INI + "\n[c2]\n", "group_vars": C2}], [{}]),
    "CL012": ([{"ini": BASE_INI.replace("n2 ansible_host=10.0.0.2\n", "") + "\n[other]\nn2 ansible_host=10.0.0.2\n"}],
              [{}]),
    "CL013": ([{"group_vars": cluster(dtype="bf16")}, {"group_vars": cluster(enable_prefix_caching="yes")},
               {"group_vars": cluster(gpu_memory_utilization=1.5)}, {"group_vars": cluster(port=8000, master_port=8000)},
               {"group_vars": cluster(tensor_parallel_size="8")}, {"group_vars": cluster(executor="k8s")}],
              [{"group_vars": cluster(dtype="float16", enable_prefix_caching=False, executor="ray")}]),
    "CL014": ([{"group_vars": cluster(enable_chunked_prefill=False, max_num_batched_tokens=2048)},
               {"group_vars": cluster(max_num_batched_tokens=32)}],
              [{"group_vars": cluster(enable_chunked_prefill=False, max_num_batched_tokens=4096)}]),
    "CL015": ([{"group_vars": cluster(max_model_len=65536)}], [{"group_vars": cluster(max_model_len=32768)}]),
    "CL016": ([{"group_vars": cluster(tensor_paralel_size=8)}], [{}]),
    "MEM001": ([{"group_vars": cluster(gpu_memory_utilization=0.1)}], [{"group_vars": cluster(gpu_memory_utilization=0.9)}]),
    "MEM002": ([{"group_vars": cluster(gpu_memory_utilization=0.11, max_model_len=32768)}],
               [{"group_vars": cluster(gpu_memory_utilization=0.11, max_model_len=4096)}]),
    "MEM003": ([{"group_vars": cluster(max_model_len=32768, max_num_seqs=256)}],
               [{"group_vars": cluster(max_model_len=32768, max_num_seqs=64)}]),
    "FLAG001": ([{"group_vars": cluster(extra_args=["--swap-space", "4"])},
                 {"group_vars": cluster(extra_args=["--disable-log-requests"])},
                 {"group_vars": cluster(extra_args=["--use-v2-block-manager"])}],
                [{"group_vars": cluster(extra_args=["--enable-log-requests"])}]),
    "FLAG002": ([{"group_vars": cluster(extra_args="--enable-log-requests")},
                 {"group_vars": cluster(extra_args=["--max-model-len=8192"])},
                 {"group_vars": cluster(extra_args=["--seed 0"])}],
                [{"group_vars": cluster(extra_args=["--seed", "0", "--trust-remote-code"])}]),
    "FLAG004": ([{"group_vars": cluster(extra_args=["--api-key", "sk-1"])},
                 {"group_vars": cluster(extra_args=["--hf_token=hf_1"])}],
                [{"group_vars": cluster(extra_args=["--api-server-count=2"])}]),
    # out-of-band (provisioner/rules/firmware.py; more cases in tests/unit/test_rules_firmware.py)
    "BMC001": ([{"host_vars": {"n1": {**BMC, "bmc_address": "https://10.1.0.1"}}},
                {"host_vars": {"n1": {**BMC, "bmc_port": "443"}}}],
               [{"host_vars": {"n1": {**BMC, "bmc_port": 8443}}}]),
    "BMC002": ([{"host_vars": {"n1": BMC, "n2": BMC}}],
               [{"host_vars": {"n1": BMC, "n2": {**BMC, "bmc_address": "10.1.0.2"}}}]),
    "BMC003": ([{"host_vars": {"n1": {"bmc_address": "10.1.0.1", "bmc_username": "admin"}}}],
               [{"host_vars": {"n1": BMC}}]),
    "BMC004": ([{"ini": BASE_INI.replace("n1 ansible_host=10.0.0.1",
                                         "n1 ansible_host=10.0.0.1 bmc_address=10.1.0.1 bmc_username=admin "
                                         "bmc_password=calvin")}],
               [{"host_vars": {"n1": {**BMC, "bmc_password": "{{ vault_bmc_password }}"}}}]),
    "BMC005": ([{"host_vars": {"n1": {**BMC, "bmc_tls_verify": False}}}],
               [{"host_vars": {"n1": {**BMC, "bmc_tls_verify": True}}}]),
    "FW001": ([{"group_vars": gpu_nodes(firmware=["bios"])}, {"group_vars": gpu_nodes(firmware={"bios": "2.3.1"})}],
              [{"group_vars": gpu_nodes(firmware={"bios": ["2.3.1"]})}]),
    "FW002": ([{"group_vars": gpu_nodes(firmware={"bois": ["2.3.1"]})}],
              [{"group_vars": gpu_nodes(firmware={"bios": ["2.3.1"], "gpu": ["96.00.89.00.01"]})}]),
    "FW003": ([{"group_vars": gpu_nodes(firmware={"bmc": [1.1]})}, {"group_vars": gpu_nodes(firmware={"bmc": ["7 00"]})}],
              [{"group_vars": gpu_nodes(firmware={"bmc": ["7.00.00.00", "1.10"]})}]),
    "LC001": ([{"group_vars": gpu_nodes(lifecycle_policy=["ecc"])},
               {"group_vars": gpu_nodes(lifecycle_policy={"quarantine": ["ecc"]})}],
              [{"group_vars": gpu_nodes(lifecycle_policy=POLICY)}, {"group_vars": gpu_nodes(lifecycle_policy={})}]),
    "LC002": ([{"group_vars": gpu_nodes(lifecycle_policy={"quarantine_on": ["ecc", "driver"]})},
               {"group_vars": gpu_nodes(lifecycle_policy={"quarantine_on": "ecc"})},
               {"group_vars": gpu_nodes(lifecycle_policy={"quarantine_on": ["xdi"]})}],
              [{"group_vars": gpu_nodes(lifecycle_policy=POLICY)}]),
    "LC003": ([{"group_vars": gpu_nodes(lifecycle_policy={"remediation": ["gpu_reset", "reboot", "reboot"]})},
               {"group_vars": gpu_nodes(lifecycle_policy={"remediation": ["reimage"]})},
               {"group_vars": gpu_nodes(lifecycle_policy={"remediation": []})}],
              [{"group_vars": gpu_nodes(lifecycle_policy={"remediation": ["reboot"]})}]),
    "LC004": ([{"group_vars": gpu_nodes(lifecycle_policy={"replace_after": {"quarantines": "3"}})},
               {"group_vars": gpu_nodes(lifecycle_policy={"replace_after": {"quarantines": 0, "window_days": 7}})},
               {"group_vars": gpu_nodes(lifecycle_policy={"replace_after": {"days": 7}})},
               {"group_vars": gpu_nodes(lifecycle_policy={"replace_after": 3})}],
              [{"group_vars": gpu_nodes(lifecycle_policy=POLICY)}]),
    "TXT001": ([{"group_vars": cluster(extra_args=["--enable-log-requests\nExecStartPost=/bin/sh -c id"])},
                {"group_vars": cluster(served_model_name="m1\rserver { listen 9; }")},
                {"group_vars": gpu_nodes(nccl_extra={"NCCL_DEBUG": "WARN\nNCCL_NET=Socket"})},
                {"group_vars": gpu_nodes(vllm_env_extra={"X": "1\nVLLM_API_KEY=evil"})},
                {"group_vars": {"all": {"monitoring_external_labels": {"site": "a\u2028b"}}}},
                {"host_vars": {"n1": {"vllm_api_key": "k\x00ey"}}},
                {"group_vars": gpu_nodes(vllm_client_networks=["10.0.0.0/8\t"])},
                {"ini": BASE_INI.replace("[c1]", "[c1]\nn9 ansible_host=10.0.0.9 comment=a\x1bb")}],
               [{"group_vars": {**cluster(extra_args=["--enable-log-requests"], served_model_name="m 1;%$"),
                                **gpu_nodes(nccl_extra={"NCCL_DEBUG": "WARN"}, vllm_env_extra={"X": 'a"b c'},
                                            site_ca_certificates=["-----BEGIN X-----\nAAAA\n-----END X-----\n"])}}]),
    "TXT002": ([{"group_vars": cluster(served_model_name='m1" "@x')},
                {"group_vars": cluster(model="~.*")},
                {"group_vars": gpu_nodes(nccl_extra={"NCCL_DEBUG": 'WARN"'})},
                {"group_vars": gpu_nodes(vllm_client_networks=["10.0.0.0/8, 0.0.0.0/0"])},
                {"group_vars": {"all": {"monitoring_external_labels": {"a: b": "x"}}}},
                {"group_vars": {"all": {"monitoring_scrape_interval": "15s', remote_write: x"}}},
                {"group_vars": {"all": {"serving_lb_keepalive_timeout": "60s; include /etc/passwd"}}},
                {"group_vars": gpu_nodes(vllm_venv="/opt/v env;x")},
                {"host_vars": {"n1": {"ansible_host": "10.0.0.1 10.9.9.9"}}},
                {"ini": TWO_CLUSTERS_INI.replace("[c2]\n{c2}", "[c-2%x]\nn3 node_rank=0"),
                 "group_vars": {"c-2%x": C2["c2"]}}],
               [{"group_vars": {**cluster(served_model_name=["llama-3.1-70b", "meta/llama:v1"]),
                                **gpu_nodes(vllm_client_networks=["10.0.0.0/8", "fd00::/64", "192.0.2.7"],
                                            nccl_extra={"NCCL_SOCKET_IFNAME": "^docker,lo"}),
                                "all": {"monitoring_external_labels": {"site": "a: b 'c'"},
                                        "serving_lb_next_upstream": "error timeout http_502"}}}]),
    "LC005": ([{"group_vars": gpu_nodes(lifecycle_policy={"remediation": ["gpu_reset", "power_cycle"]})}],
              [{"group_vars": gpu_nodes(lifecycle_policy={"remediation": ["gpu_reset", "power_cycle"]}),
                "host_vars": {"n1": BMC, "n2": {**BMC, "bmc_address": "10.1.0.2"}}}]),
    "LC006": ([{"group_vars": {"all": {"provision_site": "rack-a\nExecStartPost=/bin/sh"}}},
               {"group_vars": {"all": {"provision_site": ""}}},
               {"host_vars": {"n1": {"provision_site": "rack-a"}}}],
              [{"group_vars": {"all": {"provision_site": "dc1 rack-a"}}}]),
    "LC007": ([{"group_vars": {"all": {"burnin_gate": "flase"}}},
               {"group_vars": gpu_nodes(burnin_onboard_tier="off")},
               {"host_vars": {"n1": {"burnin_return_tier": "off"}}}],
              [{"group_vars": {"all": {"burnin_gate": False}, **gpu_nodes(burnin_onboard_tier="off")}},
               {"group_vars": gpu_nodes(burnin_onboard_tier="quick", burnin_gate="yes")}]),
    "RL001": ([{"group_vars": {"all": {"remediation_rails": ["act"]}}},
               {"group_vars": {"all": {"remediation_rails": {"mdoe": "act"}}}},
               {"group_vars": gpu_nodes(remediation_rails={"mode": "act"})}],
              [{"group_vars": {"all": {"remediation_rails": {"mode": "act", "breaker_share": 0.2}}}}]),
    "RL002": ([{"group_vars": {"all": {"remediation_rails": {"mode": "execute"}}}}],
              [{"group_vars": {"all": {"remediation_rails": {"mode": "observe"}}}}]),
    "RL003": ([{"group_vars": {"all": {"remediation_rails": {"breaker_share": 1.5}}}},
               {"group_vars": {"all": {"remediation_rails": {"actions_per_hour": 0}}}},
               {"group_vars": {"all": {"remediation_rails": {"persist": "3"}}}}],
              [{"group_vars": {"all": {"remediation_rails": {"breaker_share": 0.1, "actions_per_hour": 5,
                                                             "cooldown_s": 0, "persist": 2}}}}]),
    "RL004": ([{"group_vars": {"all": {"remediation_rails": {"soft_checks": ["driver"]}}}},
               {"group_vars": {"all": {"remediation_rails": {"min_serving_clusters": -1}}}},
               {"group_vars": {"all": {"remediation_rails": {"min_serving_clusters": {"llama": "2"}}}}}],
              [{"group_vars": {"all": {"remediation_rails": {"soft_checks": ["ib", "nvlink"],
                                                             "min_serving_clusters": {"llama": 2}}}}}]),
    "HW017": ([{"group_vars": gpu_nodes(**{**EFA, "efa_device_count": 16})},
               {"group_vars": gpu_nodes(**{**EFA, "gpu_model": "H200-SXM-141GB", "efa_device_count": 8})},
               {"group_vars": gpu_nodes(**{**EFA, "aws_instance_type": "p5en.48xlarge"})},
               {"group_vars": gpu_nodes(**{**EFA, "aws_instance_type": "p5.48xl"})}],
              [{"group_vars": gpu_nodes(**EFA)},
               {"group_vars": gpu_nodes(**{**EFA, "gpu_model": "H200-SXM-141GB", "efa_device_count": 16})},
               {"group_vars": gpu_nodes(**{**EFA, "gpu_model": "H200-SXM-141GB", "efa_device_count": 16,
                                           "aws_instance_type": "p5en.48xlarge"})}]),
    "SUP001": ([{"group_vars": gpu_nodes(vllm_pip_index_url="http://pypi.site.internal/simple/")},
                {"group_vars": gpu_nodes(vllm_pip_extra_args="--index-url=HTTP://pypi.site.internal/simple")},
                {"group_vars": gpu_nodes(vllm_pip_extra_args="-f http://wheels.site.internal/")}],
               [{"group_vars": gpu_nodes(vllm_pip_index_url="https://pypi.site.internal/simple/",
                                         vllm_pip_extra_args="--no-cache-dir --find-links https://w.site/")},
                {"group_vars": gpu_nodes(vllm_pip_index_url="{{ site_pypi }}")}]),
    "SUP002": ([{"group_vars": gpu_nodes(vllm_pip_extra_args="--trusted-host pypi.site.internal")},
                {"group_vars": gpu_nodes(vllm_pip_extra_args="--no-cache-dir --trusted-host=mirror")}],
               [{"group_vars": gpu_nodes(vllm_pip_extra_args="--no-cache-dir")}]),
    "SUP003": ([{"group_vars": gpu_nodes(vllm_pip_extra_args="--extra-index-url https://mirror2/simple")}],
               [{"group_vars": gpu_nodes(vllm_pip_index_url="https://mirror/simple")}]),
    "SUP004": ([{"group_vars": gpu_nodes(nvidia_repo_url="http://mirror.site.internal/cuda/debian12/x86_64/")},
                {"host_vars": {"n1": {"infiniband_doca_repo_url": "http://mirror/doca/"}}}],
               [{"group_vars": gpu_nodes(nvidia_repo_url="https://mirror.site.internal/cuda/debian12/x86_64/")}]),
    "SUP005": ([{"group_vars": gpu_nodes(nvidia_repo_key_fingerprints=["3BF863CC"])},
                {"group_vars": gpu_nodes(nvidia_repo_key_fingerprints=[])},
                {"group_vars": gpu_nodes(nvidia_repo_key_fingerprints={"nvidia": "EB69"})},
                {"group_vars": gpu_nodes(infiniband_stack="doca")}],
               [{"group_vars": gpu_nodes(nvidia_repo_key_fingerprints=["EB69 3B30 35CD 5710 E231  E123 A4B4 6996 "
                                                                       "3BF8 63CC"])},
                {"group_vars": gpu_nodes(infiniband_stack="doca",
                                         infiniband_doca_repo_key_fingerprints=["AB" * 20, "cd" * 32])}]),
    "SUP006": ([{"ini": MIRROR_INI}, {"ini": MIRROR_INI, "group_vars": {"bundle_mirror": MIRROR_TLS | {
                    "bundle_mirror_tls_certificate": "not a cert"}}},
                {"ini": MIRROR_INI, "host_vars": {"m1": {"bundle_mirror_tls": False}}}],
               [{"ini": MIRROR_INI, "group_vars": {"bundle_mirror": MIRROR_TLS}},
                {"ini": MIRROR_INI, "host_vars": {"m1": {"bundle_mirror_tls": "no", "bundle_mirror_http_port": 8090}}},
                {"ini": MIRROR_INI, "group_vars": {"bundle_mirror": {
                    "bundle_mirror_tls_certificate": "{{ lookup('file', 'm1.pem') }}",
                    "bundle_mirror_tls_key": "{{ lookup('file', 'm1.key') }}"}}}]),
}

WARNINGS = {"HW009", "NCCL005", "CL010", "CL016", "CL017", "MEM003", "NVL005", "BMC004", "BMC005", "LC005", "LC007",
            "SUP001", "SUP003", "SUP004"}


def _cases(which: int) -> list[Any]:
    return [pytest.param(code, i, spec, id=f"{code}-{'fail' if which == 0 else 'pass'}{i}")
            for code, pair in CASES.items() for i, spec in enumerate(pair[which])]


def test_every_rule_has_cases() -> None:
    from provisioner.rules import all_rules

    codes = set(all_rules()) - {"FLAG003"}  # needs vLLM importable: tests/unit/test_rules_flags.py
    assert codes == set(CASES), sorted(codes ^ set(CASES))


def test_every_rule_is_documented() -> None:
    from provisioner.rules import all_rules

    doc = (ROOT / "docs" / "inventory.md").read_text()
    missing = [c for c in all_rules() if f"| {c} |" not in doc]
    assert not missing, missing


@pytest.mark.parametrize(("code", "i", "spec"), _cases(0))
def test_rule_fails(tmp_path: Path, code: str, i: int, spec: dict[str, Any]) -> None:
    rc, out = validate_json(write_inventory(tmp_path, **spec))
    bucket = "warnings" if code in WARNINGS else "errors"
    hits = [f for f in out[bucket] if f["code"] == code]
    assert hits, out
    for f in hits:
        assert set(f) == {"code", "host", "group", "var", "message"}
        assert f["message"] and (f["host"] or f["group"])
    if code in WARNINGS:
        assert rc == 0 and out["ok"] is True and not out["errors"], out
    else:
        assert rc == 1 and out["ok"] is False


@pytest.mark.parametrize(("code", "i", "spec"), _cases(1))
def test_rule_passes(tmp_path: Path, code: str, i: int, spec: dict[str, Any]) -> None:
    rc, out = validate_json(write_inventory(tmp_path, **spec))
    assert not [f for f in out["errors"] + out["warnings"] if f["code"] == code], out
    assert rc == (0 if not out["errors"] else 1)


def test_rack_a_is_valid_and_sized() -> None:
    p = provision("validate", "inventories/rack-a.ini", "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert set(out) == {"ok", "errors", "warnings", "clusters"}
    assert out["ok"] is True and out["errors"] == [] and out["warnings"] == []
    by = {c["name"]: c for c in out["clusters"]}
    assert len(by) >= 2
    q = by["qwen2_72b"]
    assert set(q) == {"name", "nodes", "tensor_parallel_size", "pipeline_parallel_size", "weight_bytes_per_gpu",
                      "kv_cache_bytes_per_token", "max_full_length_seqs"}
    assert (q["nodes"], q["tensor_parallel_size"], q["pipeline_parallel_size"]) == (2, 8, 2)
    assert q["kv_cache_bytes_per_token"] == 2 * 80 * 8 * 128 * 2
    assert abs(q["weight_bytes_per_gpu"] * 16 - 145.4e9) < 0.5e9
    assert all(isinstance(c["weight_bytes_per_gpu"], int) for c in out["clusters"])


def test_rack_a_text_report_shows_sizing_tables() -> None:
    p = provision("validate", "inventories/rack-a.ini")
    assert p.returncode == 0, p.stderr
    for word in ("cluster qwen2_72b", "TP x PP", "8 x 2", "weights/GPU", "KV cache/token", "full-length seqs", "valid"):
        assert word in p.stdout, p.stdout


def test_text_report_lists_findings_and_exits_1(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, group_vars=gpu_nodes(gpu_model="H100"))
    p = provision("validate", str(inv))
    assert p.returncode == 1
    assert "HW003" in p.stdout and "invalid" in p.stdout


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (lambda d: d / "missing.ini", "inventory not found"),
        (lambda d: write_inventory(d, ini="[gpu_nodes\nn1\n"), "hosts.ini:1"),
        (lambda d: write_inventory(d, ini="[gpu_nodes]\nn1 foo\n"), "hosts.ini:2"),
        (lambda d: write_inventory(d, files={"group_vars/gpu_nodes.yml": "gpu_model: [x\n"}), "gpu_nodes.yml"),
        (lambda d: write_inventory(d, ini="all:\n  hosts: [a, b]\n", name="hosts.yml"), "hosts.yml"),
        (lambda d: write_inventory(d, ini="all:\n  hosts:\n    n1: {a: 1\n", name="hosts.yml"), "hosts.yml:"),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path: Path, setup: Any, needle: str) -> None:
    p = provision("validate", str(setup(tmp_path)), "--format", "json", columns=500)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    assert needle in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stdout == ""


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ({"host_vars/n2.yml": "- gpu_count: 8\n"}, "host_vars/n2.yml:1: "),
        ({"host_vars/n2.yml": "# the count\n\njust a string\n"}, "host_vars/n2.yml:3: "),
        ({"host_vars/n2/hw.yml": "true\n"}, "host_vars/n2/hw.yml:1: "),
        ({"group_vars/all.yml": "42\n"}, "group_vars/all.yml:1: "),
        ({"host_vars/n2.yml": "gpu_count: [8\n"}, "host_vars/n2.yml:2: "),
    ],
)
def test_usage_error_in_a_vars_file_names_that_file(tmp_path: Path, files: dict[str, str], needle: str) -> None:
    p = provision("validate", str(write_inventory(tmp_path, files=files)), columns=500)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert needle in p.stderr and "hosts.ini" not in p.stderr, p.stderr
    assert "Tagged" not in p.stderr and "<class" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_findings_name_the_vars_file_of_the_value(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, host_vars={"n2": {"gpu_count": "8", "nvidia_driver_version": 580.95}})
    _, out = validate_json(inv)
    by = {f["code"]: f["message"] for f in out["errors"] if f["host"] == "n2"}
    assert "host_vars/n2.yml:1)" in by["HW002"], by
    assert "host_vars/n2.yml:2)" in by["VAR001"] and "the float 580.95" in by["VAR001"], by
    assert not [m for m in by.values() if "Tagged" in m or "<class" in m], by


def test_plain_reasons_have_no_internal_type_names() -> None:
    from provisioner.inventory import _plain

    assert _plain("expected dicts but got a 'dict' and a '_AnsibleTaggedStr'.") == \
        "expected dicts but got a 'dict' and a string."
    assert _plain('Invalid "hosts" entry, requires a dictionary, found "<class \'ansible._AnsibleTaggedList\'>"') == \
        'Invalid "hosts" entry, requires a dictionary, found list'


def test_bad_format_is_usage_error() -> None:
    p = provision("validate", "inventories/rack-a.ini", "--format", "xml")
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_yaml_inventory_and_model_config(tmp_path: Path) -> None:
    inv = {"all": {"children": {
        "gpu_nodes": {"hosts": {"a": {"ansible_host": "10.1.0.1"}}},
        "tiny": {"hosts": {"a": {"node_rank": 0}}},
    }}}
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(TINY_CONFIG))
    gv = {"gpu_nodes": {"gpu_model": "L40S-48GB", "gpu_count": 2, "fabric": "ethernet", "bootstrap_interface": "eth0"},
          "tiny": {"vllm_cluster": {"model": "/m", "model_config": "cfg/config.json", "tensor_parallel_size": 2,
                                    "max_model_len": 2048, "max_num_seqs": 4}}}
    path = write_inventory(tmp_path, ini=yaml.safe_dump(inv), group_vars=gv, base=False, name="hosts.yml")
    rc, out = validate_json(path)
    assert rc == 0, out
    (c,) = out["clusters"]
    assert c["name"] == "tiny" and c["nodes"] == 1
    assert c["kv_cache_bytes_per_token"] == 2 * 1 * 8 * 64 * 2
