"""provisioner/day2/lifecycle.py: every pair of states is either allowed (and yields a Result) or refused (one line);
the two rule refusals: into in-service without a passed health gate, draining the last serving cluster."""

from __future__ import annotations

import dataclasses

import pytest

from provisioner.day2.lifecycle import ALLOWED, STATES, ClusterInfo, Context, Refused, transition

EXPECTED = {
    ("new", "provisioning"), ("new", "retired"),
    ("provisioning", "burn-in"), ("provisioning", "maintenance"), ("provisioning", "quarantined"),
    ("provisioning", "retired"),
    ("burn-in", "in-service"), ("burn-in", "maintenance"), ("burn-in", "quarantined"), ("burn-in", "retired"),
    ("in-service", "draining"),
    ("draining", "maintenance"), ("draining", "quarantined"),
    ("maintenance", "burn-in"), ("maintenance", "provisioning"), ("maintenance", "retired"),
    ("quarantined", "burn-in"), ("quarantined", "retired"),
}
PAIRS = [(a, b) for a in STATES for b in STATES]
GATE = Context(health_passed=True)


def test_the_table_is_the_documented_one() -> None:
    assert {(a, b) for a, nexts in ALLOWED.items() for b in nexts} == EXPECTED
    assert ALLOWED["retired"] == frozenset()


@pytest.mark.parametrize(("current", "target"), sorted(EXPECTED))
def test_allowed(current: str, target: str) -> None:
    res = transition(current, target, reason="  because  ", host="n1", context=GATE)
    assert (res.host, res.from_state, res.to_state, res.reason, res.forced) == ("n1", current, target, "because",
                                                                               False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.to_state = "new"  # type: ignore[misc]


@pytest.mark.parametrize(("current", "target"), [p for p in PAIRS if p not in EXPECTED])
def test_refused(current: str, target: str) -> None:
    with pytest.raises(Refused) as exc:
        transition(current, target, reason="r", host="n1", context=GATE, force=True)  # force lifts none of these
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("n1")
    assert ("already" in msg) if current == target else f"{current} -> {target} is not a lifecycle transition" in msg


def test_refusal_hints() -> None:
    with pytest.raises(Refused, match="drain it first"):
        transition("in-service", "maintenance", reason="r", host="n1")
    with pytest.raises(Refused, match="from retired: nothing"):
        transition("retired", "burn-in", reason="r", host="n1")


def test_unknown_state_and_empty_reason() -> None:
    with pytest.raises(Refused, match="unknown lifecycle state 'serving'"):
        transition("burn-in", "serving", reason="r")
    with pytest.raises(Refused, match="needs a reason"):
        transition("new", "provisioning", reason=" ")


def test_in_service_needs_the_health_gate_and_force_does_not_lift_it() -> None:
    for force in (False, True):
        with pytest.raises(Refused, match="needs a passed health gate first"):
            transition("burn-in", "in-service", reason="r", host="n1", force=force, context=Context())
    assert transition("burn-in", "in-service", reason="r", context=GATE).to_state == "in-service"


def fleet(states: dict[str, str]) -> Context:
    clusters = {"a": ClusterInfo("Qwen2-72B", ("n1", "n2")), "b": ClusterInfo("Qwen2-72B", ("n3", "n4")),
                "c": ClusterInfo("Llama-3-8B", ("n5",))}
    return Context(cluster="a", clusters=clusters, states=states)


SERVING = {h: "in-service" for h in ("n1", "n2", "n3", "n4", "n5")}


def test_draining_with_another_cluster_serving_the_model() -> None:
    res = transition("in-service", "draining", reason="upgrade", host="n1", context=fleet(SERVING))
    assert not res.forced and res.notes == ("cluster a drains as a whole (with n2)",)


@pytest.mark.parametrize("other", [{"n3": "draining"}, {"n4": "maintenance"}, {"n3": "new", "n4": "new"}])
def test_draining_the_last_serving_cluster_is_refused_without_force(other: dict[str, str]) -> None:
    ctx = fleet({**SERVING, **other})
    with pytest.raises(Refused, match="cluster a is the last one serving Qwen2-72B.*--force"):
        transition("in-service", "draining", reason="upgrade", host="n1", context=ctx)
    res = transition("in-service", "draining", reason="upgrade", host="n1", force=True, context=ctx)
    assert res.forced and "forced: cluster a was the last one serving Qwen2-72B" in res.notes


def test_draining_a_node_outside_any_cluster_needs_no_force() -> None:
    ctx = dataclasses.replace(fleet(SERVING), cluster=None)
    assert transition("in-service", "draining", reason="r", host="n9", context=ctx).notes == ()


def test_a_single_model_cluster_is_its_models_last() -> None:
    ctx = dataclasses.replace(fleet(SERVING), cluster="c")
    with pytest.raises(Refused, match="last one serving Llama-3-8B"):
        transition("in-service", "draining", reason="r", host="n5", context=ctx)


@pytest.mark.parametrize(("start", "target", "chain"), [
    ("new", "in-service", ("provisioning", "burn-in", "in-service")),
    ("quarantined", "in-service", ("burn-in", "in-service")),
    ("draining", "in-service", ("maintenance", "burn-in", "in-service")),
    ("in-service", "maintenance", ("draining", "maintenance")),
    ("burn-in", "burn-in", ()),
])
def test_path_to_is_the_shortest_chain_of_allowed_transitions(start: str, target: str, chain: tuple[str, ...]) -> None:
    from provisioner.day2.lifecycle import path_to

    assert path_to(start, target) == chain
    state = start
    for to in chain:  # every step is one the rules allow
        transition(state, to, reason="t", context=GATE, force=True)
        state = to


def test_path_to_out_of_retired_is_refused() -> None:
    from provisioner.day2.lifecycle import path_to

    with pytest.raises(Refused, match="no lifecycle path from retired to in-service"):
        path_to("retired", "in-service")


@pytest.mark.parametrize(("state", "passed", "target"), [
    ("new", True, "in-service"), ("maintenance", True, "in-service"), ("new", False, "provisioning"),
    ("in-service", False, "maintenance"), ("draining", False, "maintenance"), ("burn-in", False, "burn-in"),
    ("quarantined", False, "quarantined"),
])
def test_onboarding_moves_a_node_to_in_service_or_out_of_it(state: str, passed: bool, target: str) -> None:
    from provisioner.day2.lifecycle import lifecycle_target

    assert lifecycle_target(state, passed) == target
