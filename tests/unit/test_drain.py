"""Drain/return planning (provisioner/day2/drain.py) and the refusals `provision drain` / `return` give before they
touch a node (in-process, the ledger in tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_inproc import provision
from inventory_factory import write_inventory

from provisioner import ROLES
from provisioner.day2.drain import drained_list, inflight, plan
from provisioner.errors import UsageError
from provisioner.inventory import load_fleet
from provisioner.ledger import Ledger
from provisioner.ledger.site import path_site

INI = """\
[gpu_nodes]
n1 ansible_host=198.18.0.11
n2 ansible_host=198.18.0.12
n3 ansible_host=198.18.0.13
n5 ansible_host=198.18.0.15

[pp]
n1 node_rank=0
n2 node_rank=1

[single]
n3 node_rank=0

[lb]
lb1 ansible_host=198.18.0.20
"""
C = {"model": "/models/tiny", "served_model_name": "tiny", "tensor_parallel_size": 1, "max_model_len": 512,
     "max_num_seqs": 4}


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    return write_inventory(tmp_path / "inv", ini=INI, group_vars={
        "pp": {"vllm_cluster": {**C, "pipeline_parallel_size": 2, "port": 8001}},
        "single": {"vllm_cluster": {**C, "port": 8000}}})


def test_a_member_takes_its_whole_cluster_and_its_head(inv: Path) -> None:
    p = plan(load_fleet(inv), ["n2"])
    assert p.clusters == ("pp",) and p.members["pp"] == ("n1", "n2") and p.hosts == ("n1", "n2")
    assert [(h.cluster, h.host, h.server) for h in p.heads] == [("pp", "n1", "198.18.0.11:8001")]
    assert p.notes == ("n2: cluster pp drains as a whole (with n1)",)
    both = plan(load_fleet(inv), ["single", "n1", "n5"])
    assert both.clusters == ("single", "pp") and both.loose == ("n5",)
    assert [h.server for h in both.heads] == ["198.18.0.13:8000", "198.18.0.11:8001"]


def test_unknown_target_is_a_usage_error_naming_the_clusters(inv: Path) -> None:
    with pytest.raises(UsageError, match=r"nope is neither a host nor a vLLM cluster .*clusters: pp, single"):
        plan(load_fleet(inv), ["nope"])


def test_drained_list_and_inflight_count() -> None:
    assert drained_list(["b:1\n", " ", "a:1"], add=["c:1", "a:1"], remove=["b:1"]) == ["a:1", "c:1"]
    metrics = ('# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine="0",model_name="t"} 2.0\n'
               'vllm:num_requests_waiting{engine="0",model_name="t"} 1.0\nvllm:num_requests_swapped 7.0\n')
    assert inflight(metrics) == 3
    assert inflight("process_cpu_seconds_total 1.0\n") is None


def _serve(db: Path, inv: Path, *hosts: str) -> None:
    with Ledger.open(db, site=path_site(inv)) as lg:
        for h in hosts:
            for a, b in (("new", "provisioning"), ("provisioning", "burn-in"), ("burn-in", "in-service")):
                lg.record_transition(h, a, b, reason="test", actor="test")


def test_drain_of_the_last_serving_cluster_is_refused_before_anything_changes(inv: Path, tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    _serve(db, inv, "n1", "n2", "n3")
    env = {"PROVISION_LEDGER": str(db)}
    with Ledger.open(db, site=path_site(inv)) as lg:
        before = len(lg.transitions("n1")) + len(lg.transitions("n3"))
    # both clusters serve `tiny`: draining both at once would stop the model; the second is refused, the first too
    r = provision("drain", str(inv), "pp", "single", "--reason", "upgrade", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "refused: n3: cluster single is the last one serving /models/tiny: draining it stops the model "
        "(add --force to drain it anyway)"]
    assert "balancer" not in r.stdout
    with Ledger.open(db, site=path_site(inv)) as lg:
        assert len(lg.transitions("n1")) + len(lg.transitions("n3")) == before
        assert lg.state("n1")[0] == lg.state("n3")[0] == "in-service"


def test_return_refuses_a_node_that_never_served_and_usage_errors(inv: Path, tmp_path: Path) -> None:
    env = {"PROVISION_LEDGER": str(tmp_path / "ledger.sqlite3")}
    r = provision("return", str(inv), "single", env=env)
    assert r.returncode == 1 and r.stderr.startswith("refused: n3 is new: return brings back"), r.stderr
    r = provision("drain", str(inv), "single", env=env)
    assert r.returncode == 2 and "--reason" in r.stderr
    r = provision("drain", str(inv), "ghost", "--reason", "x", env=env)
    assert r.returncode == 2 and "ghost is neither a host nor a vLLM cluster" in r.stderr


def test_rewrite_conf_renders_a_drained_head_as_the_template_does() -> None:
    from provisioner.day2.drain import rewrite_conf

    conf = ("upstream vllm_model_0 {\n    server 198.18.1.11:8000 max_fails=3 fail_timeout=10s;  # node01\n"
            "    server 198.18.1.13:8000 max_fails=3 fail_timeout=10s;  # node03\n}\n")
    out = rewrite_conf(conf, add=["198.18.1.11:8000"])
    # the line templates/nginx-vllm.conf.j2 renders for a head in the drained list
    assert out == conf.replace("fail_timeout=10s;  # node01", "fail_timeout=10s down;  # node01 (drained: provision drain)")
    assert rewrite_conf(out or "", add=["198.18.1.11:8000"]) == out  # idempotent
    assert rewrite_conf(out or "", remove=["198.18.1.11:8000"]) == conf
    assert rewrite_conf(conf, add=["198.18.1.1:8000"]) is None  # not a server of this balancer: the playbook's job


def test_the_balancer_step_over_ssh_uses_the_roles_paths(tmp_path: Path) -> None:
    """direct_paths resolves serving_lb's defaults with the balancer's own variables, as the role does: with the
    active health check (the default) the drained `down`s go into its rendered source and its own command (the
    systemd unit's ExecStart) writes the live file; without it, into the live file; templated or non-absolute
    paths go to the playbook."""
    from provisioner.day2.drain import LbPaths, direct_paths

    checker = ("/usr/bin/python3", "-B", "/usr/local/lib/provisioner/vllm-lb/vllm-lb-healthcheck.py",
               "--probe", "/var/lib/vllm-lb/probe.json", "--source", "/var/lib/vllm-lb/vllm-lb.conf.in",
               "--dest", "/etc/nginx/conf.d/vllm-lb.conf", "--timeout", "10",
               "--check-cmd", "/usr/local/sbin/vllm-lb-nginx-check")
    base = load_fleet(write_inventory(tmp_path / "a", ini=INI, group_vars={"all": {"vllm_cluster": C}}))
    assert direct_paths(base, "lb1") == LbPaths("/var/lib/vllm-lb/drained", "/var/lib/vllm-lb/vllm-lb.conf.in",
                                                checker)
    # the unit runs exactly this command (its template, rendered with the same values)
    unit = (ROLES / "serving_lb" / "templates" / "vllm-lb-healthcheck.service.j2").read_text()
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    assert line.split() == ["ExecStart=/usr/bin/python3", "-B",
                            "{{", "serving_lb_libexec_dir", "}}/vllm-lb-healthcheck.py", "--probe", "{{",
                            "serving_lb_probe_file", "}}", "--source", "{{", "serving_lb_state_dir",
                            "}}/vllm-lb.conf.in", "--dest", "{{", "serving_lb_conf_file", "}}", "--timeout", "{{",
                            "serving_lb_active_health_timeout", "}}", "--check-cmd", "{{", "serving_lb_check_bin",
                            "}}"]
    moved = load_fleet(write_inventory(tmp_path / "b", ini=INI, group_vars={
        "all": {"vllm_cluster": C, "vllm_probe_timeout": 7},
        "lb": {"serving_lb_conf_dir": "/opt/nginx", "serving_lb_state_dir": "/srv/lb"}}))
    m = direct_paths(moved, "lb1")
    assert m is not None and (m.drained, m.conf) == ("/srv/lb/drained", "/srv/lb/vllm-lb.conf.in")
    assert m.checker is not None and m.checker[m.checker.index("--timeout") + 1] == "7"
    assert m.checker[m.checker.index("--dest") + 1] == "/opt/nginx/conf.d/vllm-lb.conf"
    passive = load_fleet(write_inventory(tmp_path / "c", ini=INI, group_vars={
        "all": {"vllm_cluster": C}, "lb": {"serving_lb_active_health": "no"}}))
    assert direct_paths(passive, "lb1") == LbPaths("/var/lib/vllm-lb/drained", "/etc/nginx/conf.d/vllm-lb.conf")
    relative = load_fleet(write_inventory(tmp_path / "d", ini=INI, group_vars={
        "all": {"vllm_cluster": C}, "lb": {"serving_lb_drained_file": "drained"}}))
    assert direct_paths(relative, "lb1") is None
    spaced = load_fleet(write_inventory(tmp_path / "e", ini=INI, group_vars={
        "all": {"vllm_cluster": C}, "lb": {"serving_lb_probe_file": "/srv/my probes.json"}}))
    assert direct_paths(spaced, "lb1") is None
