"""Where the launched clusters answer (provisioner/endpoints.py) on the inventory `testbed up --with-vllm` writes
(no rack): URL from the head's address and the cluster's port, the served model, the file that sets the API key,
and a curl line whose shell expansion reads that file; the key itself never appears."""

from __future__ import annotations

import re
from pathlib import Path

from vllm_rack_inventory import write_vllm_rack_inventory

from provisioner.endpoints import cluster_endpoints, endpoint_lines, key_source, var_files
from provisioner.inventory import load_fleet
from provisioner.render import role_defaults
from provisioner_testbed import vllm_image


def _vllm_rack(tmp_path: Path) -> Path:
    return write_vllm_rack_inventory(tmp_path)


def _sed(expansion: str, cwd: Path) -> str:
    """What `$(sed -n 's/^RX//p' FILE)` prints (sed's basic regex here is a plain prefix with ` *`)."""
    m = re.fullmatch(r"\$\(sed -n 's/\^(.+?)//p' (.+)\)", expansion)
    assert m, expansion
    rx = re.compile("^" + m.group(1))
    out = [rx.sub("", ln, count=1) for ln in (cwd / m.group(2)).read_text().split("\n") if rx.match(ln)]
    return "\n".join(out)


def test_testbed_clusters_say_url_model_key_file_and_a_working_curl(tmp_path: Path) -> None:
    inv = _vllm_rack(tmp_path)
    fleet = load_fleet(inv)
    names = ["vllm_pp", "vllm_single"]
    eps = cluster_endpoints(fleet, names, var_files(fleet, names), cwd=str(tmp_path), defaults=role_defaults())
    by = {e.cluster: e for e in eps}
    assert (by["vllm_pp"].head, by["vllm_pp"].url, by["vllm_pp"].model) == ("node01", "http://198.18.7.11:8000",
                                                                              "tiny-llama")
    assert (by["vllm_single"].head, by["vllm_single"].url) == ("node03", "http://198.18.7.13:8000")
    single = by["vllm_single"]
    assert single.key and single.key_file == "inv/group_vars/all.yml" and not single.vaulted
    assert single.key_read is not None and _sed(single.key_read, tmp_path) == vllm_image.TESTBED_API_KEY
    lines = endpoint_lines(eps)
    text = "\n".join(lines)
    assert vllm_image.TESTBED_API_KEY not in text  # never the key
    assert lines[:4] == [
        "vllm_pp: http://198.18.7.11:8000  model tiny-llama (head node01)",
        "  API key: vllm_api_key in inv/group_vars/all.yml (on the members: VLLM_API_KEY in /etc/vllm/vllm.env)",
        "  clients: 198.18.7.0/24 (vllm_client_networks; the cluster firewall drops others)",
        "  curl -s http://198.18.7.11:8000/v1/models -H \"Authorization: Bearer "
        "$(sed -n 's/^vllm_api_key: *//p' inv/group_vars/all.yml)\""]
    # outside the working directory the path is absolute (the line works from anywhere)
    far = cluster_endpoints(fleet, ["vllm_pp"], var_files(fleet, ["vllm_pp"]), cwd="/nonexistent")
    assert far[0].key_file == str(inv.parent / "group_vars" / "all.yml")


def test_key_source_only_offers_an_expansion_that_prints_the_key() -> None:
    order = ["h/host_vars/n1.yml", "h/group_vars/all.yml", "h/hosts.ini"]
    files = {"h/host_vars/n1.yml": "gpu_count: 1\n", "h/group_vars/all.yml": "vllm_api_key: \"quoted\"\n"}
    # quoted YAML: sed would print the quotes, so no expansion: export VLLM_API_KEY
    assert key_source("quoted", files, order) == (None, None, False)
    files["h/hosts.ini"] = "[all:vars]\nvllm_api_key = k1\n"
    assert key_source("k1", files, order) == ("h/hosts.ini", "$(sed -n 's/^vllm_api_key *= *//p' h/hosts.ini)", False)
    vault = {"h/group_vars/all.yml": "vllm_api_key: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6231\n"}
    assert key_source(object(), vault, order) == ("h/group_vars/all.yml", None, True)
    twice = {"h/hosts.ini": "[a:vars]\nvllm_api_key=k1\n[b:vars]\nvllm_api_key=k1\n"}
    assert key_source("k1", twice, order) == (None, None, False)  # sed would print two lines


def test_lines_without_a_key_or_with_a_vaulted_one(tmp_path: Path) -> None:
    from provisioner.endpoints import Endpoint

    open_ep = Endpoint(cluster="c", head="n1", url="http://10.0.0.1:8000", model="m", key=False)
    assert endpoint_lines([open_ep])[-1] == "  curl -s http://10.0.0.1:8000/v1/models"
    vaulted = Endpoint(cluster="c", head="n1", url="http://10.0.0.1:8000", model="m", key=True,
                       key_file="inv/group_vars/all.yml", vaulted=True)
    lines = endpoint_lines([vaulted])
    assert lines[1].startswith("  API key: vllm_api_key in inv/group_vars/all.yml (vaulted); export VLLM_API_KEY")
    assert lines[-1] == '  curl -s http://10.0.0.1:8000/v1/models -H "Authorization: Bearer $VLLM_API_KEY"'


def _ev(kind: str, task: str, label: str | None = None, role: str = "vllm_launch", host: str = "node01") -> dict:
    res = {"_ansible_item_label": label} if label else {}
    return {"event": kind, "event_data": {"host": host, "task": task, "role": role, "res": res}}


def test_a_run_reports_the_clusters_its_launch_step_left_serving(tmp_path: Path) -> None:
    from provisioner.endpoints import START_TASK, LaunchSeen, launched_clusters
    from provisioner.results import RunResult

    # the task the watcher keys on is the role's own
    clusters_yml = Path(__file__).resolve().parents[2] / "roles" / "vllm_launch" / "tasks" / "clusters.yml"
    assert f"- name: {START_TASK}\n" in clusters_yml.read_text()

    fleet = load_fleet(_vllm_rack(tmp_path))
    seen = LaunchSeen()
    for ev in (_ev("runner_item_on_ok", "Units", "x"), _ev("runner_item_on_ok", START_TASK, "vllm_pp"),
               _ev("runner_item_on_ok", START_TASK, "vllm_single"), _ev("runner_item_on_ok", START_TASK, "vllm_pp")):
        seen(ev)
    assert seen.clusters == ["vllm_pp", "vllm_single"] and not seen.failed

    def result(check: bool = False, failed: tuple[str, ...] = ()) -> RunResult:
        r = RunResult(command="run", inventory="i", playbook="p", run_dir="r", artifact_dir="a", started=0.0,
                      check=check, targeted=["node01", "node02", "node03"])
        for h in ("node01", "node02", "node03"):
            r.host(h).seen, r.host(h).ok = True, 3
            r.host(h).failed = int(h in failed)
        return r

    assert launched_clusters(fleet, result(), seen) == ["vllm_pp", "vllm_single"]
    assert launched_clusters(fleet, result(check=True), seen) == []
    assert launched_clusters(fleet, result(failed=("node02",)), seen) == ["vllm_single"]
    # a run_once /health wait that gave up on one cluster fails the play's hosts without their own failure events
    seen(_ev("runner_item_on_failed", "Wait for those clusters to answer /health: vllm_pp, vllm_single", "vllm_single"))
    seen(_ev("runner_on_failed", "Wait for those clusters to answer /health: vllm_pp, vllm_single"))
    assert launched_clusters(fleet, result(), seen) == ["vllm_pp"]
    seen(_ev("runner_on_failed", "Wait for /health before the next cluster: vllm_pp"))  # rolling.yml
    assert launched_clusters(fleet, result(), seen) == []


def test_onboard_names_the_clusters_it_launched() -> None:
    from provisioner.day2.onboard import Outcome, launched_clusters

    out = {"node01": Outcome("node01", in_service=True, clusters=["vllm_pp"], launch="ok"),
           "node02": Outcome("node02", in_service=True, clusters=["vllm_pp"], launch="ok"),
           "node03": Outcome("node03", in_service=True, clusters=["vllm_single"], launch="failed"),
           "node04": Outcome("node04", stage="health", clusters=["vllm_other"])}
    assert launched_clusters(out) == ["vllm_pp"]


def test_a_balancer_fronting_the_cluster_is_in_the_serving_lines(tmp_path: Path) -> None:
    """With hosts in group lb (roles/serving_lb), each cluster's lines name the balancer's URL (its address and
    serving_lb_listen_port; a dedicated model port too), and a balancer limited to other models is left out."""
    from provisioner.endpoints import balancer_urls
    from provisioner_testbed import inventory_writer as invw

    inv = _vllm_rack(tmp_path)
    hosts = inv.read_text() + "\n[lb]\nlb01 ansible_host=198.18.7.21\nlb02 ansible_host=198.18.7.22\n"
    inv.write_text(hosts)
    (inv.parent / "host_vars").mkdir(exist_ok=True)
    (inv.parent / "host_vars" / "lb02.yml").write_text(
        "serving_lb_listen_port: 9000\nserving_lb_model_ports: {tiny-llama: 8101}\n")
    fleet = load_fleet(inv)
    eps = cluster_endpoints(fleet, ["vllm_pp"], var_files(fleet, ["vllm_pp"]), cwd=str(tmp_path),
                            defaults=role_defaults())
    lines = endpoint_lines(eps)
    assert lines[:4] == [
        "vllm_pp: http://198.18.7.11:8000  model tiny-llama (head node01)",
        "  balancer: http://198.18.7.21:8000  model tiny-llama (nginx on lb01; clients use this)",
        "  balancer: http://198.18.7.22:9000  model tiny-llama (nginx on lb02; clients use this)",
        "  balancer: http://198.18.7.22:8101  model tiny-llama (nginx on lb02; clients use this)"]
    assert eps[0].to_dict()["balancers"] == ("http://198.18.7.21:8000", "http://198.18.7.22:9000",
                                              "http://198.18.7.22:8101")
    (inv.parent / "host_vars" / "lb01.yml").write_text("serving_lb_models: [other-model]\n"
                                                      "serving_lb_listen_address: 198.18.7.99\n")
    fleet = load_fleet(inv)
    assert [u for u, _ in balancer_urls(fleet, "tiny-llama", role_defaults())] == [
        "http://198.18.7.22:9000", "http://198.18.7.22:8101"]
    assert balancer_urls(fleet, "other-model", role_defaults())[0] == ("http://198.18.7.99:8000", "lb01")
    assert invw.LB_GROUP == "lb"


def test_a_vaulted_key_is_reported_without_being_decrypted(tmp_path: Path) -> None:
    """The `serving:` lines after a run or onboard name a vaulted key without decrypting it: no vault secret needed
    (it used to be compared with "", which decrypts: a traceback after a successful launch)."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    from provisioner import vault

    inv = write_vllm_rack_inventory(tmp_path)
    all_yml = inv.parent / "group_vars" / "all.yml"
    cipher = VaultLib([("default", VaultSecret(b"some-other-pw"))]).encrypt("sk-x").decode()
    text = re.sub(r"^vllm_api_key: .*$", "vllm_api_key: !vault |\n" + "".join(
        f"  {ln}" + "\n" for ln in cipher.splitlines()).rstrip("\n"), all_yml.read_text(), flags=re.M)
    all_yml.write_text(text)
    vault._reset_for_tests()
    try:
        fleet = load_fleet(inv)
        assert vault.is_vaulted(fleet.hosts["node01"].vars["vllm_api_key"])
        (ep,) = cluster_endpoints(fleet, ["vllm_pp"], var_files(fleet, ["vllm_pp"]), cwd=str(tmp_path),
                                  defaults=role_defaults())
        assert ep.key and ep.vaulted and ep.key_read is None
        assert "(vaulted); export VLLM_API_KEY" in endpoint_lines([ep])[1]
    finally:
        vault._reset_for_tests()
