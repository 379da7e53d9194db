"""The roles of the new shapes, rendered locally with Ansible (no root, no network): the IMEX tray list of an NVL72
domain (the shared template with the imex role's imex_nodes), and the cluster firewall opening IMEX's port to the
domain's trays only (hosts that are no NVL72 tray get no domain rule)."""

from __future__ import annotations

import getpass
import grp
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from provisioner import PROJECT_ROOT, ROLES

ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

INVENTORY = textwrap.dedent(
    """\
    all:
      children:
        gpu_nodes:
          hosts:
            tray01: {ansible_host: 10.20.0.21, nvlink_domain: nvl72-a, node_rank: 0}
            tray02: {ansible_host: 10.20.0.22, nvlink_domain: nvl72-a, node_rank: 1}
            tray03: {ansible_host: 10.20.0.23, nvlink_domain: nvl72-a, imex_address: 10.30.0.23}
            tray11: {ansible_host: 10.20.0.31, nvlink_domain: nvl72-b}
            hgx01: {ansible_host: 10.20.0.41, gpu_model: H100-SXM5-80GB}
          vars:
            gpu_model: GB200-186GB
            gpu_count: 4
        pair:
          hosts: {tray01: null, tray02: null}
          vars:
            vllm_cluster: {model: /models/m, model_arch: Llama-2-7B, tensor_parallel_size: 4,
                           pipeline_parallel_size: 2, port: 8000, master_port: 29501}
    """
)

PLAYBOOK = textwrap.dedent(
    """\
    ---
    - name: Render the new roles' files locally
      hosts: gpu_nodes
      gather_facts: false
      connection: local
      vars:
        out: "{{ lookup('env', 'RENDER_OUT') }}"
      tasks:
        - name: IMEX tray list (the imex role's template and default)
          ansible.builtin.template:
            src: "{{ lookup('env', 'ROLES') }}/../templates/nvidia-imex-nodes_config.cfg.j2"
            dest: "{{ out }}/{{ inventory_hostname }}.nodes"
            mode: "0644"
          when: nvlink_domain is defined
        - name: cluster_firewall rules file
          ansible.builtin.include_role:
            name: cluster_firewall
            tasks_from: rules
          vars:
            cluster_firewall_rules_path: "{{ out }}/{{ inventory_hostname }}.nft"
            cluster_firewall_owner: "{{ lookup('env', 'RENDER_USER') }}"
            cluster_firewall_group: "{{ lookup('env', 'RENDER_GROUP') }}"
            cluster_firewall_validate: "true %s"
        - name: Stop before handlers
          ansible.builtin.meta: end_play
      roles:
        - role: provisioner_plan  # the fleet plan the roles read (computed on the controller)
        - role: imex
          when: false  # loads the role's defaults (imex_domain_hosts) without running it
    """
)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("fabric")
    (tmp / "inventory.yml").write_text(INVENTORY)
    (tmp / "play.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROLES),
               ANSIBLE_LOCAL_TEMP=str(tmp / ".t"), ANSIBLE_REMOTE_TEMP=str(tmp / ".t"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp / ".facts"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, RENDER_OUT=str(tmp), ROLES=str(ROLES),
               RENDER_USER=getpass.getuser(), RENDER_GROUP=grp.getgrgid(os.getgid()).gr_name)
    r = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(tmp / "inventory.yml"), str(tmp / "play.yml")],
                       capture_output=True, text=True, env=env, timeout=600, cwd=PROJECT_ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp


def _addresses(path: Path) -> list[str]:
    return [x for x in path.read_text().splitlines() if x and not x.startswith("#")]


def test_imex_nodes_config_lists_the_domains_trays(rendered: Path) -> None:
    for tray in ("tray01", "tray02", "tray03"):
        assert _addresses(rendered / f"{tray}.nodes") == ["10.20.0.21", "10.20.0.22", "10.30.0.23"]
    assert _addresses(rendered / "tray11.nodes") == ["10.20.0.31"]


def test_firewall_opens_imex_to_the_domain_only(rendered: Path) -> None:
    # a tray in no vLLM cluster: IMEX's port open to the domain's trays (their IMEX addresses), dropped otherwise
    t3 = (rendered / "tray03.nft").read_text()
    assert "\t\telements = { 10.20.0.21, 10.20.0.22, 10.30.0.23 }\n" in t3
    assert '\t\ttcp dport 50000 ip saddr @domain4 accept comment "IMEX: the trays of this NVLink domain"\n' in t3
    assert '\t\ttcp dport 50000 counter drop comment "cluster ports, any other source"\n' in t3
    # a tray of a vLLM cluster: the guarded ephemeral range already holds 50000 (no overlapping set elements)
    t1 = (rendered / "tray01.nft").read_text()
    assert "\t\ttcp dport 50000 ip saddr @domain4 accept" in t1
    assert '\t\ttcp dport { 8000, 29501, 32768-60999 } counter drop comment "cluster ports, any other source"\n' in t1
    assert t1.index("@domain4 accept") < t1.index("counter drop")
    # the other domain's tray: only itself
    assert "\t\telements = { 10.20.0.31 }\n" in (rendered / "tray11.nft").read_text()
    # a host without nvlink_domain: no domain set, nothing guarded (outside every cluster)
    hgx = (rendered / "hgx01.nft").read_text()
    assert "domain4" not in hgx and "drop" not in hgx
