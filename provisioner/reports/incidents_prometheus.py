"""The incidents' histograms (time to detect, drain, return, between incidents), the open incidents and the
remediation breaker's state in the Prometheus text exposition format: what the alert receiver serves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from provisioner.day2.incidents import BUCKETS, METRICS, distributions
from provisioner.reports.textfile import escape_label


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def render(table: Sequence[Mapping[str, Any]], *, site: str = "", open_incidents: int | None = None,
               breaker_open: bool | None = None, recommended: int | None = None) -> str:
    """The incidents' histograms in the Prometheus text exposition format (version 0.0.4), plus the number of open
    incidents, the breaker's state and the recommendations waiting for --approve when given. Labels are escaped;
    values are numbers only."""
    lbl = f'site="{escape_label(site)}"'
    lines: list[str] = []
    dist = distributions(table)
    for name, (metric, help_) in METRICS.items():
        vals = dist[name]["values"]
        lines += [f"# HELP {metric} {help_}", f"# TYPE {metric} histogram"]
        for b in BUCKETS:
            lines.append(f'{metric}_bucket{{{lbl},le="{_fmt(b)}"}} {sum(1 for v in vals if v <= b)}')
        lines.append(f'{metric}_bucket{{{lbl},le="+Inf"}} {len(vals)}')
        lines.append(f"{metric}_sum{{{lbl}}} {_fmt(round(sum(vals), 3))}")
        lines.append(f"{metric}_count{{{lbl}}} {len(vals)}")
    if open_incidents is not None:
        lines += ["# HELP provisioner_incidents_open Incidents not returned nor marked for replacement.",
                  "# TYPE provisioner_incidents_open gauge", f"provisioner_incidents_open{{{lbl}}} {open_incidents}"]
    if breaker_open is not None:
        lines += ["# HELP provisioner_remediation_breaker_open 1 while the remediation circuit breaker is open.",
                  "# TYPE provisioner_remediation_breaker_open gauge",
                  f"provisioner_remediation_breaker_open{{{lbl}}} {int(breaker_open)}"]
    if recommended is not None:
        lines += ["# HELP provisioner_remediation_recommended Recommended actions waiting for --approve.",
                  "# TYPE provisioner_remediation_recommended gauge",
                  f"provisioner_remediation_recommended{{{lbl}}} {recommended}"]
    return "\n".join(lines) + "\n"
