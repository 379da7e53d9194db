"""Burn-in's cross-node plan (provisioner/probes/burnin_cross.py): which pairs of a vLLM cluster's members run in which
round, why a host has none, and how a failing pair is attributed when a cluster has 3+ members. Pure, in-process."""

from __future__ import annotations

from pathlib import Path

from inventory_factory import write_inventory

from provisioner.inventory import load_fleet
from provisioner.probes.burnin_cross import Pair, attribute, plan_pairs

INI = """\
[gpu_nodes]
n1 ansible_host=198.18.0.11
n2 ansible_host=198.18.0.12
n3 ansible_host=198.18.0.13
n4 ansible_host=198.18.0.14
n5 ansible_host=198.18.0.15
n6 ansible_host=198.18.0.16

[four]
n1 node_rank=0
n2 node_rank=1
n3 node_rank=2
n4 node_rank=3

[pair]
n5 node_rank=0
n6 node_rank=1
"""
C = {"model": "/models/tiny", "served_model_name": "tiny", "tensor_parallel_size": 8, "max_model_len": 512}


def test_every_pair_of_each_cluster_once_and_no_host_twice_in_a_round(tmp_path: Path) -> None:
    fleet = load_fleet(write_inventory(tmp_path / "inv", ini=INI, group_vars={
        "four": {"vllm_cluster": {**C, "pipeline_parallel_size": 4, "port": 8001}},
        "pair": {"vllm_cluster": {**C, "pipeline_parallel_size": 2, "port": 8002}}}))
    rounds, why = plan_pairs(fleet, ["n1", "n2", "n3", "n4", "n5", "n6"])
    assert why == {}
    assert len(rounds) == 3  # 4 members: 3 rounds of 2 pairs; the pair cluster runs in round 1 beside them
    seen = [frozenset((p.server, p.client)) for r in rounds for p in r]
    assert sorted(map(sorted, seen)) == sorted(map(sorted, [{"n1", "n2"}, {"n1", "n3"}, {"n1", "n4"}, {"n2", "n3"},
                                                            {"n2", "n4"}, {"n3", "n4"}, {"n5", "n6"}]))
    for r in rounds:
        hosts = [h for p in r for h in (p.server, p.client)]
        assert len(hosts) == len(set(hosts)), r
    # a run with one member of a cluster, and a host in no cluster
    rounds, why = plan_pairs(fleet, ["n1", "n5"])
    assert rounds == [] and "the only member of cluster four" in why["n1"] and "cluster pair" in why["n5"]


def test_no_cluster_no_pair(tmp_path: Path) -> None:
    fleet = load_fleet(write_inventory(tmp_path / "inv", ini=INI, group_vars={}))
    rounds, why = plan_pairs(fleet, ["n1", "n2"])
    assert rounds == [] and why["n1"].startswith("not a member of a vLLM cluster")
    assert Pair("c", "a", "b").server == "a"


def _r(link: str, status: str) -> dict[str, object]:
    return {"check": "ib_pair", "link": link, "status": status, "message": link, "code": "BRN016" if status == "fail"
            else None}


def test_a_failed_pair_is_the_peers_fault_where_the_hosts_other_pairs_pass_on_that_rail() -> None:
    """n3's mlx5_2 at half rate in a cluster of three: both of n3's pairs fail on mlx5_2; n1 and n2 each have a
    passing mlx5_2 pair with each other, so their copies of the failing pairs are warnings and n3 keeps failures."""
    bad13, bad23 = _r("n1/mlx5_2:1-n3/mlx5_2:1", "fail"), _r("n2/mlx5_2:1-n3/mlx5_2:1", "fail")
    ok12 = _r("n1/mlx5_2:1-n2/mlx5_2:1", "pass")
    got = attribute({"n1": [bad13, ok12], "n2": [bad23, ok12], "n3": [bad13, bad23]})
    assert [r["status"] for r in got["n3"]] == ["fail", "fail"]
    assert [r["status"] for r in got["n1"]] == ["warn", "pass"] and "the peer is at fault" in got["n1"][0]["message"]
    assert [r["status"] for r in got["n2"]] == ["warn", "pass"]
    # two members: nothing to compare with, both keep the failure
    two = attribute({"n1": [bad13], "n3": [bad13]})
    assert two["n1"][0]["status"] == two["n3"][0]["status"] == "fail"


def test_status_labels_a_failed_link_check_by_its_link_and_a_gpu_check_by_its_gpu() -> None:
    from provisioner.ledger.view import burnin_label

    row = {"check": "ib_pair", "gpu": -1, "code": "BRN016",
           "detail": "n1/mlx5_2:1-n2/mlx5_2:1: ib_pair_gbps 192.0 < 345.6 (56% of the minimum)"}
    assert burnin_label(row) == "ib_pair[n1/mlx5_2:1-n2/mlx5_2:1] BRN016"
    assert burnin_label({**row, "check": "ib_link", "code": "BRN019",
                         "detail": "mlx5_2:1: link rate 200 Gb/s < 400"}) == "ib_link[mlx5_2:1] BRN019"
    assert burnin_label({"check": "hbm", "gpu": 5, "code": "BRN002", "detail": "GPU 5: x"}) == "hbm[gpu5] BRN002"
    assert burnin_label({"check": "nccl", "gpu": -1, "code": "BRN012", "detail": "a: b"}) == "nccl BRN012"
