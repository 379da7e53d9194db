"""The two-tier drift's pure parts: the probe's output parsed, records compared, the tier-2 reasons, the input
digest's sensitivity, the managed roots against the roles' own path defaults, and the folding into a drift result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from provisioner.drift import state as hoststate
from provisioner.drift.state import Change, Record, compare, parse_probe, state_digest, tier2_reason
from provisioner.ledger.store import Ledger
from provisioner.results import DriftItem, RunResult
from provisioner.drift.tiers import Tiers, merge, reason_kind

ROOT = Path(__file__).resolve().parents[2]


def _out(state: dict[str, str], version: int = hoststate.STATE_VERSION) -> str:
    return json.dumps({"version": version, "boot_id": "b", "state": state}) + "\n"


def test_parse_probe_takes_the_last_line_and_refuses_what_is_not_a_probe() -> None:
    assert parse_probe("motd noise\n" + _out({"file:/etc/nccl.conf": "ab 644 0 0"})) == {
        "file:/etc/nccl.conf": "ab 644 0 0"}
    for bad in ("", "not json\n", _out({}, version=99), json.dumps({"version": 1}) + "\n"):
        with pytest.raises(hoststate.StateError):
            parse_probe(bad)
    with pytest.raises(hoststate.StateError, match="dpkg-query failed"):
        parse_probe(_out({"error:dpkg": "dpkg-query failed", "file:/x": "1"}))


def test_compare_names_changed_new_and_gone_resources() -> None:
    rec = {"file:/etc/nccl.conf": "aa 644 0 0", "package:libnccl2": "2.27 hold ok installed",
           "service:nvidia-persistenced.service": "enabled active/running"}
    found = {"file:/etc/nccl.conf": "bb 644 0 0", "package:libnccl2": "2.27 hold ok installed",
             "file:/etc/apt/sources.list.d/x.list": "cc 644 0 0"}
    assert compare(rec, rec) == []
    got = compare(rec, found)
    assert [(c.kind, c.resource) for c in got] == [("file", "/etc/apt/sources.list.d/x.list"), ("file", "/etc/nccl.conf"),
                                                   ("service", "nvidia-persistenced.service")]
    assert got[0].text.endswith(": new (cc 644 0 0)") and got[2].text.endswith(": gone")
    assert got[1].text == "file /etc/nccl.conf: aa 644 0 0 -> bb 644 0 0"


def test_tier2_reasons() -> None:
    state = {"file:/x": "1"}
    good = Record("n1", 1, 0.0, "in", state, state_digest(state))
    assert tier2_reason(good, "in") is None
    assert tier2_reason(None, "in").startswith("no recorded state")
    assert tier2_reason(good, "other").startswith("inputs changed")
    bad = Record("n1", 1, 0.0, "in", {"file:/x": "2"}, good.digest)
    assert tier2_reason(bad, "in").startswith("recorded state corrupted")
    assert [reason_kind(r) for r in ("--full", "probe failed: x", "probe found 1 change(s): y", "zzz")] == [
        "full", "probe failed", "probe found changes", "other"]


def test_the_input_digest_moves_with_every_input() -> None:
    base = dict(host_vars={"nccl_ib_timeout": 22}, host_plan={"cluster": None}, fleet_plan={"clusters": {}},
                run_options={"skip_tags": "vllm"}, content="c1", version="0.1.0", key=b"k" * 32)
    d0 = hoststate.inputs_digest(**base)
    assert hoststate.inputs_digest(**base) == d0
    for key, value in (("host_vars", {"nccl_ib_timeout": 21}), ("host_plan", {"cluster": "c"}),
                       ("fleet_plan", {"clusters": {"c": 1}}), ("run_options", {"skip_tags": ""}),
                       ("content", "c2"), ("version", "0.2.0"), ("key", b"j" * 32)):
        assert hoststate.inputs_digest(**{**base, key: value}) != d0, key


def test_content_hash_sees_a_template_edit(tmp_path: Path) -> None:
    (tmp_path / "roles" / "r" / "templates").mkdir(parents=True)
    t = tmp_path / "roles" / "r" / "templates" / "a.j2"
    t.write_text("x\n")
    h1 = hoststate.content_hash(tmp_path)
    (tmp_path / "roles" / "r" / "__pycache__").mkdir()
    (tmp_path / "roles" / "r" / "__pycache__" / "m.pyc").write_bytes(b"\0")
    assert hoststate.content_hash(tmp_path) == h1  # bytecode is not content
    t.write_text("y\n")
    assert hoststate.content_hash(tmp_path) != h1


def _covered(path: str) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in hoststate.ROOTS + hoststate.VENVS)


def test_the_managed_roots_cover_every_path_the_roles_default_to() -> None:
    """Each absolute path a role's defaults name under /etc, /usr/local, /opt (files the roles write) is under a
    root of the recorded state: a new role writing elsewhere must extend hoststate.ROOTS."""
    missing = []
    for f in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        for key, value in (yaml.safe_load(f.read_text()) or {}).items():
            if isinstance(value, str) and value.startswith(("/etc/", "/usr/local/", "/opt/")) and "{{" not in value:
                if not _covered(value):
                    missing.append(f"{f.parent.parent.name}.{key} = {value}")
    for f in sorted(ROOT.glob("roles/*/tasks/*.yml")):
        for line in f.read_text().splitlines():
            for word in ("dest:", "path:", "pin_file:"):
                if line.strip().startswith(word):
                    v = line.split(":", 1)[1].strip().strip("\"'")
                    if v.startswith(("/etc/", "/usr/local/", "/opt/")) and "{{" not in v and not _covered(v):
                        missing.append(f"{f.relative_to(ROOT)}: {v}")
    assert not missing, missing


def test_merge_folds_tiers_into_the_drift_result(tmp_path: Path) -> None:
    r = RunResult(command="drift", inventory="i", playbook="p", run_dir=str(tmp_path), artifact_dir="", started=0,
                  check=True)
    r.host("n2").seen = True
    r.host("n2").changed = 1
    r.host("n2").drift += [DriftItem("n2", "t", "file", "/etc/nccl.conf"), DriftItem("n2", "t", "package", "x")]
    r.host("n3").seen = True
    t = Tiers(tier1=["n1"], tier2={"n2": "probe found 1 change(s): file /etc/nccl.conf: a -> b",
                                   "n3": "inputs changed since the last complete run"},
              changes={"n2": [Change("file", "/etc/nccl.conf", "a", "b")]},
              records={"n1": Record("n1", 1, 0.0, "in", {}, "", roles=("", "nccl_tuning"))})
    merge(t, r, ["n1", "n2", "n3"])
    assert r.hosts["n1"].roles == ["", "nccl_tuning"]  # a tier-1 host lists the roles of its recorded run
    assert [r.hosts[h].tier for h in ("n1", "n2", "n3")] == [1, 2, 2]
    assert r.hosts["n1"].state == "ok" and not r.hosts["n1"].drift
    assert [d.tier for d in r.hosts["n2"].drift] == [1, 2]  # the probe saw the file, not the package
    assert r.hosts["n2"].probe_changes == ["file /etc/nccl.conf: a -> b"]
    assert r.tiers == {"tier1": 1, "tier2": 2, "reasons": {"probe found changes": 1, "inputs changed": 1},
                       "probe_seconds": 0.0}
    assert r.targeted == ["n1", "n2", "n3"]


def test_ledger_keeps_one_record_per_host_and_drops_failed_ones() -> None:
    lg = Ledger.open(":memory:")
    lg.put_states([("n1", None, "i1", {"file:/a": "1"}), ("n2", None, "i2", {"file:/b": "2"})])
    lg.put_states([("n1", None, "i3", {"file:/a": "3"}, ["", "nvidia_driver", "nccl_tuning"])], drop=["n2"])
    recs = lg.records(["n1", "n2", "n3"])
    assert list(recs) == ["n1"] and recs["n1"].state == {"file:/a": "3"}
    assert recs["n1"].inputs == "i3"  # as given: the caller keyed it with the ledger's one key (host_inputs)
    assert recs["n1"].roles == ("", "nvidia_driver", "nccl_tuning")
    assert tier2_reason(recs["n1"], "i3") is None
    lg._db.execute("UPDATE host_state SET state = X'00'")
    assert tier2_reason(lg.records(["n1"])["n1"], "i3").startswith("recorded state corrupted")


def test_a_record_of_the_two_key_scheme_is_checked_by_ansible_once_saying_why() -> None:
    """A ledger written before the one key (inputs HMAC'd with digest.key, then sealed "hmac-sha256:..." with the
    ledger's key): its records match no new digest, and the reason says why, not "inputs changed"; the next record
    is the new kind, and then the host is tier 1 again."""
    from provisioner.drift.state import KEYED, keyed_digest

    lg = Ledger.open(":memory:")
    new = keyed_digest(lg.digest_key(), {"vars": {"a": 1}})
    assert new.startswith(KEYED)
    lg.put_states([("n1", None, "hmac-sha256:" + "0" * 64, {"file:/a": "1"})])
    why = tier2_reason(lg.records(["n1"])["n1"], new)
    assert why is not None and "older provisioner" in why and "once" in why
    lg.put_states([("n1", None, new, {"file:/a": "1"})])
    assert tier2_reason(lg.records(["n1"])["n1"], new) is None


def test_no_plain_digest_of_a_file_is_recorded(tmp_path: Path) -> None:
    """The vLLM env file holds the API key: its sha256 (the probe's) never reaches the ledger, only an HMAC under a
    random per-ledger key; two ledgers record the same file differently; a fresh probe sealed by the same ledger
    compares equal (tier 1 still works) and a changed file does not."""
    import hashlib
    import sqlite3
    import zlib

    env = b"VLLM_API_KEY=sk-guessable-1234\n"
    plain = hashlib.sha256(env).hexdigest()
    state = {"file:/etc/vllm/env": f"{plain} 600 0 0", "file:/etc/vllm": "dir 755 0 0",
             "package:nginx": "1.24 install ok installed"}
    sealed = []
    for name in ("a", "b"):
        db = tmp_path / f"{name}.sqlite3"
        with Ledger.open(db, site="s") as lg:
            keyed = hoststate.keyed_digest(lg.digest_key(), {"vars": {"vllm_api_key": "sk-guessable-1234"}})
            lg.put_states([("n1", None, keyed, state)])
            rec = lg.records(["n1"])["n1"]
            assert hoststate.compare(rec.state, lg.sealer()(state)) == []
            assert hoststate.compare(rec.state, lg.sealer()({**state, "file:/etc/vllm/env": "0" * 64 + " 600 0 0"}))
            sealed.append(rec.state["file:/etc/vllm/env"])
        raw = sqlite3.connect(db).execute("SELECT inputs, state FROM host_state").fetchone()
        text = raw[0] + zlib.decompress(raw[1]).decode()
        assert plain not in text and "sk-guessable" not in text and raw[0] == keyed
        assert rec.state["file:/etc/vllm"] == "dir 755 0 0" and rec.state["package:nginx"] == state["package:nginx"]
    assert sealed[0] != sealed[1] and all(v.endswith(" 600 0 0") for v in sealed)


def test_full_every_is_due_without_a_full_drift_and_after_the_days(tmp_path: Path) -> None:
    import time

    from provisioner.drift.tiers import full_done, full_due

    db, inv = tmp_path / "ledger.sqlite3", str(tmp_path / "hosts.ini")
    assert full_due(inv, 7, db)
    full_done(inv, db)
    assert not full_due(inv, 7, db) and not full_due(str(tmp_path / "." / "hosts.ini"), 7, db)
    with Ledger.open(db) as lg:
        lg.full_drift_done(str(Path(inv).resolve()), at=time.time() - 8 * 86400)
    assert full_due(inv, 7, db) and not full_due(inv, 9, db)
    assert full_due(str(tmp_path / "other.ini"), 7, db)
