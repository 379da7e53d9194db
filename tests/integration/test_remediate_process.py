"""`provision remediate` as a real process on a real SQLite ledger, without a rack: the nodes are at a closed port
of 127.0.0.1 (every SSH step fails at once, as an unreachable node would), the health results are put in the ledger
the way `provision health` records them. Proven: the decisions, the ledger's transitions and remediation records,
the output lines and exit codes. Not proven here: a GPU reset, reboot or power cycle that works (the rack's)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from remediate_site import burnin, health, ledger, make, provision

from provisioner.ledger import Ledger

POLICY = {"quarantine_on": ["ecc", "xid", "fabricmanager", "ib"], "remediation": ["gpu_reset", "reboot"],
          "replace_after": {"quarantines": 3, "window_days": 30}}
CLUSTER = {"model": "/models/Qwen2-72B", "model_arch": "Qwen2-72B", "tensor_parallel_size": 8,
           "pipeline_parallel_size": 2, "max_model_len": 4096, "max_num_seqs": 64}
REMAP = "GPU 3: row remap pending (reset the GPU)"
OPEN_RAILS = {"mode": "act", "breaker_share": 1.0, "breaker_model_share": 1.0, "actions_per_hour": 100,
              "cooldown_s": 0, "soft_checks": [], "min_serving_clusters": 0}


def _open(db: Path) -> Ledger:
    """The ledger of the fixture's inventory's site (its resolved path)."""
    return ledger({"db": db, "inv": db.parent / "inv" / "hosts.ini"})


@pytest.fixture()
def site(tmp_path: Path) -> dict[str, Path]:
    # these tests are about the policy's decisions: the rails act and hold nothing here (tests/unit/test_rails.py)
    s = make(tmp_path, policy=POLICY, cluster=CLUSTER, rails=OPEN_RAILS, host_vars={
        "n4": {"lifecycle_policy": {**POLICY, "replace_after": {"quarantines": 1, "window_days": 30}}}})
    health(s, n1=("ecc", REMAP), n4=("xid", "critical XID 79 on 0000:1b:00.0"))
    return s


def transitions(db: Path, host: str) -> list[tuple[str, str, str, str]]:
    with _open(db) as lg:
        return [(t.from_state, t.to_state, t.reason, t.actor) for t in lg.transitions(host) if t.actor != "test"]


def test_dry_run_decides_and_changes_nothing(site: dict[str, Path]) -> None:
    before = site["db"].read_bytes()
    p = provision(site, "remediate", str(site["inv"]), "--dry-run", "--app-fault", "n3=vLLM exited 1")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        f"n1: quarantine (ecc: {REMAP})",
        "n3: restart cluster c2 (application fault without a hardware signal: vLLM exited 1)",
        "n4: mark for hardware replacement (xid: critical XID 79 on 0000:1b:00.0; quarantine 1 in 30 days "
        "(replace_after 1))",
        "remediate: 4 nodes under the policy, 3 actions (dry run: nothing changed)"]
    assert transitions(site["db"], "n1") == [] and site["db"].read_bytes() == before


def test_quarantine_remediation_then_return(site: dict[str, Path]) -> None:
    p = provision(site, "remediate", str(site["inv"]), "--limit", "n1,n2,n4")
    assert p.returncode == 1, p.stdout + p.stderr  # the nodes cannot be reached: the steps and marks fail
    out = p.stdout
    assert f"n1: quarantine (ecc: {REMAP})" in out
    assert f"n1: in-service -> draining (quarantine: ecc: {REMAP})" in out
    assert "note: n1: cluster c1 drains as a whole (with n2)" in out
    # the whole cluster goes out as `provision drain` takes it (no balancer in this inventory)
    assert "c1: vLLM not stopped: n1: unreachable: cannot connect to 127.0.0.1:1" in out
    assert "/etc/provisioner/in-service not removed: n1: unreachable: cannot connect to 127.0.0.1:1" in out
    assert f"n2: draining -> maintenance (cluster out: n1 quarantined (ecc: {REMAP}))" in out
    assert "n1: gpu_reset: failed (unreachable: cannot connect" in out
    assert "n1: reboot: failed (unreachable before the reboot" in out
    assert "n1: no action (remediation exhausted (gpu_reset, reboot): stays quarantined" in out
    assert "n2: remediate" not in out and "Traceback" not in p.stderr
    assert transitions(site["db"], "n1") == [
        ("in-service", "draining", f"quarantine: ecc: {REMAP}", "policy:remediate"),
        ("draining", "quarantined", f"ecc: {REMAP}", "policy:remediate")]
    with _open(site["db"]) as lg:
        assert [(r.step, r.outcome) for r in lg.remediations("n1")] == [("gpu_reset", "failed"), ("reboot", "failed")]
        assert [(r.step, r.outcome) for r in lg.remediations("n4")] == [("replace", "marked")]
        assert lg.state("n4")[0] == "quarantined" and lg.remediations("n2") == []
    st = json.loads(provision(site, "status", str(site["inv"]), "-f", "json").stdout)["hosts"]
    assert [(r["host"], r["state"]) for r in st] == [("n1", "quarantined"), ("n2", "maintenance"),
                                                    ("n3", "maintenance"), ("n4", "quarantined")]
    # a second night: nothing new to try, n4 waits for its replacement
    again = provision(site, "remediate", str(site["inv"]), "--limit", "n1,n4", "--dry-run")
    assert "n4: no action (marked for hardware replacement: stays quarantined)" in again.stdout
    # the fault is cleared (a part swapped by hand): the next health pass passes; with the burn-in gate (on by
    # default) the node still needs a passed tier since its last step: the policy asks for the gate (health + tier)
    health(site)
    wait = provision(site, "remediate", str(site["inv"]), "--limit", "n1", "--dry-run")
    assert "n1: return burn-in (no burn-in since reboot)" in wait.stdout, wait.stdout
    burnin(site, "n1", "n2", failed="n1")  # a failed tier: the node stays quarantined, no return
    held = provision(site, "remediate", str(site["inv"]), "--limit", "n1", "--dry-run")
    assert "n1: no action (remediation exhausted (gpu_reset, reboot): stays quarantined (burn-in failed " \
        "(gemm_bf16[gpu3] BRN001)))" in held.stdout, held.stdout
    burnin(site, "n1", "n2")  # the tier passes (the nodes cannot run one here: recorded as provision burn-in does)
    back = provision(site, "remediate", str(site["inv"]), "--limit", "n1")
    # named: the pass that returns it, and that the gate after the reboot (unreachable) did not pass
    assert re.search(r"n1: return to service \(health run #\d+ passed; the gate after reboot did not \(health run "
                     r"#\d+: (unreachable|failed)\)\)", back.stdout), back.stdout
    assert "n1: quarantined -> burn-in" in back.stdout and "n1: burn-in -> in-service" in back.stdout
    assert "n2: maintenance -> burn-in" in back.stdout and "n2: burn-in -> in-service" in back.stdout
    assert "/etc/provisioner/in-service not written: n1: unreachable" in back.stdout and back.returncode == 1
    assert [t[1] for t in transitions(site["db"], "n1")] == ["draining", "quarantined", "burn-in", "in-service"]


def test_a_cluster_member_without_a_burnin_since_it_left_service_runs_the_return_tier(site: dict[str, Path]) -> None:
    """The loop's return of a whole cluster: n1 (quarantined) passed its gate and a tier; n2 (its cluster's other
    member, in maintenance) passed the health pass but ran no tier since it left service: the burn-in gate (on by
    default) makes the return run n2's return tier first (here it cannot reach n2: the return stops, nothing goes
    into service)."""
    with _open(site["db"]) as lg:
        for a, b in (("in-service", "draining"), ("draining", "quarantined")):
            lg.record_transition("n1", a, b, reason="ecc", actor="test")
        for a, b in (("in-service", "draining"), ("draining", "maintenance")):
            lg.record_transition("n2", a, b, reason="cluster out", actor="test")
    health(site)
    burnin(site, "n1")
    p = provision(site, "remediate", str(site["inv"]), "--limit", "n1")
    assert "n1: return to service (health gate passed since the quarantine" in p.stdout, p.stdout + p.stderr
    assert "n2: burn-in quick: fail (" in p.stdout and "n1: burn-in quick" not in p.stdout, p.stdout
    assert "return stopped: the burn-in failed; n2 stay in burn-in, out of the balancer" in p.stdout, p.stdout
    assert p.returncode == 1 and "Traceback" not in p.stderr
    with _open(site["db"]) as lg:
        assert [lg.state(h)[0] for h in ("n1", "n2")] == ["burn-in", "burn-in"]


@pytest.mark.parametrize(("args", "needle", "rc"), [
    (["--app-fault", "n9=crash"], "n9 is not a host of the inventory", 2),
    (["--app-fault", "n1"], "expected HOST=WHY", 2),
    (["--timeout", "0"], "--timeout must be > 0", 2),
])
def test_bad_input_is_one_line(site: dict[str, Path], args: list[str], needle: str, rc: int) -> None:
    p = provision(site, "remediate", str(site["inv"]), "--dry-run", *args)
    assert p.returncode == rc and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr


def test_an_invalid_policy_stops_before_acting(site: dict[str, Path]) -> None:
    (site["inv"].parent / "host_vars" / "n2.yml").write_text(yaml.safe_dump(
        {"lifecycle_policy": {"quarantine_on": ["driver"]}}))
    p = provision(site, "remediate", str(site["inv"]))
    assert p.returncode == 1 and "LC002" in p.stderr and "driver" in p.stderr and p.stdout == ""
    assert transitions(site["db"], "n1") == []


def test_upgrade_abort_with_a_cluster_out_tries_its_return_and_closes_the_rollout(site: dict[str, Path]) -> None:
    """A rollout stopped with c1 drained (a GPU holder): `provision upgrade --abort` returns what the rollout took
    out. Here the return's health gate cannot reach c1's members (the closed port), so c1 stays out, in burn-in, the
    rollout is closed as aborted saying so, exit 1; c2 is not touched."""
    db, inv = site["db"], site["inv"]
    # upgrade validates the inventory first (remediate does not): each host its own loopback address (HW007)
    inv.write_text(re.sub(r"^n(\d) ansible_host=127\.0\.0\.1",
                          lambda m: f"n{m[1]} ansible_host=127.0.0.{int(m[1]) + 1}", inv.read_text(), flags=re.M))
    with _open(db) as lg:
        for h in ("n1", "n2"):
            for a, b in (("in-service", "draining"), ("draining", "maintenance")):
                lg.record_transition(h, a, b, reason="upgrade: test", actor="test")
        rid = lg.rollout_started(str(inv.resolve()), {}, "digest", ["c1", "c2"], pid=999_999_999)
        lg.rollout_step(rid, ["c1"], "failed", step="holders", detail="n1: /dev/nvidia* held by pid 7 (python3)")
        lg.rollout_ended(rid, "stopped", "n1: /dev/nvidia* held by pid 7 (python3)")
    r = provision(site, "upgrade", str(inv), "--abort")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "abort: returning c1" in r.stdout, r.stdout
    assert f"rollout {rid} aborted: 0 cluster(s) had been upgraded (none); what could not return stays drained" in (
        r.stdout), r.stdout
    with _open(db) as lg:
        ro = lg.rollout(rid)
        assert ro.status == "aborted" and ro.detail.startswith("aborted: ") and lg.open_rollout(
            str(inv.resolve())) is None, ro
        assert [lg.state(h)[0] for h in ("n1", "n2", "n3", "n4")] == ["burn-in", "burn-in", "in-service",
                                                                      "in-service"]
    assert ("maintenance", "burn-in", f"rollout {rid} aborted") in [t[:3] for t in transitions(db, "n1")]


def test_the_back_command_runs_and_its_output_is_judged_as_the_node_would_answer() -> None:
    """remedy.back_command through a real shell on this machine (its systemd, if any, is not a booted node's): the
    first line is this boot id, the verdict names systemd's state, never "back"."""
    import subprocess

    from provisioner.probes.remedy import back_command, not_back

    r = subprocess.run(["sh", "-c", back_command(5)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    assert r.stdout.splitlines()[0] == boot
    assert not_back(boot, r.stdout) == "not rebooted yet (same boot id)"
    state = (r.stdout.splitlines()[1:] or [""])[0]
    verdict = not_back("another-boot", r.stdout)
    assert verdict is None if state in ("running", "degraded") else verdict == (
        f"rebooted, but systemd is {state or 'still starting'}")
