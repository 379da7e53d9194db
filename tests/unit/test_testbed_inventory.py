"""The generated testbed inventory, read back through the real loader (ansible-core)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from provisioner.inventory import load_fleet
from provisioner_testbed import inventory_writer as invw


def _rack(n: int, **over: object) -> invw.InvRack:
    hosts = tuple(invw.InvHost(name=f"node{i:02d}", address=f"198.18.0.{10 + i}") for i in range(1, n + 1))
    return invw.InvRack(name="rack", hosts=hosts, key_file="/k/id_ed25519", known_hosts="/k/known_hosts",
                        repo_url="http://198.18.0.1:8090/nvidia/", proxy_url="http://198.18.0.1:3128", **over)


def test_default_rack_inventory_follows_the_contract(tmp_path: Path) -> None:
    path = invw.write(_rack(4), tmp_path)
    fleet = load_fleet(path)
    assert list(fleet.hosts) == ["node01", "node02", "node03", "node04"]
    h = fleet.hosts["node03"]
    assert (h.gpu_model, h.gpu_count, h.fabric, h.bootstrap_interface, h.ssh_user) == (
        "H100-SXM5-80GB", 8, "infiniband", "host0", "root")
    assert h.ib_hcas == tuple(f"mlx5_{i}" for i in range(8))
    assert h.address == "198.18.0.13" and h.is_gpu_node
    assert h.vars["nvidia_repo_url"] == "http://198.18.0.1:8090/nvidia/"
    assert h.vars["nvidia_repo_key_url"] == "http://198.18.0.1:8090/nvidia/testbed-archive-keyring.gpg"
    assert h.vars["apt_proxy"] == "http://198.18.0.1:3128"
    assert "nvidia_repo_key_fingerprints" not in h.vars  # no stand-in key known: the role default stays
    pinned = load_fleet(invw.write(_rack(1, repo_key_fingerprint="AB" * 20), tmp_path / "pinned"))
    assert pinned.hosts["node01"].vars["nvidia_repo_key_fingerprints"] == ["AB" * 20]
    args = h.vars["ansible_ssh_common_args"]
    assert "UserKnownHostsFile=/k/known_hosts" in args and "StrictHostKeyChecking=yes" in args
    assert {c: list(fleet.clusters[c].members) for c in fleet.clusters} == {
        "vllm_pp": ["node01", "node02"], "vllm_single": ["node03"]}
    pp = fleet.clusters["vllm_pp"]
    assert (pp.get("tensor_parallel_size"), pp.get("pipeline_parallel_size")) == (8, 2)
    assert [fleet.hosts[m].node_rank for m in pp.members] == [0, 1]
    assert fleet.hosts["node04"].node_rank is None


def test_small_racks_get_the_clusters_they_can_hold(tmp_path: Path) -> None:
    assert invw.clusters(["a"]) == {"vllm_single": ["a"]}
    assert invw.clusters(["a", "b"]) == {"vllm_pp": ["a", "b"]}
    assert invw.clusters([f"n{i}" for i in range(16)]) == {"vllm_pp": ["n0", "n1"], "vllm_single": ["n2"]}
    fleet = load_fleet(invw.write(_rack(1), tmp_path))
    assert list(fleet.clusters) == ["vllm_single"]


def test_per_host_hardware_differences_become_host_vars(tmp_path: Path) -> None:
    r = _rack(2)
    hosts = (r.hosts[0], invw.InvHost(name="node02", address="198.18.0.12", gpu_model="H200-SXM-141GB",
                                      gpu_count=4, ib_hcas=("mlx5_0", "mlx5_1")))
    fleet = load_fleet(invw.write(invw.InvRack(**{**r.__dict__, "hosts": hosts}), tmp_path))
    assert (fleet.hosts["node01"].gpu_model, fleet.hosts["node01"].gpu_count) == ("H100-SXM5-80GB", 8)
    assert (fleet.hosts["node02"].gpu_model, fleet.hosts["node02"].gpu_count) == ("H200-SXM-141GB", 4)
    assert fleet.hosts["node02"].ib_hcas == ("mlx5_0", "mlx5_1")
    assert len(fleet.hosts["node01"].ib_hcas) == 8
    assert fleet.clusters["vllm_pp"].get("tensor_parallel_size") == 4


def test_rewrite_is_change_only_and_drops_stale_groups(tmp_path: Path) -> None:
    invw.write(_rack(4), tmp_path)
    ini = tmp_path / "hosts.ini"
    mtime = ini.stat().st_mtime_ns
    invw.write(_rack(4), tmp_path)
    assert ini.stat().st_mtime_ns == mtime
    invw.write(_rack(2), tmp_path)
    assert not (tmp_path / "group_vars" / "vllm_single.yml").exists()
    assert (tmp_path / "group_vars" / "vllm_pp.yml").exists()


def test_named_racks_get_their_own_directory() -> None:
    assert invw.inventory_dir("rack").name == "testbed"
    assert invw.inventory_dir("ci").name == "testbed-ci"


def test_plain_rack_inventory_passes_the_rules(tmp_path: Path) -> None:
    from provisioner.rules import run_rules

    fleet = load_fleet(invw.write(_rack(4), tmp_path))
    errors = [f for f in run_rules(fleet) if getattr(f, "severity", "") == "error"]
    assert errors == []
    assert fleet.clusters["vllm_pp"].get("model_arch") == "Llama-3.1-70B"


def test_the_rack_inventory_with_its_tls_repo_validates_with_no_warning_a_plain_http_repo_warns(tmp_path: Path) -> None:
    """A new rack's inventory names its repo over HTTPS with the rack's CA in site_ca_certificates and the repo key
    pinned: zero findings of any severity (validate says 0 warnings). The same rack with the plain-HTTP URL (a rack
    made before) still gets SUP004: the rule is not weakened for it."""
    from provisioner.rules import run_rules
    from provisioner_testbed import tls

    tls.ensure(tmp_path / "ca", "198.18.0.1", "test repo CA")
    pem = (tmp_path / "ca" / "ca.pem").read_text()
    rack = _rack(4, clusters=False, repo_key_fingerprint="AB" * 20, repo_ca_pem=pem)
    rack = dataclasses.replace(rack, repo_url="https://198.18.0.1:8091/nvidia/")
    fleet = load_fleet(invw.write(rack, tmp_path / "tls"))
    h = fleet.hosts["node01"]
    assert h.vars["nvidia_repo_url"] == "https://198.18.0.1:8091/nvidia/"
    assert [c.strip() for c in h.vars["site_ca_certificates"]] == [pem.strip()]
    assert [(f.code, f.message) for f in run_rules(fleet) if f.severity in ("error", "warning")] == []
    plain = load_fleet(invw.write(dataclasses.replace(rack, repo_url="http://198.18.0.1:8090/nvidia/"),
                                  tmp_path / "plain"))
    assert [f.code for f in run_rules(plain) if f.severity == "warning"] == ["SUP004"]


def test_vllm_layer_settings_replace_the_catalog_model(tmp_path: Path) -> None:
    hosts = tuple(invw.InvHost(name=f"node{i:02d}", address=f"198.18.0.{10 + i}", gpu_count=1) for i in (1, 2, 3))
    r = invw.InvRack(name="rack", hosts=hosts, key_file="/k", known_hosts="/kh", repo_url="http://g/nvidia/",
                     proxy_url="http://g:3128", extra_vars={"vllm_venv": "/opt/vllm/venv"},
                     cluster_vars={"vllm_pp": {"model": "/opt/models/tiny-llama", "model_config": "/c.json",
                                               "tensor_parallel_size": 1}})
    fleet = load_fleet(invw.write(r, tmp_path))
    pp, single = fleet.clusters["vllm_pp"], fleet.clusters["vllm_single"]
    assert (pp.get("model"), pp.get("model_config"), pp.get("model_arch")) == ("/opt/models/tiny-llama", "/c.json",
                                                                               None)
    assert pp.get("tensor_parallel_size") == 1 and pp.get("pipeline_parallel_size") == 2
    assert single.get("model_arch") == "Llama-3.1-8B"
    assert fleet.hosts["node01"].vars["vllm_venv"] == "/opt/vllm/venv"


def test_with_vllm_rack_inventory_is_cpu_vllm_ready_as_written(tmp_path: Path) -> None:
    """`testbed up --with-vllm` writes everything `provision onboard` needs (nothing is patched in afterwards)."""

    from vllm_rack_inventory import write_vllm_rack_inventory

    from provisioner.rules import run_rules
    from provisioner_testbed import vllm_image

    cfg = vllm_image.model_config_path(tmp_path / "cache")  # what the layer build exports on the controller
    fleet = load_fleet(write_vllm_rack_inventory(tmp_path))
    h = fleet.hosts["node02"].vars
    assert h["gpu_needs_fabric_manager"] is False  # one simulated GPU: no NVSwitch, no Fabric Manager
    assert h["vllm_client_networks"] == ["198.18.7.0/24"]
    assert h["vllm_api_key"] == vllm_image.TESTBED_API_KEY and h["vllm_env_extra"]["HF_HUB_OFFLINE"] == "1"
    for name, pp in (("vllm_pp", 2), ("vllm_single", 1)):
        c = fleet.clusters[name]
        assert (c.get("tensor_parallel_size"), c.get("pipeline_parallel_size"), c.get("dtype"), c.get("model")) == (
            1, pp, "float32", "/opt/models/tiny-llama")
        assert c.get("model_config") == str(cfg) and c.get("model_arch") is None
    assert [f for f in run_rules(fleet) if getattr(f, "severity", "") == "error"] == []
    # 8-GPU HGX nodes keep their NVSwitch: the role's default decides
    extra8, _ = vllm_image.testbed_rack_inventory({"vllm_single": ["n1"]}, {"n1": 8}, "198.18.7.0/24", tmp_path / "cache")
    assert "gpu_needs_fabric_manager" not in extra8


def test_a_rack_without_clusters_declares_none_and_validates(tmp_path: Path) -> None:
    """`provision testbed up` on a plain rack (no vLLM layer): no cluster group, so site.yml's vLLM area has nothing
    to do there and the plain run/drift of `make demo`'s rack is clean."""
    from provisioner.rules import run_rules

    files = invw.render(_rack(4, clusters=False))
    assert not [f for f in files if f.startswith("group_vars/vllm_")]
    assert "[vllm_" not in files["hosts.ini"] and "node_rank" not in files["hosts.ini"]
    fleet = load_fleet(invw.write(_rack(4, clusters=False), tmp_path))
    assert fleet.clusters == {} and len(fleet.hosts) == 4
    assert [f for f in run_rules(fleet) if getattr(f, "severity", "") == "error"] == []


def test_balancer_hosts_go_in_group_lb_not_among_the_gpu_nodes(tmp_path: Path) -> None:
    """`testbed up --balancers 1`: lb01 follows the nodes in group `lb` only (no hardware vars, no rank, not a cluster
    member), so the clusters and their GPU counts are those of the nodes alone, and the inventory validates."""
    from provisioner.rules import run_rules

    lb = invw.InvHost(name="lb01", address="198.18.0.14", gpu_count=1, group=invw.LB_GROUP)
    rack = _rack(3)
    files = invw.render(dataclasses.replace(rack, hosts=(*rack.hosts, lb)))
    assert files["hosts.ini"].endswith("\n[lb]\nlb01 ansible_host=198.18.0.14\n")
    assert not any("lb01" in f for f in files)
    fleet = load_fleet(invw.write(dataclasses.replace(rack, hosts=(*rack.hosts, lb)), tmp_path))
    assert [h.name for h in fleet.gpu_nodes] == ["node01", "node02", "node03"]
    assert not fleet.hosts["lb01"].is_gpu_node and "lb" in fleet.hosts["lb01"].groups
    assert {c: list(fleet.clusters[c].members) for c in fleet.clusters} == {
        "vllm_pp": ["node01", "node02"], "vllm_single": ["node03"]}
    assert fleet.hosts["node01"].gpu_count == 8  # the balancer's own spec did not split the nodes' common vars
    assert [f for f in run_rules(fleet) if getattr(f, "severity", "") == "error"] == []


def test_a_rack_with_balancers_numbers_them_after_the_nodes_and_refuses_a_changed_count() -> None:
    from provisioner.errors import UsageError
    from provisioner_testbed import rack

    st = rack._new_state(rack.UpOptions(name="demo", nodes=3, balancers=1), 9)
    assert [(h.name, h.index, h.role) for h in st.hosts] == [
        ("node01", 1, "node"), ("node02", 2, "node"), ("node03", 3, "node"), ("lb01", 4, "balancer")]
    assert len({h.address for h in st.hosts}) == 4 and len({h.machine for h in st.hosts}) == 4
    inv = rack._inv_host(st.hosts[3], {})
    assert inv.group == invw.LB_GROUP and rack._inv_host(st.hosts[0], {}).group == invw.GPU_GROUP
    try:
        rack._check_same(st, rack.UpOptions(name="demo", nodes=3))
    except UsageError as exc:
        assert "1 balancer host(s) (asked 0)" in str(exc) and "testbed down --name demo" in str(exc)
    else:
        raise AssertionError("a changed balancer count was not refused")


def test_the_rack_inventory_points_the_hardware_boundary_at_hwsim_and_no_role_knows_the_rack(tmp_path: Path) -> None:
    from provisioner import PROJECT_ROOT as ROOT
    from provisioner.probes.health import health_argv
    from provisioner_testbed.hosts import HWSIM_MOUNT

    fleet = load_fleet(invw.write(_rack(2), tmp_path))
    h = fleet.hosts["node01"]
    assert (h.vars["nvidia_driver_sysfs_root"], h.vars["node_health_sysfs_root"], h.vars["node_health_kmsg"]) == (
        HWSIM_MOUNT, HWSIM_MOUNT, f"{HWSIM_MOUNT}/kmsg")
    argv = health_argv(fleet, h)
    assert argv[argv.index("--kmsg") + 1] == f"{HWSIM_MOUNT}/kmsg"
    assert argv[argv.index("--sysfs-root") + 1] == HWSIM_MOUNT
    # a real node's inventory names neither: the program reads /dev/kmsg and / as the role does
    boundary = ("nvidia_driver_sysfs_root", "node_health_sysfs_root", "node_health_kmsg")
    plain = dataclasses.replace(h, vars={k: v for k, v in h.vars.items() if k not in boundary})
    argv = health_argv(fleet, plain)
    assert "--kmsg" not in argv and "--sysfs-root" not in argv
    # the simulated rack lives in its inventory only: no role, playbook or plugin asks whether it runs on one
    readers = [str(p.relative_to(ROOT)) for d in ("roles", "playbooks", "plugins") for p in (ROOT / d).rglob("*")
               if p.is_file() and p.suffix in (".yml", ".j2", ".py") and "testbed_rack" in p.read_text()]
    assert readers == []


def test_the_racks_secrets_are_vaulted_and_a_rewrite_keeps_their_vault_text(tmp_path: Path) -> None:
    """`testbed up` vaults the API key and the BMC password (provisioner_testbed.vault's password): the files hold
    `!vault` values only, they decrypt with that password, and rewriting an unchanged rack changes no byte."""
    from provisioner import vault
    from provisioner.rules import run_rules

    pw = tmp_path / "vault-password"
    pw.write_text("rack-vault-pw\n")
    secrets = {"vllm_api_key": "testbed-key-123", "bmc_password": "bmc-pw-456", "bmc_username": "testbed"}
    rack = _rack(2, extra_vars=secrets)
    path = invw.write(rack, tmp_path / "inv", vault_password_file=pw)
    text = (tmp_path / "inv" / "group_vars" / "all.yml").read_text()
    assert "testbed-key-123" not in text and "bmc-pw-456" not in text
    assert "vllm_api_key: !vault |" in text and "bmc_password: !vault |" in text
    invw.write(rack, tmp_path / "inv", vault_password_file=pw)
    assert (tmp_path / "inv" / "group_vars" / "all.yml").read_text() == text
    vault._reset_for_tests()
    try:
        fleet = load_fleet(path, vault_password_file=pw)
        hv = fleet.hosts["node01"].vars
        assert vault.is_vaulted(hv["vllm_api_key"]) and str(hv["vllm_api_key"]) == "testbed-key-123"
        assert str(hv["bmc_password"]) == "bmc-pw-456"
        assert not [f for f in run_rules(fleet) if f.code == "BMC004"]  # not plain text
    finally:
        vault._reset_for_tests()
    # a new value is encrypted afresh
    invw.write(dataclasses.replace(rack, extra_vars={**secrets, "vllm_api_key": "another"}), tmp_path / "inv",
               vault_password_file=pw)
    assert (tmp_path / "inv" / "group_vars" / "all.yml").read_text() != text


def test_a_vllm_rack_with_a_balancer_has_the_alert_loop_from_the_start(tmp_path: Path) -> None:
    """A vLLM rack's first balancer host is also its `monitoring` host (Prometheus + Alertmanager, routed to the
    controller's receiver on the rack bridge); the receiver's token is vaulted in group all; the inventory validates.
    A rack without balancers has no monitoring group."""
    from provisioner import vault
    from provisioner.rules import run_rules
    from provisioner_testbed import rack as testbed

    pw = tmp_path / "vault-password"
    pw.write_text("rack-vault-pw\n")
    lb = invw.InvHost(name="lb01", address="198.18.0.14", gpu_count=1, group=invw.LB_GROUP)
    base = _rack(3, extra_vars={"alert_receiver_token": testbed.ALERT_RECEIVER_TOKEN},
                 monitoring_vars=testbed.alert_loop_vars("198.18.0.1"))
    rack = dataclasses.replace(base, hosts=(*base.hosts, lb))
    files = invw.render(rack)
    assert files["hosts.ini"].endswith("\n[lb]\nlb01 ansible_host=198.18.0.14\n\n[monitoring]\nlb01\n")
    assert "[monitoring]" not in invw.render(base)["hosts.ini"]  # no balancer: no monitoring host
    path = invw.write(rack, tmp_path / "inv", vault_password_file=pw)
    assert testbed.ALERT_RECEIVER_TOKEN not in (tmp_path / "inv" / "group_vars" / "all.yml").read_text()
    vault._reset_for_tests()
    try:
        fleet = load_fleet(path, vault_password_file=pw)
        lbv = fleet.hosts["lb01"].vars
        assert fleet.groups["monitoring"] == ("lb01",)
        assert lbv["alertmanager_receiver_url"] == f"http://198.18.0.1:{testbed.ALERT_RECEIVER_PORT}/alerts"
        assert vault.is_vaulted(lbv["alert_receiver_token"]) and lbv["monitoring_dcgm_exporter"] is False
        assert [f.line() for f in run_rules(fleet) if f.severity == "error"] == []
    finally:
        vault._reset_for_tests()
