"""The rolling upgrade's pure parts (provisioner/day2/rollout.py) and its ledger records: batches never take out the
last cluster serving a model, the progress line, the spec digest, and a rollout whose process died reading
`interrupted` (resumable) in the ledger."""

from __future__ import annotations

from pathlib import Path

from provisioner.day2.rollout import members_that_balance, next_batch, progress, single_model_clusters, spec_digest
from provisioner.ledger import Ledger
from provisioner.ledger.site import path_site

DEAD_PID = 2**31 - 2
MODELS = {"a1": "llama", "a2": "llama", "a3": "llama", "b1": "qwen", "b2": "qwen"}


def test_one_at_a_time_in_order() -> None:
    assert next_batch(["a1", "a2", "a3"], MODELS, {"a1", "a2", "a3"}, 1) == (["a1"], None)


def test_max_unavailable_keeps_one_cluster_of_each_model() -> None:
    # three llama clusters serving: two may go; qwen b1 goes too only while b2 serves
    batch, why = next_batch(["a1", "a2", "a3", "b1", "b2"], MODELS, set(MODELS), 4)
    assert batch == ["a1", "a2", "b1"] and why is None
    assert next_batch(["a3", "b2"], MODELS, {"a3", "b2"}, 2)[0] == []


def test_the_last_serving_cluster_is_not_taken_out() -> None:
    batch, why = next_batch(["b1"], MODELS, {"b1", "a1"}, 1)  # b2 is not serving now
    assert batch == [] and why is not None and "b1 is the last one serving qwen" in why and "--force" in why
    assert next_batch(["b1"], MODELS, {"b1"}, 1, force=True) == (["b1"], None)


def test_a_cluster_out_of_service_costs_no_capacity() -> None:
    # b2 (drained by a stopped rollout) goes first: it is not serving, so b1 may not go with it
    assert next_batch(["b2", "b1"], MODELS, {"b1"}, 2) == (["b2"], None)
    assert next_batch(["b2", "a1"], MODELS, {"a1", "a2", "b1"}, 2) == (["b2", "a1"], None)


def test_single_model_clusters() -> None:
    assert single_model_clusters({"x": "m1", "y": "m1", "z": "m2"}) == [("z", "m2")]
    assert single_model_clusters(MODELS) == []


def test_progress_line() -> None:
    line = progress({"a1": "done", "a2": "returning", "b1": "pending"}, {"a1": "llama", "a2": "llama", "b1": "qwen"},
                    {"a1", "b1"})
    assert line == "1/3 clusters done, 2 left; serving now: llama 1 of 2 clusters, qwen 1 of 1 cluster"


def test_spec_digest_follows_inputs_and_extra_vars() -> None:
    k = b"k" * 32
    base = spec_digest({"n1": "d1", "n2": "d2"}, {"vllm_version": "0.11.0"}, k)
    assert base == spec_digest({"n2": "d2", "n1": "d1"}, {"vllm_version": "0.11.0"}, k)
    assert base != spec_digest({"n1": "d1", "n2": "dX"}, {"vllm_version": "0.11.0"}, k)
    assert base != spec_digest({"n1": "d1", "n2": "d2"}, {"vllm_version": "0.11.1"}, k)
    assert base != spec_digest({"n1": "d1", "n2": "d2"}, {"vllm_version": "0.11.0"}, b"j" * 32)


def test_rollout_records_steps_and_reads_interrupted_when_killed(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.sqlite3") as lg:
        assert lg.open_rollout("/inv") is None
        rid = lg.rollout_started("/inv", {"order": ["a1", "a2"]}, "dig", ["a1", "a2"], pid=DEAD_PID)
        lg.rollout_step(rid, ["a1"], "upgrading")
        ro = lg.open_rollout("/inv")
        assert ro is not None and ro.id == rid and ro.status == "interrupted" and ro.open
        assert [(c.cluster, c.status) for c in ro.clusters] == [("a1", "upgrading"), ("a2", "pending")]
        lg.rollout_claimed(rid)  # resumed by this process
        assert lg.rollout(rid).status == "running"
        lg.rollout_step(rid, ["a1"], "failed", step="holders", detail="n1: /dev/nvidia* held by pid 7 (python3)")
        lg.rollout_ended(rid, "stopped", "held")
        ro = lg.open_rollout("/inv")
        assert ro is not None and ro.status == "stopped" and ro.clusters[0].step == "holders"
        lg.rollout_claimed(rid)
        lg.rollout_step(rid, ["a1", "a2"], "done", seconds=12.5)
        lg.rollout_ended(rid, "done")
        assert lg.open_rollout("/inv") is None and lg.open_rollout("/other") is None
        assert [c.seconds for c in lg.rollout(rid).clusters] == [12.5, 12.5]


# --- `provision upgrade` refusals, before anything touches a node (in-process, the ledger in tmp_path) ----------
def _inv(tmp_path: Path, other_model: bool = False) -> Path:
    from two_clusters import write

    return write(tmp_path / "inv", other_model)


def test_upgrade_refuses_a_model_served_by_one_cluster(tmp_path: Path) -> None:
    from cli_inproc import provision

    db = tmp_path / "ledger.sqlite3"
    r = provision("upgrade", str(_inv(tmp_path, other_model=True)), env={"PROVISION_LEDGER": str(db)})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "is the only one serving" in r.stderr and "--force" in r.stderr, r.stderr
    with Ledger.open(db) as lg:
        assert lg.rollouts() == [] and all(s["site"] == "" for s in lg.sites())


def test_a_rollout_of_the_two_key_scheme_is_refused_saying_why(tmp_path: Path) -> None:
    """A rollout started before the ledger's one key (its spec digest HMAC'd with digest.key): the rerun cannot tell
    its spec, and says so instead of "another change"."""
    from cli_inproc import provision

    inv, db = _inv(tmp_path), tmp_path / "ledger.sqlite3"
    with Ledger.open(db, site=path_site(inv)) as lg:
        rid = lg.rollout_started(str(inv.resolve()), {}, "0" * 64, ["pp", "pp2"], pid=DEAD_PID)
    r = provision("upgrade", str(inv), env={"PROVISION_LEDGER": str(db)})
    assert r.returncode == 1 and r.stderr.startswith(f"refused: rollout {rid} was started by an older provisioner"), \
        r.stderr
    assert "--abort" in r.stderr and "Traceback" not in r.stderr


def test_upgrade_refuses_another_change_while_one_is_open_and_a_running_one(tmp_path: Path) -> None:
    import os

    from cli_inproc import provision

    inv, db = _inv(tmp_path), tmp_path / "ledger.sqlite3"
    env = {"PROVISION_LEDGER": str(db)}
    with Ledger.open(db, site=path_site(inv)) as lg:
        rid = lg.rollout_started(str(inv.resolve()), {}, "ledger-hmac:another", ["pp", "pp2"], pid=DEAD_PID)
        lg.rollout_step(rid, ["pp"], "upgrading")
    r = provision("upgrade", str(inv), "-e", "{\"nccl_ib_timeout\": 23}", env=env)
    assert r.returncode == 1 and r.stderr.startswith(
        f"refused: rollout {rid} of another change is interrupted at cluster pp (upgrading)"), r.stderr
    assert "--abort" in r.stderr
    with Ledger.open(db, site=path_site(inv)) as lg:
        lg.rollout_ended(rid, "aborted")
        live = lg.rollout_started(str(inv.resolve()), {}, "x", ["pp", "pp2"], pid=os.getpid())
    r = provision("upgrade", str(inv), env=env)
    assert r.returncode == 1 and f"rollout {live} of" in r.stderr and "is running" in r.stderr, r.stderr


def test_abort_closes_a_rollout_with_nothing_out_and_usage_errors(tmp_path: Path) -> None:
    from cli_inproc import provision

    inv, db = _inv(tmp_path), tmp_path / "ledger.sqlite3"
    env = {"PROVISION_LEDGER": str(db)}
    r = provision("upgrade", str(inv), "--abort", env=env)
    assert r.returncode == 0 and "no rollout of" in r.stdout, r.stdout + r.stderr
    with Ledger.open(db, site=path_site(inv)) as lg:
        rid = lg.rollout_started(str(inv.resolve()), {}, "d", ["pp", "pp2"], pid=DEAD_PID)
    r = provision("upgrade", str(inv), "--abort", env=env)
    assert r.returncode == 0 and f"rollout {rid} aborted: 0 cluster(s) had been upgraded" in r.stdout, r.stdout
    with Ledger.open(db, site=path_site(inv)) as lg:
        assert lg.rollout(rid).status == "aborted" and lg.open_rollout(str(inv.resolve())) is None
    r = provision("upgrade", str(inv), "--max-unavailable", "0", env=env)
    assert r.returncode == 2 and "--max-unavailable" in r.stderr


def test_a_balancer_that_is_also_a_member_is_named_with_its_cluster() -> None:
    clusters = {"vllm_pp": ["node01", "node02"], "vllm_single": ["node03"]}
    assert members_that_balance(clusters, ["node03"]) == [("node03", "vllm_single")]
    assert members_that_balance(clusters, ["lb01"]) == []
    assert members_that_balance(clusters, []) == []


class _C:
    def __init__(self, cluster: str, status: str, step: str | None = None) -> None:
        self.cluster, self.status, self.step = cluster, status, step


class _Ro:
    def __init__(self, status: str, digest: str, clusters: list[_C]) -> None:
        self.id, self.status, self.digest, self.clusters, self.pid, self.node = 7, status, digest, clusters, 42, "ctl"


def test_refusal_of_a_start_or_resume() -> None:
    from provisioner.day2.rollout import refusal
    from provisioner.drift.state import KEYED

    d = KEYED + "abc"
    assert refusal(None, "inv", digest=d, abort=False, force=False, models=MODELS) is None
    running = refusal(_Ro("running", d, []), "inv", digest=d, abort=True, force=False, models=MODELS)
    assert running == "refused: rollout 7 of inv is running (pid 42 on ctl)"
    other = refusal(_Ro("stopped", KEYED + "x", [_C("a1", "done"), _C("a2", "draining")]), "inv", digest=d,
                    abort=False, force=False, models=MODELS)
    assert other is not None and "rollout 7 of another change is stopped at cluster a2 (draining)" in other
    old = refusal(_Ro("stopped", "legacy", []), "inv", digest=d, abort=False, force=False, models=MODELS)
    assert old is not None and "older provisioner" in old
    assert refusal(_Ro("stopped", "legacy", []), "inv", digest=d, abort=True, force=False, models=MODELS) is None
    single = refusal(None, "inv", digest=d, abort=False, force=False, models={"x": "m1"})
    assert single is not None and "cluster x is the only one serving m1" in single
    assert refusal(None, "inv", digest=d, abort=False, force=True, models={"x": "m1"}) is None
    # a resume of the same change is not refused for a single-model cluster: the start already was allowed
    assert refusal(_Ro("stopped", d, [_C("x", "pending")]), "inv", digest=d, abort=False, force=False,
                   models={"x": "m1"}) is None


def test_rollout_lines() -> None:
    from provisioner.day2.rollout import resumed_line, started_line

    assert started_line(3, ["a1", "b1"], 1) == "rollout 3: 2 cluster(s), at most 1 out at a time: a1, b1"
    ro = _Ro("interrupted", "d", [_C("a1", "done"), _C("b1", "failed", "holders"), _C("b2", "pending")])
    assert resumed_line(ro) == "rollout 7 resumed (interrupted): 1 done, left: b1 (failed, holders), b2 (pending)"
