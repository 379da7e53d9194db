"""The host roles' rendered files, with Ansible itself (no root, no network).

- /etc/nccl.conf through the nccl_tuning role (ansible-playbook, connection=local) for Debian and Ubuntu hosts of
  every fabric kind: exact bytes, and the same bytes as `provision render` (provisioner.render).
- The firewall rules file through the cluster_firewall role: members of the host's own cluster only.
- The nvidia_driver apt source and pin for Debian 12 / Ubuntu 22.04 / 24.04 through Ansible's templar.
- meta/argument_specs.yml: ansible-core itself rejects bad role input (nccl_ib_timeout=40 ...).
"""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from provisioner import PROJECT_ROOT, ROLES

ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

INVENTORY = textwrap.dedent(
    """\
    all:
      children:
        gpu_nodes:
          hosts:
            deb-ib:
              ansible_host: 10.20.0.11
              node_rank: 0
            deb-ib2:
              ansible_host: 10.20.0.12
              node_rank: 1
            ubu-roce:
              ansible_host: 10.20.0.13
              fabric: roce
              ib_hcas: [mlx5_0, mlx5_1]
              nccl_algo: null
              nccl_extra: {NCCL_NET_GDR_LEVEL: PHB, NCCL_IB_QPS_PER_CONNECTION: 4}
              node_rank: 0
            ubu-eth:
              ansible_host: 10.20.0.14
              fabric: ethernet
              ib_hcas: []
              bootstrap_interface: eth0
              nccl_cross_nic: null
            aws-efa:
              ansible_host: 10.20.0.15
              fabric: efa
              ib_hcas: []
              bootstrap_interface: ""
            aws-efa2:
              ansible_host: 10.20.0.16
              fabric: efa
              ib_hcas: []
              bootstrap_interface: enp71s0
              efa_nccl_tuner: false
              aws_ofi_nccl_dir: /opt/site/ofi-nccl
              nccl_extra: {NCCL_BUFFSIZE: 8388608}
          vars:
            gpu_model: H100-SXM5-80GB
            gpu_count: 8
            fabric: infiniband
            ib_hcas: [mlx5_0:1, mlx5_1:1, mlx5_10]
            bootstrap_interface: ens10f0np0
        pair:
          hosts:
            deb-ib:
            deb-ib2:
          vars:
            vllm_cluster: {model: /models/m, model_arch: Llama-2-7B, tensor_parallel_size: 8,
                           pipeline_parallel_size: 2, port: 8000, master_port: 29501}
        single:
          hosts:
            ubu-roce:
          vars:
            vllm_cluster: {model: /models/m, model_arch: Llama-2-7B, tensor_parallel_size: 8, executor: ray,
                           port: 8001}
        lb:
          hosts:
            lb01:
              ansible_host: 10.20.1.5
        # a rack-row group of one host: must not be taken for deb-ib's cluster (it "contains only hosts of that
        # cluster" too); the firewall's members are the 2-node pair (TP 8 x PP 2 on 8-GPU nodes)
        row_a:
          hosts:
            deb-ib:
    """
)

HEADER = (
    "# /etc/nccl.conf for {host}: managed by provisioner (templates/nccl.conf.j2).\n"
    "# Local edits are overwritten on the next run: change the nccl_* inventory variables instead.\n"
    "# Precedence: process environment > NCCL_CONF_FILE or ~/.nccl.conf > this file.\n"
)

EXPECTED_NCCL = {
    "deb-ib": HEADER.format(host="deb-ib")
    + "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_10:1\n"
    "NCCL_SOCKET_IFNAME==ens10f0np0\n"
    "NCCL_ALGO=Ring\n"
    "NCCL_IB_TIMEOUT=22\n"
    "NCCL_IB_RETRY_CNT=7\n"
    "NCCL_CROSS_NIC=0\n",
    "ubu-roce": HEADER.format(host="ubu-roce")
    + "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1\n"
    "NCCL_SOCKET_IFNAME==ens10f0np0\n"
    "NCCL_IB_TIMEOUT=22\n"
    "NCCL_IB_RETRY_CNT=7\n"
    "NCCL_IB_GID_INDEX=3\n"
    "NCCL_CROSS_NIC=0\n"
    "NCCL_IB_QPS_PER_CONNECTION=4\n"
    "NCCL_NET_GDR_LEVEL=PHB\n",
    "ubu-eth": HEADER.format(host="ubu-eth")
    + "NCCL_IB_DISABLE=1\n"
    "NCCL_SOCKET_IFNAME==eth0\n"
    "NCCL_ALGO=Ring\n",
    # AWS EFA: libfabric + aws-ofi-nccl; no NCCL_IB_* (not even from the group's ib_hcas), no NCCL_CROSS_NIC; the
    # tuner replaces NCCL_ALGO; NCCL_SOCKET_IFNAME excludes docker/lo/veth unless bootstrap_interface names one
    "aws-efa": HEADER.format(host="aws-efa")
    + "FI_PROVIDER=efa\n"
    "FI_EFA_FORK_SAFE=1\n"
    "NCCL_TUNER_PLUGIN=/opt/amazon/ofi-nccl/lib/libnccl-ofi-tuner.so\n"
    "NCCL_SOCKET_IFNAME=^docker,lo,veth\n",
    "aws-efa2": HEADER.format(host="aws-efa2")
    + "FI_PROVIDER=efa\n"
    "FI_EFA_FORK_SAFE=1\n"
    "NCCL_SOCKET_IFNAME==enp71s0\n"
    "NCCL_ALGO=Ring\n"
    "NCCL_BUFFSIZE=8388608\n",
}

PLAYBOOK = textwrap.dedent(
    """\
    ---
    - name: Render the host roles' files locally
      hosts: gpu_nodes
      gather_facts: false
      connection: local
      vars:
        out: "{{ lookup('env', 'RENDER_OUT') }}"
        me: "{{ lookup('env', 'RENDER_USER') }}"
        grp: "{{ lookup('env', 'RENDER_GROUP') }}"
      tasks:
        - name: nccl_tuning (the real role, argument specs included)
          ansible.builtin.include_role:
            name: nccl_tuning
          vars:
            nccl_tuning_conf_path: "{{ out }}/{{ inventory_hostname }}.nccl.conf"
            nccl_tuning_conf_owner: "{{ me }}"
            nccl_tuning_conf_group: "{{ grp }}"
        - name: cluster_firewall rules file
          ansible.builtin.include_role:
            name: cluster_firewall
            tasks_from: rules
          vars:
            cluster_firewall_rules_path: "{{ out }}/{{ inventory_hostname }}.nft"
            cluster_firewall_owner: "{{ me }}"
            cluster_firewall_group: "{{ grp }}"
            cluster_firewall_validate: "true %s"
        - name: Stop before handlers (they would touch systemd)
          ansible.builtin.meta: end_play
    """
)


def _env(out: Path) -> dict[str, str]:
    import grp

    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(ROLES),
        ANSIBLE_LOCAL_TEMP=str(out / ".ansible-tmp"),
        ANSIBLE_REMOTE_TEMP=str(out / ".ansible-tmp"),
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(out / ".facts"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        RENDER_OUT=str(out),
        RENDER_USER=getpass.getuser(),
        RENDER_GROUP=grp.getgrgid(os.getgid()).gr_name,
    )
    return env


def _run(tmp: Path, playbook: str, *extra: str, limit: str | None = None) -> subprocess.CompletedProcess[str]:
    inv = tmp / "inventory.yml"
    inv.write_text(INVENTORY)
    pb = tmp / "play.yml"
    pb.write_text(playbook)
    cmd = [str(ANSIBLE_PLAYBOOK), "-i", str(inv), str(pb), *extra]
    if limit:
        cmd += ["--limit", limit]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(tmp), timeout=300, cwd=PROJECT_ROOT)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("render")
    r = _run(tmp, PLAYBOOK)
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp


@pytest.mark.parametrize("host", sorted(EXPECTED_NCCL))
def test_nccl_conf_exact_bytes(rendered: Path, host: str) -> None:
    assert (rendered / f"{host}.nccl.conf").read_bytes() == EXPECTED_NCCL[host].encode()


@pytest.mark.parametrize("host", ["deb-ib", "deb-ib2", "ubu-roce", "ubu-eth", "aws-efa", "aws-efa2"])
def test_nccl_conf_same_bytes_as_provision_render(rendered: Path, host: str) -> None:
    from provisioner.inventory import load_fleet
    from provisioner.render import host_variables, render_template

    fleet = load_fleet(rendered / "inventory.yml")
    cli = render_template("nccl.conf.j2", host_variables(fleet, host))
    assert cli.encode() == (rendered / f"{host}.nccl.conf").read_bytes()


def _sets(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("set "):
            name = s.split()[1]
            out[name] = ""
        elif name and s.startswith("elements = "):
            out[name] = s[len("elements = ") :]
        elif s == "}":
            name = None
    return out


def test_firewall_scopes_ports_to_the_cluster(rendered: Path) -> None:
    a = (rendered / "deb-ib.nft").read_text()
    sets = _sets(a)
    assert sets["members4"] == "{ 10.20.0.11, 10.20.0.12 }"  # the pair, not every GPU node
    assert sets["clients4"] == "{ 10.20.1.5 }"  # the load balancer; vllm_client_networks is empty
    assert "flush ruleset" not in a and "accept\n\t}" not in a
    assert "table inet provisioner_cluster\ndelete table inet provisioner_cluster\n" in a
    assert '\t\ttcp dport 22 accept comment "SSH stays open"\n' in a
    assert "\t\ttcp dport { 29501, 32768-60999 } ip saddr @members4 accept" in a
    assert '\t\ttcp dport { 8000, 29501, 32768-60999 } counter drop comment "cluster ports, any other source"\n' in a
    assert "policy accept;" in a and "policy drop" not in a  # only our ports are dropped
    ray = (rendered / "ubu-roce.nft").read_text()
    assert _sets(ray)["members4"] == "{ 10.20.0.13 }"
    assert "\t\ttcp dport { 29501, 6379, 8265, 10001-19999, 32768-60999 } ip saddr @members4 accept" in ray
    # a GPU node outside every cluster guards nothing and opens nothing
    none = (rendered / "ubu-eth.nft").read_text()
    assert "dport 8000" not in none and "drop" not in none


def test_argument_specs_reject_bad_input(tmp_path: Path) -> None:
    play = textwrap.dedent(
        """\
        ---
        - name: Argument specs
          hosts: deb-ib
          gather_facts: false
          connection: local
          roles:
            - role: nccl_tuning
              vars:
                nccl_tuning_conf_path: "{{ lookup('env', 'RENDER_OUT') }}/x.conf"
        """
    )
    for extra, message in [
        ("nccl_ib_timeout=40", "value of nccl_ib_timeout must be one of: 1, 2, 3"),
        ("nccl_ib_retry_cnt=9", "value of nccl_ib_retry_cnt must be one of: 0, 1, 2, 3, 4, 5, 6, 7, got: 9"),
        ("fabric=wifi", "value of fabric must be one of: infiniband, roce, ethernet, efa, got: wifi"),
    ]:
        r = _run(tmp_path, play, "-e", extra)
        out = r.stdout + r.stderr
        assert r.returncode != 0, out
        assert "Validation of arguments failed" in out, out
        assert message in " ".join(out.split()), out
        assert not (tmp_path / "x.conf").exists()


FACTS = {
    "Debian": {"distribution": "Debian", "distribution_major_version": "12", "distribution_version": "12.7",
               "architecture": "x86_64", "kernel": "6.1.0-26-amd64"},
    "Ubuntu-22.04": {"distribution": "Ubuntu", "distribution_major_version": "22", "distribution_version": "22.04",
                     "architecture": "x86_64", "kernel": "5.15.0-124-generic"},
    "Ubuntu-24.04": {"distribution": "Ubuntu", "distribution_major_version": "24", "distribution_version": "24.04",
                     "architecture": "aarch64", "kernel": "6.8.0-48-generic"},
}


def _templar(facts: dict[str, str], extra: dict | None = None):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role = ROLES / "nvidia_driver"
    loader = DataLoader()
    variables: dict = {}
    variables.update(loader.load_from_file(str(role / "defaults/main.yml"), trusted_as_template=True))
    variables.update(loader.load_from_file(str(role / f"vars/{facts['distribution']}.yml"), trusted_as_template=True))
    variables.update(extra or {})
    variables["ansible_facts"] = facts
    templar = Templar(loader=loader, variables=variables)

    def render(text: str):
        return templar.template(trust_as_template(text))

    return render, role


@pytest.mark.parametrize(
    "dist,repo,kernel_headers",
    [
        ("Debian", "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/", "linux-headers-6.1.0-26-amd64"),
        ("Ubuntu-22.04", "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/",
         "linux-headers-5.15.0-124-generic"),
        ("Ubuntu-24.04", "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa/",
         "linux-headers-6.8.0-48-generic"),
    ],
)
def test_nvidia_repo_and_pin_per_distribution(dist: str, repo: str, kernel_headers: str) -> None:
    templar, role = _templar(FACTS[dist])
    sources = templar((role / "templates/nvidia-cuda.sources.j2").read_text())
    assert sources.splitlines()[2:] == [
        "Types: deb",
        f"URIs: {repo}",
        "Suites: /",
        "Signed-By: /etc/apt/keyrings/nvidia-cuda.asc",
    ]
    pin = templar((role / "templates/preferences.j2").read_text())
    assert pin.splitlines()[2:] == [
        "Package: nvidia-kernel-open-580 nvidia-open-580 nvidia-utils-580",
        "Pin: version 580.95.05-1*",
        "Pin-Priority: 1001",
    ]
    assert templar("{{ nvidia_driver_header_packages }}") == [kernel_headers, "dkms"]


def test_mirror_with_binary_key_and_dists_layout() -> None:
    templar, role = _templar(
        FACTS["Debian"],
        {"nvidia_repo_url": "http://198.18.0.1:8090/nvidia/",
         "nvidia_repo_key_url": "http://198.18.0.1:8090/nvidia/testbed-archive-keyring.gpg",
         "nvidia_repo_suite": "bookworm", "nvidia_repo_components": ["main"]},
    )
    sources = templar((role / "templates/nvidia-cuda.sources.j2").read_text())
    assert sources.splitlines()[2:] == [
        "Types: deb",
        "URIs: http://198.18.0.1:8090/nvidia/",
        "Suites: bookworm",
        "Components: main",
        "Signed-By: /etc/apt/keyrings/nvidia-cuda.gpg",
    ]


@pytest.mark.parametrize("role,field", [("fabric_manager", "fabric_manager"), ("nvlsm", "nvlsm"), ("imex", "imex")])
def test_role_gpu_mapping_agrees_with_the_gpu_catalog(role: str, field: str) -> None:
    catalog = yaml.safe_load((PROJECT_ROOT / "provisioner/catalog/gpus.yaml").read_text())
    mapping = yaml.safe_load((ROLES / role / "vars/main.yml").read_text())[f"__{role}_gpu_models"]
    assert mapping == {model: bool(spec[field]) for model, spec in catalog.items()}


def test_role_defaults_match_the_pinned_stack_contract() -> None:
    """docs/development.md "Pinned NVIDIA stack": role defaults == stand-in package versions."""
    d = yaml.safe_load((ROLES / "nvidia_driver/defaults/main.yml").read_text())
    assert (d["nvidia_driver_branch"], d["nvidia_driver_version"]) == ("580", "580.95.05-1")
    c = yaml.safe_load((ROLES / "cuda_nccl/defaults/main.yml").read_text())
    assert (c["cuda_version"], c["cuda_cudart_version"]) == ("12.8", "12.8.90-1")
    assert c["nccl_version"] == "2.27.7-1+cuda{{ cuda_version }}"
