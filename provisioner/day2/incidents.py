"""Incidents measured, as pure data: each incident's time to detect, drain and return, the time between one node's
incidents, and their distributions (p50/p99). The incidents come in as plain records (the ledger's `Incident`, or
anything with its attributes: id, host, cluster, source, cause, status and the timestamps signal, detected,
quarantined, drained, returned, replaced); provisioner/reports/incidents_prometheus.py exposes the histograms."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: histogram buckets, seconds: a drain within a minute, a return within minutes, incidents days apart
BUCKETS: tuple[float, ...] = (5, 10, 30, 60, 120, 300, 600, 1800, 3600, 21600, 86400, 604800)
METRICS = {
    "detect": ("provisioner_incident_detect_seconds", "Signal seen to the loop's decision, per incident."),
    "drain": ("provisioner_incident_drain_seconds", "Decision to the node's cluster out of service, per incident."),
    "return": ("provisioner_incident_return_seconds", "Decision to the node back in service, per incident."),
    "between": ("provisioner_incident_between_seconds", "Time between two incidents of one node (MTBI)."),
}


def _d(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(0.0, b - a)


def row(i: Any, previous: float | None = None) -> dict[str, Any]:
    """One incident as a plain dict with its durations (None: not reached yet); `previous`: when the node's
    previous incident was detected."""
    return {"id": i.id, "host": i.host, "cluster": i.cluster, "source": i.source, "cause": i.cause,
            "status": i.status, "signal": i.signal, "detected": i.detected, "quarantined": i.quarantined,
            "drained": i.drained, "returned": i.returned, "replaced": i.replaced,
            "detect_s": _d(i.signal, i.detected), "drain_s": _d(i.detected, i.drained),
            "return_s": _d(i.detected, i.returned), "since_previous_s": _d(previous, i.detected)}


def rows(incidents: Iterable[Any]) -> list[dict[str, Any]]:
    """Every incident (oldest first) with its durations and the time since its node's previous incident."""
    last: dict[str, float] = {}
    out = []
    for i in sorted(incidents, key=lambda x: (x.detected, x.id)):
        out.append(row(i, last.get(i.host)))
        last[i.host] = i.detected
    return out


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of `values`; None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


def distributions(table: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """{detect|drain|return|between: {count, p50, p99, max, values}} over `rows()`."""
    keys = {"detect": "detect_s", "drain": "drain_s", "return": "return_s", "between": "since_previous_s"}
    out = {}
    for name, k in keys.items():
        vals = [float(r[k]) for r in table if r.get(k) is not None]
        out[name] = {"count": len(vals), "p50": quantile(vals, 0.5), "p99": quantile(vals, 0.99),
                     "max": max(vals) if vals else None, "values": vals}
    return out


def per_node(table: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """{host: {incidents, open, mean_between_s}}."""
    out: dict[str, dict[str, Any]] = {}
    for r in table:
        n = out.setdefault(r["host"], {"incidents": 0, "open": 0, "between": []})
        n["incidents"] += 1
        n["open"] += r["status"] == "open"
        if r["since_previous_s"] is not None:
            n["between"].append(r["since_previous_s"])
    return {h: {"incidents": n["incidents"], "open": n["open"],
                "mean_between_s": (sum(n["between"]) / len(n["between"])) if n["between"] else None}
            for h, n in sorted(out.items())}
