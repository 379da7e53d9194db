"""The rails, modes, alert keys and incidents of `provision remediate`, and `provision incidents` / `status`, as real
processes on a real SQLite ledger without a rack (the nodes at a closed port of 127.0.0.1: every SSH step fails at
once). Proven: what the ledger records and what is not done; not proven here: the steps on nodes (the rack's)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import remediate_site
from remediate_site import health, ledger, provision

POLICY = {"quarantine_on": ["ecc", "xid", "ib"], "remediation": ["gpu_reset"],
          "replace_after": {"quarantines": 9, "window_days": 30}}
CLUSTER = {"model": "meta-llama/Llama-3.1-8B-Instruct", "tensor_parallel_size": 8, "pipeline_parallel_size": 2,
           "max_model_len": 4096, "max_num_seqs": 64}
XID = "critical XID 79 on 0000:1b:00.0"


def make(tmp: Path, rails: dict[str, Any] | None) -> dict[str, Path]:
    return remediate_site.make(tmp, policy=POLICY, cluster=CLUSTER, rails=rails, in_service_for=7200)


def states(site: dict[str, Path]) -> dict[str, str]:
    with ledger(site) as lg:
        return {h: s for h, (s, _) in lg.states().items()}


def test_a_new_site_recommends_changes_nothing_and_approve_acts(tmp_path: Path) -> None:
    site = make(tmp_path, None)  # no remediation_rails: the default mode, recommend
    health(site, n1=("xid", XID))
    p = provision(site, "remediate", str(site["inv"]))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"n1: quarantine (xid: {XID}): recommended as #1 (mode recommend): provision remediate INVENTORY " \
           "--approve 1" in p.stdout, p.stdout
    assert "0 actions" in p.stdout and set(states(site).values()) == {"in-service"}
    again = provision(site, "remediate", str(site["inv"]), "--source", "timer")  # the same recommendation, once
    assert "recommended as #1" in again.stdout
    with ledger(site) as lg:
        [a] = lg.actions()
        assert (a.host, a.kind, a.status, a.source, a.mode, a.check) == ("n1", "quarantine", "recommended",
                                                                        "operator", "recommend", "xid")
        assert lg.incidents() == []
    st = provision(site, "status", str(site["inv"]), "-f", "json")
    assert json.loads(st.stdout)["day2"]["recommended"][0]["id"] == 1
    text = provision(site, "status", str(site["inv"])).stdout
    assert f"recommended #1: n1: quarantine (xid: {XID}): provision remediate {site['inv']} --approve 1" in text

    ok = provision(site, "remediate", str(site["inv"]), "--approve", "1")
    assert "n1: in-service -> draining" in ok.stdout and "n1: draining -> quarantined" in ok.stdout, ok.stdout
    assert "n1: remediate: gpu_reset" in ok.stdout and "recommended as #" in ok.stdout  # the next step waits too
    assert states(site) == {"n1": "quarantined", "n2": "maintenance", "n3": "in-service", "n4": "in-service"}
    with ledger(site) as lg:
        first = lg.action(1)
        # acted on; the steps on the nodes failed (unreachable here): the action says so, and the incident has no
        # drained time (the cluster's vLLM was not seen stopped)
        assert first is not None and first.status == "failed" and "unreachable" in (first.detail or "")
        assert first.decided_by and first.incident == 1
        [inc] = lg.incidents()
        assert (inc.host, inc.cluster, inc.status, inc.source) == ("n1", "c1", "open", "operator")
        assert inc.quarantined is not None and inc.quarantined >= inc.detected and inc.drained is None
    gone = provision(site, "remediate", str(site["inv"]), "--approve", "1")
    assert gone.returncode == 2 and "no recommended action #1" in gone.stderr and "(it is failed)" in gone.stderr
    assert len(gone.stderr.strip().splitlines()) == 1 and "Traceback" not in gone.stderr


def test_observe_records_once_and_changes_nothing(tmp_path: Path) -> None:
    site = make(tmp_path, {"mode": "observe"})
    health(site, n3=("ecc", "GPU 3: row remap failure"))
    before = states(site)
    for _ in range(2):
        p = provision(site, "remediate", str(site["inv"]), "-f", "json")
        assert p.returncode == 0, p.stderr
        [line] = json.loads(p.stdout)["actions"]
        assert line["status"] == "observed" and "observed as #1 (mode observe): nothing done" in line["line"]
    assert states(site) == before
    with ledger(site) as lg:
        assert [(a.kind, a.status) for a in lg.actions()] == [("quarantine", "observed")]
    app = provision(site, "remediate", str(site["inv"]), "--approve", "1")
    assert app.returncode == 2 and "(it is observed)" in app.stderr


def test_an_alert_key_acts_once_and_the_source_is_kept(tmp_path: Path) -> None:
    site = make(tmp_path, {"mode": "act"})
    health(site, n3=("xid", XID))
    args = ("remediate", str(site["inv"]), "--limit", "n3", "--source", "alert", "--alert-key", "fp-1:1700000000")
    p = provision(site, *args)
    assert "n3: draining -> quarantined" in p.stdout, p.stdout + p.stderr
    dup = provision(site, *args)
    assert dup.returncode == 0 and "alert key 'fp-1:1700000000' was acted on already" in dup.stdout
    with ledger(site) as lg:
        acts = lg.actions()
        assert {a.source for a in acts} == {"alert"} and acts[0].alert_key == "fp-1:1700000000"
        assert [i.source for i in lg.incidents()] == ["alert"]
        n = len(acts)
    assert len(provision(site, *args).stdout.splitlines()) == 2
    with ledger(site) as lg:
        assert len(lg.actions()) == n
    bad = provision(site, "remediate", str(site["inv"]), "--source", "pager")
    assert bad.returncode == 2 and "pager" in bad.stderr and "Traceback" not in bad.stderr


def test_bad_push_opens_the_breaker_before_the_last_cluster_goes(tmp_path: Path) -> None:
    """The same fatal XID on every node at once, mode act, default rails: c1 goes out (its member quarantined),
    the next take-out would leave the model no cluster: the breaker opens, c2 keeps serving, the ledger, status,
    the page and the metrics say so; an operator closes it with a reason."""
    site = make(tmp_path, {"mode": "act"})
    health(site, **{h: ("xid", XID) for h in ("n1", "n2", "n3", "n4")})
    p = provision(site, "remediate", str(site["inv"]), "--source", "alert")
    out = p.stdout
    assert "n1: draining -> quarantined" in out, out
    assert "BREAKER OPEN: 2 of 4 nodes would be taken out within 300 s (breaker_share 0.25: at most 1)" in out, out
    assert "n3: quarantine" in out and "HELD by the rails" in out and "Traceback" not in p.stderr
    assert states(site)["n3"] == "in-service" and states(site)["n4"] == "in-service"
    with ledger(site) as lg:
        ev, _ = lg.breaker()
        assert ev is not None and ev.state == "open" and "2 of 4 nodes" in ev.why and ev.source == "alert"
        assert {(a.host, a.rail) for a in lg.actions(status="blocked")} >= {("n3", "breaker"), ("n4", "breaker")}
    st = json.loads(provision(site, "status", str(site["inv"]), "-f", "json").stdout)["day2"]
    assert st["breaker"]["open"] and [i["host"] for i in st["open_incidents"]] == ["n1"]
    page = tmp_path / "status.html"
    assert provision(site, "status", str(site["inv"]), "--html", str(page)).returncode == 0
    html = page.read_text()
    assert html.index('id="breaker"') < html.index('id="open-incidents"') < html.index('id="status"')
    assert 'id="incident-distributions"' in html
    prom = tmp_path / "incidents.prom"
    inc = provision(site, "incidents", str(site["inv"]), "--prometheus", str(prom))
    assert inc.returncode == 0 and "#1 n1 (c1, alert): xid: critical XID 79" in inc.stdout, inc.stdout
    assert "remediation breaker: OPEN" in inc.stdout
    text = prom.read_text()
    assert "provisioner_remediation_breaker_open{" in text and "} 1\n" in text
    assert "# TYPE provisioner_incident_drain_seconds histogram" in text
    # a second pass: still held, the breaker is not opened twice
    provision(site, "remediate", str(site["inv"]))
    with ledger(site) as lg:
        assert [e.state for e in lg.breaker_events()] == ["open"]
    no = provision(site, "remediate", str(site["inv"]), "--close-breaker")
    assert no.returncode == 2 and "--reason" in no.stderr and len(no.stderr.strip().splitlines()) == 1
    yes = provision(site, "remediate", str(site["inv"]), "--close-breaker", "--reason", "driver push rolled back")
    assert yes.returncode == 0 and "breaker closed by" in yes.stdout and "driver push rolled back" in yes.stdout
    with ledger(site) as lg:
        assert lg.breaker()[0] is None and lg.breaker_events()[-1].why == "driver push rolled back"


def test_incidents_json_has_the_times_per_node_and_distributions(tmp_path: Path) -> None:
    site = make(tmp_path, {"mode": "act"})
    with ledger(site) as lg:
        t = time.time() - 5000
        a = lg.incident_opened("n1", cluster="c1", source="alert", cause="xid", signal=t, detected=t + 20)
        lg.incident_mark(a, "quarantined", at=t + 25)
        lg.incident_mark(a, "drained", at=t + 50)
        lg.incident_step(a, "gpu_reset", "done", at=t + 60)
        lg.incident_mark(a, "returned", at=t + 400)
        b = lg.incident_opened("n1", cluster="c1", source="timer", cause="ecc", signal=t + 3000, detected=t + 3010)
    p = provision(site, "incidents", str(site["inv"]), "-f", "json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    first, second = out["incidents"]
    assert (first["detect_s"], first["drain_s"], first["return_s"], first["status"]) == (20, 30, 380, "returned")
    assert (second["id"], second["status"], second["since_previous_s"], second["return_s"]) == (b, "open", 2990, None)
    assert out["per_node"]["n1"] == {"incidents": 2, "open": 1, "mean_between_s": 2990}
    assert out["distributions"]["detect"] == {"count": 2, "p50": 10, "p99": 20, "max": 20}
    assert out["breaker"]["open"] is False
    text = provision(site, "incidents", str(site["inv"]), "--open").stdout
    assert f"#{b} n1 (c1, timer): ecc;" in text and "OPEN" in text and f"#{a} " not in text


@pytest.mark.parametrize(("rails", "code"), [({"mode": "yolo"}, "RL002"), ({"breaker_share": 2}, "RL003")])
def test_invalid_rails_stop_before_acting(tmp_path: Path, rails: dict[str, Any], code: str) -> None:
    site = make(tmp_path, rails)
    health(site, n1=("xid", XID))
    p = provision(site, "remediate", str(site["inv"]))
    assert p.returncode == 1 and code in p.stderr and "remediation_rails" in p.stderr and p.stdout == ""
    assert set(states(site).values()) == {"in-service"}


def test_a_flapping_ib_port_drains_nothing_until_it_persists(tmp_path: Path) -> None:
    site = make(tmp_path, {"mode": "act"})
    down = ("ib", "mlx5_0:1 state DOWN")
    for passes in ([down], [down, None], [down, None, down]):  # bouncing: never 3 failures in a row
        for bad in passes:
            health(site, **({"n1": bad} if bad else {}))
        p = provision(site, "remediate", str(site["inv"]), "--limit", "n1")
        if passes[-1]:  # failing now, not for long enough: held; passing now: nothing to do
            assert "HELD by the rails: flap damping: ib failed in 1 consecutive observation(s), 3 needed" \
                in p.stdout, p.stdout + p.stderr
        assert states(site)["n1"] == "in-service" and p.returncode == 0
    health(site, n1=down)
    health(site, n1=down)  # now three in a row
    p = provision(site, "remediate", str(site["inv"]), "--limit", "n1")
    assert "n1: draining -> quarantined (ib: mlx5_0:1 state DOWN)" in p.stdout, p.stdout
    with ledger(site) as lg:
        held = [a for a in lg.actions(host="n1") if a.status == "blocked"]
        assert held and {a.rail for a in held} == {"flap"}
