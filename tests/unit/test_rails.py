"""The rails (provisioner/day2/rails.py): every rail's decision from plain data, and the bad push that must open the
breaker before the last cluster of a model goes."""

from __future__ import annotations

import pytest

from provisioner.day2.rails import DEFAULTS, Rails, Recent, TakeOut, disposition, judge, rails_of

NOW = 1_000_000.0
#: two clusters of one model, two members each; a fifth node in no cluster
CLUSTERS = {"c1": "llama", "c2": "llama"}
MEMBERS = {"n1": "c1", "n2": "c1", "n3": "c2", "n4": "c2", "n5": None}
R = Rails()


def recent(*done: TakeOut, nodes: int = 5, serving: tuple[str, ...] = ("c1", "c2"), **kw: object) -> Recent:
    return Recent(now=NOW, nodes=nodes, clusters=CLUSTERS, serving=frozenset(serving), done=done, **kw)  # type: ignore[arg-type]


def out(host: str, ago: float) -> TakeOut:
    c = MEMBERS[host]
    return TakeOut(NOW - ago, host, c, CLUSTERS.get(c) if c else None)


def go(host: str, check: str | None = "xid", kind: str = "quarantine", rails: Rails = R, rec: Recent | None = None
       ) -> object:
    return judge(kind, host, check=check, cluster=MEMBERS[host], rails=rails, recent=rec or recent())


def test_defaults_are_the_documented_ones_and_well_below_half() -> None:
    assert rails_of(None) == R and R.mode == "recommend"
    assert R.breaker_share < 0.5 and R.breaker_model_share <= 0.5
    assert (R.actions_per_hour, R.cooldown_s, R.persist, R.soft_checks) == (3, 3600, 3, ("ib",))
    assert set(DEFAULTS) >= {"mode", "breaker_share", "min_serving_clusters"}


def test_rails_of_reads_a_value_and_falls_back_on_nonsense() -> None:
    r = rails_of({"mode": "act", "breaker_share": 0.1, "min_serving_clusters": {"llama": 2}, "persist": 5})
    assert (r.mode, r.breaker_share, r.floor("llama"), r.floor("other"), r.persist) == ("act", 0.1, 2, 1, 5)
    bad = rails_of({"mode": "yolo", "breaker_share": 3, "actions_per_hour": True, "soft_checks": "ib"})
    assert (bad.mode, bad.breaker_share, bad.actions_per_hour, bad.soft_checks) == ("recommend", 0.25, 3, ("ib",))


def test_a_first_fatal_fault_goes() -> None:
    assert go("n1").go  # type: ignore[attr-defined]


def test_steps_returns_and_gates_are_never_held() -> None:
    rec = recent(out("n1", 10), out("n3", 5), breaker="already open")
    for kind in ("remediate", "return", "gate"):
        assert judge(kind, "n1", check=None, cluster="c1", rails=R, recent=rec).go


def test_the_open_breaker_holds_every_take_out() -> None:
    v = go("n5", rec=recent(breaker="3 of 5 nodes"))
    assert not v.go and v.rail == "breaker" and "--close-breaker" in v.why and v.opens is None  # type: ignore[attr-defined]


def test_bad_push_every_node_fatal_at_once_opens_the_breaker_before_the_last_cluster_goes() -> None:
    """Every node logs a fatal XID within seconds: the loop takes them one by one; the first (c1) goes, the next
    take-out would leave the model with no cluster: the breaker opens instead, and holds the rest."""
    done: list[TakeOut] = []
    breaker: str | None = None
    held = []
    for i, host in enumerate(("n1", "n2", "n3", "n4", "n5")):
        rec = Recent(now=NOW + i, nodes=5, clusters=CLUSTERS,
                     serving=frozenset(c for c in CLUSTERS if all(t.cluster != c for t in done)),
                     done=tuple(done), breaker=breaker)
        v = judge("quarantine", host, check="xid", cluster=MEMBERS[host], rails=R, recent=rec)
        if v.go:
            done.append(TakeOut(NOW + i, host, MEMBERS[host], CLUSTERS.get(MEMBERS[host] or "")))
        else:
            held.append((host, v.rail))
            breaker = breaker or v.opens
    assert [t.host for t in done] == ["n1"]  # c1 out (n1 is its member), c2 keeps serving
    assert breaker is not None and "would be taken out" in breaker
    assert held[0] == ("n2", "breaker") and all(r == "breaker" for _, r in held)


def test_the_breaker_counts_the_model_share_and_the_fleet_share() -> None:
    # model: c1 already out, c2 would be the second of two clusters of llama
    v = go("n3", rec=recent(out("n1", 30), nodes=100))
    assert v.opens and "clusters of llama" in v.opens  # type: ignore[attr-defined]
    # fleet: 25 nodes out of 100 allowed, the 26th opens it
    many = tuple(TakeOut(NOW - 10, f"x{i}") for i in range(25))
    rails = Rails(actions_per_hour=100)
    v = judge("quarantine", "y", check="xid", cluster=None, rails=rails, recent=Recent(NOW, 100, done=many))
    assert v.opens and "26 of 100 nodes" in v.opens
    assert judge("quarantine", "y", check="xid", cluster=None, rails=rails, recent=Recent(NOW, 100, done=many[:24])).go


def test_the_window_and_a_close_forget_older_take_outs() -> None:
    assert not go("n3", rec=recent(out("n1", 60))).go  # type: ignore[attr-defined]
    rails = Rails(breaker_window_s=30, actions_per_hour=10)
    assert go("n3", rails=rails, rec=recent(out("n1", 60))).go  # type: ignore[attr-defined]
    closed = recent(out("n1", 60), closed_at=NOW - 10)
    assert go("n3", rec=closed).go  # type: ignore[attr-defined]


def test_capacity_floor_holds_a_soft_signal_on_the_last_serving_cluster_not_a_fatal_one() -> None:
    rails = Rails(persist=1)
    soft = go("n3", check="ib", rails=rails, rec=recent(serving=("c2",)))
    assert not soft.go and soft.rail == "floor" and "min_serving_clusters 1" in soft.why  # type: ignore[attr-defined]
    assert go("n3", check="xid", rails=rails, rec=recent(serving=("c2",))).go  # type: ignore[attr-defined]
    assert go("n3", check="ib", rails=rails).go  # type: ignore[attr-defined]  # c1 serves too
    two = Rails(persist=1, min_serving_by_model={"llama": 2})
    assert go("n3", check="ib", rails=two).rail == "floor"  # type: ignore[attr-defined]


def test_rate_limit_fleet_wide_per_hour() -> None:
    rails = Rails(breaker_share=1.0, breaker_model_share=1.0)
    rec = recent(out("n1", 3000), out("n3", 2000), out("n5", 1000), nodes=50)
    v = go("n2", rails=rails, rec=rec)
    assert not v.go and v.rail == "rate" and "3 automated take-outs" in v.why  # type: ignore[attr-defined]
    older = recent(out("n1", 4000), out("n3", 2000), out("n5", 1000), nodes=50)
    assert go("n2", rails=rails, rec=older).go  # type: ignore[attr-defined]


def test_cooldown_one_take_out_per_node_per_window() -> None:
    rails = Rails(breaker_share=1.0, breaker_model_share=1.0)
    v = go("n1", rails=rails, rec=recent(out("n1", 600)))
    assert not v.go and v.rail == "cooldown"  # type: ignore[attr-defined]
    assert go("n1", rails=rails, rec=recent(out("n1", 4000))).go  # type: ignore[attr-defined]


def test_flap_damping_a_soft_signal_must_persist() -> None:
    for streak, ok in ((1, False), (2, False), (3, True)):
        v = go("n1", check="ib", rec=recent(streak=streak))
        assert v.go is ok, (streak, v)  # type: ignore[attr-defined]
        if not ok:
            assert v.rail == "flap" and f"{streak} consecutive" in v.why  # type: ignore[attr-defined]
    assert go("n1", check="xid", rec=recent(streak=1)).go  # type: ignore[attr-defined]  # fatal: no damping


@pytest.mark.parametrize(("mode", "approved", "want"), [
    ("observe", False, "observed"), ("observe", True, "observed"), ("recommend", False, "recommended"),
    ("recommend", True, "act"), ("act", False, "act")])
def test_modes(mode: str, approved: bool, want: str) -> None:
    from provisioner.day2.rails import Verdict

    assert disposition(mode, Verdict(True), approved=approved) == want
    assert disposition(mode, Verdict(False, "rate", "x"), approved=approved) == "blocked"


def test_rl001_one_value_on_every_host_is_one_value_for_the_fleet(tmp_path) -> None:
    """The play's rules see hostvars only (group all's value on every host, no group to name it by): that is one
    value for the fleet; a host with a value of its own is not."""
    import dataclasses

    from provisioner.inventory import load_fleet
    from provisioner.rules.context import RuleContext
    from provisioner.rules.rails import rails_shape

    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("remediation_rails: {mode: act}\n")
    (tmp_path / "hosts.ini").write_text("[gpu_nodes]\nn1 ansible_host=198.18.0.11\nn2 ansible_host=198.18.0.12\n")
    fleet = load_fleet(tmp_path / "hosts.ini")
    as_the_play_sees_it = dataclasses.replace(fleet, group_vars={})
    assert list(rails_shape(as_the_play_sees_it, RuleContext())) == []
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "n2.yml").write_text("remediation_rails: {mode: observe}\n")
    fleet = load_fleet(tmp_path / "hosts.ini")
    assert [f.host for f in rails_shape(fleet, RuleContext())] == ["n2"]
    assert [f.host for f in rails_shape(dataclasses.replace(fleet, group_vars={}), RuleContext())] == ["n1", "n2"]
