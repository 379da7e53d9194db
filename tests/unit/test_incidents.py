"""Incidents measured (provisioner/day2/incidents.py) and their Prometheus exposition
(provisioner/reports/incidents_prometheus.py): durations, time between one node's incidents, quantiles, buckets."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.day2.incidents import distributions, per_node, quantile, rows
from provisioner.reports.incidents_prometheus import render


@dataclass(frozen=True)
class Inc:
    id: int
    host: str
    detected: float
    drained: float | None = None
    returned: float | None = None
    signal: float | None = None
    cluster: str | None = "c1"
    source: str = "alert"
    cause: str = "xid"
    quarantined: float | None = None
    replaced: float | None = None
    status: str = "open"


def sample() -> list[Inc]:
    return [Inc(1, "n1", 100, 130, 400, signal=90, status="returned"),
            Inc(2, "n2", 150, 160, signal=149),
            Inc(3, "n1", 1100, signal=1095)]


def test_rows_have_the_durations_and_the_time_since_the_nodes_previous_incident() -> None:
    t = rows(reversed(sample()))  # any order in: oldest first out
    assert [r["id"] for r in t] == [1, 2, 3]
    assert (t[0]["detect_s"], t[0]["drain_s"], t[0]["return_s"], t[0]["since_previous_s"]) == (10, 30, 300, None)
    assert (t[1]["drain_s"], t[1]["return_s"]) == (10, None)
    assert t[2]["since_previous_s"] == 1000 and t[2]["drain_s"] is None


def test_quantiles_distributions_and_per_node() -> None:
    assert quantile([], 0.5) is None and quantile([3, 1, 2], 0.5) == 2 and quantile(list(range(1, 101)), 0.99) == 99
    d = distributions(rows(sample()))
    assert (d["detect"]["count"], d["detect"]["p50"], d["detect"]["max"]) == (3, 5, 10)
    assert d["drain"]["values"] == [30, 10] and d["between"]["count"] == 1
    assert per_node(rows(sample())) == {"n1": {"incidents": 2, "open": 1, "mean_between_s": 1000.0},
                                        "n2": {"incidents": 1, "open": 1, "mean_between_s": None}}


def test_prometheus_histograms_are_cumulative_and_labels_escaped() -> None:
    text = render(rows(sample()), site='rack "a"\nx', open_incidents=2, breaker_open=True, recommended=3)
    lines = text.splitlines()
    assert "# TYPE provisioner_incident_drain_seconds histogram" in lines
    lbl = 'site="rack \\"a\\"\\nx"'
    assert f'provisioner_incident_drain_seconds_bucket{{{lbl},le="10"}} 1' in lines
    assert f'provisioner_incident_drain_seconds_bucket{{{lbl},le="30"}} 2' in lines
    assert f'provisioner_incident_drain_seconds_bucket{{{lbl},le="+Inf"}} 2' in lines
    assert f"provisioner_incident_drain_seconds_sum{{{lbl}}} 40" in lines
    assert f"provisioner_incident_return_seconds_count{{{lbl}}} 1" in lines
    assert f"provisioner_incidents_open{{{lbl}}} 2" in lines
    assert f"provisioner_remediation_breaker_open{{{lbl}}} 1" in lines
    assert f"provisioner_remediation_recommended{{{lbl}}} 3" in lines
    for name in ("detect", "drain", "return", "between"):
        counts = [int(ln.rsplit(" ", 1)[1]) for ln in lines
                  if ln.startswith(f"provisioner_incident_{name}_seconds_bucket")]
        assert counts == sorted(counts)  # cumulative
    assert "breaker" not in render([]) and render([]).count("_count{") == 4
