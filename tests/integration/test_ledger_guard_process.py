"""The last-cluster guard across two real `provision drain` processes on one SQLite ledger (issue 43): c1 and c2
both serve the model; draining both at once must leave one serving unless --force. The interleaving is forced
(tests/support/ledger_race.py): A is held between its check and its write while B runs. With the check and its
write in one BEGIN IMMEDIATE transaction, B waits for A's and then sees c1 draining: refused, nothing changed."""

from __future__ import annotations

from pathlib import Path

from inventory_factory import write_inventory
from ledger_race import GROUP_VARS, INI, race, seed_serving, states


def test_two_drains_of_a_models_two_clusters_one_is_refused(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path / "inv", ini=INI, group_vars=GROUP_VARS, base=False)
    db = str(tmp_path / "ledger.sqlite3")
    seed_serving(db, inv)
    a, b, how = race(tmp_path, inv, db)
    assert "node01: in-service -> draining (race A)" in a.stdout, a.stdout + a.stderr
    drained = states(db, inv)
    assert drained["node02"] == "in-service", f"both clusters of the model drained without --force: {drained}"
    assert how == "locking", "B made its check while A was between its check and its write"
    assert b.returncode == 1, b.stdout + b.stderr
    assert b.stderr.strip().splitlines() == [
        "refused: node02: cluster c2 is the last one serving /models/tiny: draining it stops the model "
        "(add --force to drain it anyway)"], b.stderr
    assert "draining" not in b.stdout
    assert states(db, inv)["node02"] == "in-service"
    assert "Traceback" not in a.stderr + b.stderr


def test_two_upgrades_started_at_once_the_second_is_refused_naming_the_first(tmp_path: Path) -> None:
    """`provision upgrade` twice at once on one SQLite ledger (tests/support/rollout_race.py): A is held between its
    open-rollout check and its claim while B runs. The check and the claim are one BEGIN IMMEDIATE transaction, so B
    waits for A's, then sees A's rollout running: refused in one line naming it; one rollout in the ledger."""
    import rollout_race
    import two_clusters
    from ledger_race import open_site

    inv = two_clusters.write(tmp_path / "inv")
    db = str(tmp_path / "ledger.sqlite3")
    a, b, how = rollout_race.race(tmp_path, inv, db)
    with open_site(db, inv) as lg:
        rollouts = lg.rollouts()
    assert len(rollouts) == 1, f"two rollouts started at once: {[(r.id, r.status, r.pid) for r in rollouts]}"
    assert how == "locking", "B made its check while A was between its check and its claim"
    assert a.returncode == 0, a.stdout + a.stderr
    assert b.returncode == 1, b.stdout + b.stderr
    rid, pid = rollouts[0].id, rollouts[0].pid
    assert b.stderr.strip().splitlines() == [
        f"refused: rollout {rid} of {inv} is running (pid {pid} on {rollouts[0].node})"], b.stderr
    assert pid == int((tmp_path / "race" / "A.checked").read_text()) and "Traceback" not in a.stderr + b.stderr
