"""The quarantine/remediation decision (provisioner/day2/policy.py): pure, failing and passing inputs."""

from __future__ import annotations

import pytest

from provisioner.day2.policy import Facts, Health, Policy, Step, decide, policy_of

DAY = 86400.0
NOW = 100 * DAY
P = Policy(quarantine_on=("ecc", "xid", "fabricmanager", "ib"), remediation=("gpu_reset", "reboot", "power_cycle"),
           replace_quarantines=3, replace_window_days=30)


def health(at: float = NOW - 60, outcome: str = "failed", **checks: tuple[str, str | None]) -> Health:
    return Health(run=7, started=at, outcome=outcome, checks=checks)


OK = health(outcome="ok", ecc=("pass", None), xid=("pass", None))
REMAP = health(ecc=("fail", "GPU 3: row remap pending (reset the GPU)"), xid=("pass", None))


def facts(state: str = "in-service", since: float = 10 * DAY, **kw: object) -> Facts:
    return Facts(host="n1", state=state, since=since, now=NOW, cluster="c1", **kw)  # type: ignore[arg-type]


def test_a_hard_check_quarantines_with_the_check_as_reason() -> None:
    a = decide(facts(health=REMAP), P)
    assert (a.kind, a.check, a.reason) == ("quarantine", "ecc", "ecc: GPU 3: row remap pending (reset the GPU)")
    assert a.line() == "n1: quarantine (ecc: GPU 3: row remap pending (reset the GPU))"
    fm = decide(facts(state="burn-in", health=health(fabricmanager=("fail", "fabric state In Progress"))), P)
    assert fm.kind == "quarantine" and fm.check == "fabricmanager"
    ib = decide(facts(health=health(ib=("fail", "mlx5_0:1: state DOWN"), xid=("fail", "critical XID 79"))), P)
    assert ib.kind == "quarantine" and ib.check in ("ib", "xid")


def test_healthy_soft_failures_and_checks_outside_the_policy_do_not_quarantine() -> None:
    assert decide(facts(health=OK), P).kind == "hold"
    soft = decide(facts(health=health(driver=("fail", "580 != 570"))), P)
    assert soft.kind == "hold" and "not a hardware check" in soft.reason
    narrow = Policy(quarantine_on=("xid",))
    a = decide(facts(health=REMAP), narrow)
    assert a.kind == "hold" and "ecc failed: not in quarantine_on" in a.reason
    assert decide(facts(health=health(outcome="unreachable")), P).kind == "hold"
    assert decide(facts(health=None), P).reason == "no health result"
    for state in ("new", "provisioning", "maintenance", "draining", "retired"):
        assert decide(facts(state=state, health=REMAP), P).kind == "hold"


def test_an_application_fault_without_a_hardware_signal_restarts_the_cluster() -> None:
    a = decide(facts(health=OK, app_fault="vLLM exited 1 (CUDA OOM)"), P)
    assert (a.kind, a.cluster) == ("restart_cluster", "c1") and "without a hardware signal" in a.reason
    hw = decide(facts(health=REMAP, app_fault="vLLM exited 1"), P)
    assert hw.kind == "quarantine"  # the hardware signal wins: the crash was the GPU's


def test_remediation_steps_in_order_each_after_a_gate() -> None:
    q = 50 * DAY
    assert decide(facts(state="quarantined", since=q, health=None), P).kind == "gate"
    f = facts(state="quarantined", since=q, health=health(at=q - 60, outcome="ok"))
    assert decide(f, P).kind == "gate"  # a pass older than the quarantine (put there by hand) proves nothing
    f = facts(state="quarantined", since=q, health=health(at=q - 60, ecc=("fail", "row remap pending")))
    a = decide(f, P)  # the failing pass that quarantined it: the first step right away
    assert (a.kind, a.step) == ("remediate", "gpu_reset") and "row remap pending" in a.reason
    tried = (Step("gpu_reset", q + 100, "done"),)
    assert decide(facts(state="quarantined", since=q, steps=tried, health=f.health), P).kind == "gate"
    after = health(at=q + 200, ecc=("fail", "row remap pending"))
    a = decide(facts(state="quarantined", since=q, steps=tried, health=after), P)
    assert (a.kind, a.step) == ("remediate", "reboot")
    two = (*tried, Step("reboot", q + 300, "failed"))
    late = health(at=q + 400, outcome="unreachable")
    a = decide(facts(state="quarantined", since=q, steps=two, health=late), P)
    assert a.kind == "hold" and "remediation exhausted (gpu_reset, reboot)" in a.reason  # no BMC: no power_cycle
    a = decide(facts(state="quarantined", since=q, steps=two, health=late, has_bmc=True), P)
    assert (a.kind, a.step) == ("remediate", "power_cycle")
    old = (Step("gpu_reset", q - 10 * DAY, "done"),)  # tried in an earlier quarantine: counts no more
    assert decide(facts(state="quarantined", since=q, steps=old, health=after), P).step == "gpu_reset"


def test_a_passed_gate_after_a_step_returns_the_node() -> None:
    q = 50 * DAY
    tried = (Step("gpu_reset", q + 100, "done"),)
    a = decide(facts(state="quarantined", since=q, steps=tried, health=health(at=q + 200, outcome="ok")), P)
    assert a.kind == "return" and a.reason == "health gate passed after gpu_reset (health run #7)"
    failed_pass = health(at=q + 200, outcome="ok", ecc=("fail", "x"))
    assert decide(facts(state="quarantined", since=q, steps=tried, health=failed_pass), P).kind == "remediate"


def test_with_the_burnin_gate_a_quarantined_node_returns_only_after_a_burnin_since_its_last_step() -> None:
    q = 50 * DAY
    tried = (Step("gpu_reset", q + 100, "done"),)
    ok = health(at=q + 200, outcome="ok")
    gated = {"state": "quarantined", "since": q, "steps": tried, "health": ok, "burnin_gate": True}
    a = decide(facts(**gated), P)  # none ran: the return tier runs (the health gate passed already)
    assert (a.kind, a.reason) == ("burnin", "no burn-in since gpu_reset")
    assert a.line() == "n1: return burn-in (no burn-in since gpu_reset)"
    a = decide(facts(**gated, burnin=(True, q + 50, "")), P)  # a pass from before the step proves nothing
    assert a.kind == "burnin"
    a = decide(facts(**gated, burnin=(True, q + 250, "")), P)
    assert a.kind == "return"
    a = decide(facts(**gated, burnin=(False, q + 250, "gemm_bf16[gpu3] BRN001")), P)  # failed: the next step
    assert (a.kind, a.step, a.reason) == ("remediate", "reboot", "burn-in failed (gemm_bf16[gpu3] BRN001)")
    a = decide(facts(**gated, burnin_return=False), P)  # no return tier: a person runs one
    assert a.kind == "hold" and "run provision burn-in INVENTORY n1 --tier quick" in a.reason
    assert decide(facts(state="quarantined", since=q, steps=tried, health=ok), P).kind == "return"  # gate off


def test_n_quarantines_in_the_window_mark_for_replacement() -> None:
    two = (80 * DAY, 90 * DAY)
    a = decide(facts(health=REMAP, quarantines=two), P)
    assert a.kind == "replace" and "quarantine 3 in 30 days (replace_after 3)" in a.reason and a.check == "ecc"
    spread = (20 * DAY, 90 * DAY)  # one of them outside the 30-day window
    assert decide(facts(health=REMAP, quarantines=spread), P).kind == "quarantine"
    marked = (Step("replace", 95 * DAY, "marked"),)
    h = decide(facts(state="quarantined", since=95 * DAY, steps=marked, health=REMAP), P)
    assert h.kind == "hold" and "replacement" in h.reason


@pytest.mark.parametrize(("value", "expect"), [
    (None, None),
    ("ecc", None),
    ({}, Policy()),
    ({"quarantine_on": ["ecc"], "remediation": ["reboot"], "replace_after": {"quarantines": 2, "window_days": 7}},
     Policy(quarantine_on=("ecc",), remediation=("reboot",), replace_quarantines=2, replace_window_days=7)),
])
def test_policy_of(value: object, expect: Policy | None) -> None:
    assert policy_of(value) == expect


def test_a_return_names_the_health_run_that_passed_not_a_failed_gate() -> None:
    """The reboot's gate (#7) failed; the fault was cleared by hand and health run #8 passed: the reason names #8
    and says the gate after the reboot did not pass (it used to read "passed after reboot (health run #8)")."""
    q = 50 * DAY
    tried = (Step("gpu_reset", q + 100, "done"), Step("reboot", q + 300, "done"))
    passed = Health(run=8, started=q + 900, outcome="ok", checks={"ecc": ("pass", None)})
    runs = ((6, q + 200, "failed"), (7, q + 400, "failed"), (8, q + 900, "ok"))
    a = decide(facts(state="quarantined", since=q, steps=tried, health=passed, health_runs=runs), P)
    assert a.kind == "return"
    assert a.reason == "health run #8 passed; the gate after reboot did not (health run #7: failed)"
    gate = Health(run=7, started=q + 400, outcome="ok", checks={"ecc": ("pass", None)})
    runs = ((6, q + 200, "failed"), (7, q + 400, "ok"))
    a = decide(facts(state="quarantined", since=q, steps=tried, health=gate, health_runs=runs), P)
    assert a.reason == "health gate passed after reboot (health run #7)"


def test_a_new_boot_id_is_not_back_until_systemd_finished_booting() -> None:
    """remedy.wait_back's verdict on one poll: a new boot id alone is a host still starting its services (sshd comes
    up first); back means systemd says running or degraded, as the driver role's reboot handler tests it."""
    from provisioner.probes.remedy import back_command, not_back

    assert not_back("b1", None) == "not answering over SSH"
    assert not_back("b1", "b1\nrunning\n") == "not rebooted yet (same boot id)"
    assert not_back("b1", "b2\nstarting\n") == "rebooted, but systemd is starting"
    assert not_back("b1", "b2\n") == "rebooted, but systemd is still starting"  # --wait cut by its timeout
    assert not_back("b1", "b2\nrunning\n") is None and not_back("b1", "b2\ndegraded\n") is None
    assert not_back(None, "b2\nrunning\n") is None  # no boot id before (unreachable): a running host is back
    assert not_back("b1", "\n") == "no boot id"
    cmd = back_command(30)
    assert "is-system-running --wait" in cmd and "timeout 30 " in cmd and cmd.startswith("cat /proc/sys/kernel")
