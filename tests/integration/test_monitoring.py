"""`provision monitoring`: the scrape config and alert rules for inventories/rack-a.ini pass promtool's checks, and
`promtool test rules` (tests/fixtures/monitoring/alerts_test.yml) proves each alert fires on a synthetic series above
its threshold and stays quiet below it. roles/monitoring renders the same bytes as the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provisioner import INVENTORIES, PROJECT_ROOT, ROLES, TEMPLATES

PROMTOOL = shutil.which("promtool")
# Skipped on a developer machine without promtool; in CI (CI=true, .ci/run installs it) it fails loudly.
needs_promtool = pytest.mark.skipif(PROMTOOL is None and not os.environ.get("CI"),
                                    reason="needs promtool (apt-get install prometheus)")
VENV_BIN = Path(sys.executable).parent
FIXTURE = PROJECT_ROOT / "tests" / "fixtures" / "monitoring" / "alerts_test.yml"
RACK_A = INVENTORIES / "rack-a.ini"
ALERTS = {
    "VllmHeadDown", "VllmClusterMemberDown", "VllmModelLoadSlow", "VllmRequestsWaitingHigh", "VllmE2ELatencyP99High", "VllmTTFTP99High",
    "VllmInterTokenLatencyP99High", "GpuMemoryHigh", "ProvisionDriftFound", "ProvisionDriftCheckIncomplete",
    "ProvisionDriftCheckStale", "ProvisionHealthCheckFailed", "ProvisionHealthHostUnreachable",
    "ProvisionRemediationBreakerOpen",
}
#: The node-faults group (issue 44 section 2), tested by its own fixture (5 s evaluations).
NODE_FAULTS = PROJECT_ROOT / "tests" / "fixtures" / "monitoring" / "node_faults_test.yml"
NODE_ALERTS = {"ProvisionNodeXidFatal", "ProvisionNodeEccUncorrectable", "ProvisionNodeNvlinkDown",
               "ProvisionNodeIbPortDown", "ProvisionNodeFabricManagerDown", "ProvisionNodeSignalsStale"}


def provision(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "provision"), *args], capture_output=True, text=True, cwd=PROJECT_ROOT,
                          timeout=120)


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    assert PROMTOOL, "promtool is not installed (Debian: apt-get install prometheus)"
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def rack_a(tmp_path_factory) -> Path:
    if not RACK_A.exists():
        pytest.skip("inventories/rack-a.ini not there yet")
    out = tmp_path_factory.mktemp("mon")
    r = provision("monitoring", str(RACK_A), "--out", str(out), "--no-check")
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_scrapes_every_head_node_exporter_and_dcgm(rack_a):
    cfg = yaml.safe_load((rack_a / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"vllm", "node", "node_signals", "dcgm"}
    vllm = [(sc["targets"][0], sc["labels"]) for sc in jobs["vllm"]["static_configs"]]
    # rack-a: qwen2_72b = node01 (head) + node02 (worker, no API server); llama31_70b = node03; mixtral = node04
    assert vllm == [  # one per cluster, by cluster name
        ("10.20.0.13:8000", {"host": "node03", "cluster": "llama31_70b", "model": "llama-3.1-70b"}),
        ("10.20.0.14:8000", {"host": "node04", "cluster": "mixtral", "model": "mixtral-8x7b"}),
        ("10.20.0.11:8000", {"host": "node01", "cluster": "qwen2_72b", "model": "qwen2-72b"}),
    ]
    assert jobs["vllm"]["metrics_path"] == "/metrics"
    node = [sc["targets"][0] for sc in jobs["node"]["static_configs"]]
    assert node == [f"10.20.0.1{i}:9100" for i in range(1, 5)]
    assert [sc["targets"][0] for sc in jobs["dcgm"]["static_configs"]] == [f"10.20.0.1{i}:9400" for i in range(1, 5)]
    assert jobs["node"]["static_configs"][1]["labels"] == {"host": "node02", "cluster": "qwen2_72b", "role": "gpu"}
    assert cfg["rule_files"] == ["prometheus-rules.yml"]


@needs_promtool
def test_promtool_check_config_and_rules(rack_a):
    r = promtool("check", "config", str(rack_a / "prometheus.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    r = promtool("check", "rules", str(rack_a / "prometheus-rules.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 20 rules found" in r.stdout
    rules = yaml.safe_load((rack_a / "prometheus-rules.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert names == ALERTS | NODE_ALERTS


def test_rules_use_current_vllm_metric_names(rack_a):
    text = (rack_a / "prometheus-rules.yml").read_text()
    for metric in ("vllm:num_requests_waiting", "vllm:e2e_request_latency_seconds_bucket",
                   "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                   "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "provisioner_drift_resources",
                   "provisioner_node_health_check_ok"):
        assert metric in text, metric
    for gone in ("vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds"):
        assert gone not in text


@needs_promtool
def test_each_alert_fires_above_and_stays_quiet_below(rack_a):
    shutil.copy(FIXTURE, rack_a / "alerts_test.yml")
    r = promtool("test", "rules", "alerts_test.yml", cwd=rack_a)
    assert r.returncode == 0, r.stdout + r.stderr
    # the fixture covers every alert of the rules file
    tested = {t["alertname"] for case in yaml.safe_load(FIXTURE.read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert tested == ALERTS


def test_node_signals_are_scraped_alone_and_often(rack_a):
    """Job node_signals: the same node_exporter as job node, only its textfile collector, every 5 s; the fault
    alerts evaluated every 5 s and labelled remediate="true" (the Alertmanager route to the receiver)."""
    cfg = yaml.safe_load((rack_a / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    sig = jobs["node_signals"]
    assert (sig["scrape_interval"], sig["params"]) == ("5s", {"collect[]": ["textfile"]})
    assert [sc["targets"] for sc in sig["static_configs"]] == [sc["targets"] for sc in jobs["node"]["static_configs"]
                                                               if sc["labels"]["role"] == "gpu"]
    assert jobs["node"]["metric_relabel_configs"] == [{  # the signals come once, from node_signals
        "source_labels": ["__name__"], "regex": "provisioner_node_(fault|xid_fatal|watch_timestamp_seconds)",
        "action": "drop"}]
    groups = {g["name"]: g for g in yaml.safe_load((rack_a / "prometheus-rules.yml").read_text())["groups"]}
    faults = groups["node-faults"]
    assert faults["interval"] == "5s"
    acting = {r["alert"]: r["for"] for r in faults["rules"] if r["labels"].get("remediate") == "true"}
    assert acting == {"ProvisionNodeXidFatal": "0s", "ProvisionNodeEccUncorrectable": "0s",
                      "ProvisionNodeNvlinkDown": "10s", "ProvisionNodeIbPortDown": "15s",
                      "ProvisionNodeFabricManagerDown": "10s"}


@needs_promtool
def test_node_fault_alerts_fire_after_their_hold_and_a_bouncing_port_does_not(rack_a):
    shutil.copy(NODE_FAULTS, rack_a / "node_faults_test.yml")
    r = promtool("test", "rules", "node_faults_test.yml", cwd=rack_a)
    assert r.returncode == 0, r.stdout + r.stderr
    tested = {t["alertname"] for case in yaml.safe_load(NODE_FAULTS.read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert tested == NODE_ALERTS


@needs_promtool
def test_signal_holds_are_variables_and_the_fixture_notices(rack_a_fleet, tmp_path):
    """A longer hold for ib (monitoring_signals_for) and the fixture's 15 s expectation fails; no node signals at
    all (monitoring_node_signals: false) and the job and group are gone."""
    from provisioner.monitoring import write_monitoring

    write_monitoring(rack_a_fleet, tmp_path, {"monitoring_signals_for": {
        "xid": "0s", "ecc": "0s", "nvlink": "10s", "fabricmanager": "10s", "ib": "30s"}})
    shutil.copy(NODE_FAULTS, tmp_path / "node_faults_test.yml")
    r = promtool("test", "rules", "node_faults_test.yml", cwd=tmp_path)
    assert r.returncode != 0 and "alertname: ProvisionNodeIbPortDown" in r.stdout + r.stderr
    write_monitoring(rack_a_fleet, tmp_path, {"monitoring_node_signals": False})
    assert "node_signals" not in (tmp_path / "prometheus.yml").read_text()
    assert "node-faults" not in (tmp_path / "prometheus-rules.yml").read_text()


@pytest.fixture(scope="module")
def rack_a_fleet():
    if not RACK_A.exists():
        pytest.skip("inventories/rack-a.ini not there yet")
    from provisioner.inventory import load_fleet

    return load_fleet(RACK_A)


@needs_promtool
@pytest.mark.parametrize("setting, alert", [
    ({"monitoring_e2e_p99_seconds": 4}, "VllmE2ELatencyP99High"),          # cold P99 is 4.96 s
    ({"monitoring_ttft_p99_seconds": 0.45}, "VllmTTFTP99High"),            # cold P99 is 0.496 s
    ({"monitoring_itl_p99_seconds": 0.04}, "VllmInterTokenLatencyP99High"),  # cold P99 is 49.6 ms
    ({"monitoring_waiting_requests": 98}, "VllmRequestsWaitingHigh"),      # cold has 99 waiting
    ({"monitoring_gpu_memory_ratio": 0.85}, "GpuMemoryHigh"),              # cold uses 88.9 %
    ({"monitoring_model_load_seconds": 100}, "VllmModelLoadSlow"),         # cold has loaded for 120 s
])
def test_thresholds_are_variables_and_the_fixture_notices(rack_a_fleet, tmp_path, setting, alert):
    """Lower one threshold below the "cold" series: the same fixture must now fail on that alert."""
    from provisioner.monitoring import write_monitoring

    write_monitoring(rack_a_fleet, tmp_path, setting)
    shutil.copy(FIXTURE, tmp_path / "alerts_test.yml")
    r = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert r.returncode != 0
    assert f"alertname: {alert}" in r.stdout + r.stderr


def test_inventory_values_lb_and_textfile_targets(tmp_path):
    inv = tmp_path / "hosts.ini"
    inv.write_text("""\
[gpu_nodes]
g1 ansible_host=10.0.0.1
g2 ansible_host=10.0.0.2

[c_single]
g1

[c_single:vars]
vllm_cluster={"model": "/m/x", "port": 8100}

[lb]
lb1 ansible_host=10.0.0.9

# another one-host group holding the head: the cluster is still the group that defines vllm_cluster
[aaa_rack_row1]
g1

[all:vars]
monitoring_textfile_targets=["10.0.0.254:9100"]
monitoring_receiver_targets=["10.0.0.254:9095"]
monitoring_alertmanagers=["10.0.0.253:9093"]
monitoring_dcgm_exporter=false
monitoring_e2e_p99_seconds=3
""")
    out = tmp_path / "out"
    r = provision("monitoring", str(inv), "--out", str(out), "--no-check")
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = yaml.safe_load((out / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"vllm", "node", "node_signals", "provision", "provision_receiver"}
    # a single-node cluster without node_rank: its only host is the head; the model defaults to vllm_cluster.model
    assert jobs["vllm"]["static_configs"] == [
        {"targets": ["10.0.0.1:8100"], "labels": {"host": "g1", "cluster": "c_single", "model": "/m/x"}}]
    assert [sc["labels"]["role"] for sc in jobs["node"]["static_configs"]] == ["gpu", "gpu", "lb"]
    assert jobs["provision"]["static_configs"] == [{"targets": ["10.0.0.254:9100"]}]
    assert jobs["provision_receiver"]["static_configs"] == [{"targets": ["10.0.0.254:9095"]}]
    assert jobs["provision_receiver"]["honor_labels"] is True
    assert cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["10.0.0.253:9093"]
    assert "> 3'" in (out / "prometheus-rules.yml").read_text()
    if PROMTOOL:
        assert promtool("check", "config", str(out / "prometheus.yml")).returncode == 0


def test_usage_errors_exit_2(tmp_path):
    assert provision("monitoring", str(tmp_path / "missing.ini"), "--out", str(tmp_path)).returncode == 2
    r = provision("monitoring", str(RACK_A), "--out", str(tmp_path), "--set", "scrape=1")
    assert r.returncode == 2 and "monitoring_NAME=VALUE" in r.stderr + r.stdout


def test_role_renders_the_same_bytes_as_the_cli(rack_a, tmp_path):
    """roles/monitoring, run by real ansible-playbook into a directory, writes what `provision monitoring` wrote."""
    play = tmp_path / "play.yml"
    inv = tmp_path / "hosts.ini"
    # rack-a plus a local `monitoring` host, from a copy that keeps rack-a's group_vars next to it
    shutil.copytree(INVENTORIES / "group_vars", tmp_path / "group_vars")
    inv.write_text(RACK_A.read_text() + "\n[monitoring]\nprom1 ansible_connection=local\n")
    play.write_text(
        "- name: Monitoring files\n  hosts: monitoring\n  gather_facts: true\n  gather_subset: ['!all', 'min']\n"
        "  roles:\n    - role: monitoring\n"
    )
    evars = {
        "ansible_python_interpreter": sys.executable,
        "monitoring_install_prometheus": False,
        "monitoring_manage_service": False,
        "monitoring_config_dir": str(tmp_path / "etc"),
        "monitoring_templates_dir": str(TEMPLATES),
        "monitoring_promtool": PROMTOOL or "true",
    }
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(ROLES), ANSIBLE_NOCOLOR="1",
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    r = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv), str(play), "-e", json.dumps(evars)],
                       capture_output=True, text=True, env=env, cwd=PROJECT_ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    for name in ("prometheus.yml", "prometheus-rules.yml"):
        assert (tmp_path / "etc" / name).read_text() == (rack_a / name).read_text(), name
