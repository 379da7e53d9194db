"""Which roles `provision run|drift` leave out by tag (provisioner/role_gates.py): only roles that act on no host of
the run, decided from the inventory as the roles' own `when` decides it; anything undecidable keeps the role."""

from __future__ import annotations

from pathlib import Path

import yaml
from vllm_rack_inventory import write_vllm_rack_inventory

from provisioner.inventory import load_fleet
from provisioner.role_gates import GATED, idle_roles
from provisioner.runner.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]


def _fleet(tmp_path: Path, hosts: dict[str, dict[str, object]]):
    lines = ["[gpu_nodes]"]
    for name, hv in hosts.items():
        lines.append(name + "".join(f" {k}={v}" for k, v in hv.items()))
    lines += ["", "[gpu_nodes:vars]", "gpu_count=8"]
    inv = tmp_path / "hosts.ini"
    inv.write_text("\n".join(lines) + "\n")
    return load_fleet(inv)


H100 = {"gpu_model": "H100-SXM5-80GB", "fabric": "infiniband"}


def test_a_homogeneous_h100_rack_without_clusters_leaves_out_what_it_does_not_need(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, {"n1": H100, "n2": H100})
    assert idle_roles(fleet, ["n1", "n2"]) == ("efa", "imex", "nvlsm", "vllm")


def test_one_host_of_another_shape_keeps_its_roles(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, {"n1": H100, "b1": {"gpu_model": "B200-SXM-180GB"},
                              "g1": {"gpu_model": "GB200-186GB"}, "e1": {**H100, "fabric": "efa"}})
    assert idle_roles(fleet, ["n1", "b1", "g1", "e1"]) == ("vllm",)
    # the same fleet, a run limited to the H100 host
    assert idle_roles(fleet, ["n1"]) == ("efa", "imex", "nvlsm", "vllm")
    # fabric efa only: the inbox RDMA stack is idle, the EFA installer is not
    assert idle_roles(fleet, ["e1"]) == ("imex", "infiniband", "nvlsm", "vllm")
    # GB200 trays: IMEX, never Fabric Manager
    assert idle_roles(fleet, ["g1"]) == ("efa", "fabric_manager", "nvlsm", "vllm")


def test_an_inventory_switch_wins_over_the_catalog(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, {"n1": {**H100, "gpu_needs_nvlsm": "yes", "gpu_needs_fabric_manager": "false"}})
    assert idle_roles(fleet, ["n1"]) == ("efa", "fabric_manager", "imex", "vllm")


def test_what_only_ansible_can_resolve_keeps_the_role(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, {"n1": {**H100, "gpu_needs_imex": "'{{ site_imex }}'", "fabric": "'{{ site_fabric }}'"},
                              "x1": {"gpu_model": "Z9000", "fabric": "infiniband"}})
    # imex: templated; efa and infiniband: the fabric is templated; an unknown model needs none of the three
    assert idle_roles(fleet, ["n1"]) == ("nvlsm", "vllm")
    assert idle_roles(fleet, ["x1"]) == ("efa", "fabric_manager", "imex", "nvlsm", "vllm")


def test_extra_vars_that_set_a_deciding_variable_keep_the_role(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, {"n1": H100})
    assert idle_roles(fleet, ["n1"], {"fabric": "efa"}) == ("imex", "nvlsm", "vllm")
    assert idle_roles(fleet, ["n1"], {"gpu_model": "GB200-186GB"}) == ("efa", "vllm")
    assert idle_roles(fleet, ["n1"], {"vllm_cluster": {"model": "x"}}) == ("efa", "imex", "nvlsm")


def test_no_host_or_an_unknown_host_gates_nothing(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, {"n1": H100})
    assert idle_roles(fleet, []) == ()
    assert idle_roles(fleet, ["n1", "nope"]) == ()


def test_vllm_members_keep_the_vllm_play_and_others_do_not(tmp_path: Path) -> None:
    fleet = load_fleet(write_vllm_rack_inventory(tmp_path))
    assert sorted(fleet.hosts) == ["node01", "node02", "node03"]
    assert "vllm" not in idle_roles(fleet, ["node03"])
    assert "vllm" not in idle_roles(fleet, ["node01", "node02"])


def test_a_host_in_no_cluster_beside_members_does_not_gate_the_vllm_play(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpu_nodes]\nn1 gpu_model=H100-SXM5-80GB\nn2 gpu_model=H100-SXM5-80GB\n\n[vllm_a]\nn1\n\n"
                   "[vllm_a:vars]\nvllm_cluster={'model': '/models/x', 'model_arch': 'Llama-2-7B'}\n")
    fleet = load_fleet(inv)
    assert list(fleet.clusters) == ["vllm_a"]
    assert "vllm" not in idle_roles(fleet, ["n1", "n2"])
    assert "vllm" in idle_roles(fleet, ["n2"])


def test_idle_roles_reach_ansible_as_skip_tags_beside_the_users(tmp_path: Path) -> None:
    cfg = RunConfig(inventory=tmp_path, command="drift", skip_tags="monitoring", idle_roles=("efa", "imex"))
    assert cfg.ansible_skip_tags() == "monitoring,efa,imex,validate"
    assert RunConfig(inventory=tmp_path, command="onboard").ansible_skip_tags() is None
    assert RunConfig(inventory=tmp_path, command="onboard", idle_roles=("efa",)).ansible_skip_tags() == "efa"


def _role_tags(playbook: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for play in yaml.safe_load((ROOT / "playbooks" / playbook).read_text()):
        for entry in play.get("roles", []):
            out[entry["role"]] = list(entry.get("tags", [])) + list(play.get("tags", []))
    return out


def test_each_gate_names_a_tag_the_playbooks_carry_and_mirrors_the_roles_when() -> None:
    tags = {p: _role_tags(p) for p in ("node.yml", "gpu_stack.yml", "fabric.yml", "vllm.yml")}
    for role, deciding in GATED.items():
        where = [p for p, roles in tags.items() if role in roles]
        assert where, f"no playbook runs role {role}"
        for p in where:
            assert role in tags[p][role], f"{p}: role {role} lacks tag {role}"
        if role in ("infiniband", "vllm"):
            continue  # gated by the play entry's when (infiniband) or by the plan's cluster (vllm below)
        tasks = yaml.safe_load((ROOT / "roles" / role / "tasks" / "main.yml").read_text())
        # every task of the role sits in one block whose `when` reads the gate's variable
        assert len(tasks) == 1 and "block" in tasks[0], f"roles/{role}/tasks/main.yml: not one gated block"
        assert deciding[-1] in str(tasks[0]["when"]), (role, tasks[0]["when"])
    vllm_tasks = yaml.safe_load((ROOT / "roles" / "vllm" / "tasks" / "main.yml").read_text())
    assert any("block" in t and "vllm_facts is not none" in str(t.get("when")) for t in vllm_tasks)
