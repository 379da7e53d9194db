"""Drift in Prometheus text exposition format, for node_exporter's textfile collector.

Series: `provisioner_drift_resources{host,role}` (0 for every role that ran clean on a host, so series stay stable),
`provisioner_drift_last_run_timestamp_seconds`, `provisioner_host_unreachable{host}`, plus
`provisioner_drift_check_failed{host}`, `provisioner_drift_reboot_required{host}` (1: applying would leave the host
needing a reboot) and `provisioner_drift_last_run_duration_seconds`.
"""

from __future__ import annotations

from provisioner.reports.textfile import escape_label as _esc
from provisioner.results import RunResult


def render(result: RunResult, *, now: float | None = None) -> str:
    ts = now if now is not None else result.started + result.duration
    out: list[str] = []
    out.append("# HELP provisioner_drift_resources Resources that differ from the playbooks (last drift check).")
    out.append("# TYPE provisioner_drift_resources gauge")
    for name in sorted(result.hosts):
        h = result.hosts[name]
        if h.unreachable or h.state == "not_run":
            continue
        counts: dict[str, int] = {r or "none": 0 for r in h.roles}
        for d in h.drift:
            counts[d.role or "none"] = counts.get(d.role or "none", 0) + 1
        if not counts:
            counts["none"] = 0
        for role in sorted(counts):
            out.append(f'provisioner_drift_resources{{host="{_esc(name)}",role="{_esc(role)}"}} {counts[role]}')
    out.append("# HELP provisioner_host_unreachable 1 when the host could not be reached by the last drift check.")
    out.append("# TYPE provisioner_host_unreachable gauge")
    for name in sorted(result.hosts):
        out.append(f'provisioner_host_unreachable{{host="{_esc(name)}"}} {1 if result.hosts[name].unreachable else 0}')
    out.append("# HELP provisioner_drift_check_failed 1 when a check task failed on the host (drift incomplete).")
    out.append("# TYPE provisioner_drift_check_failed gauge")
    for name in sorted(result.hosts):
        h = result.hosts[name]
        failed = 1 if h.failed and not h.unreachable else 0
        out.append(f'provisioner_drift_check_failed{{host="{_esc(name)}"}} {failed}')
    out.append("# HELP provisioner_drift_reboot_required 1 when applying the playbooks would require a reboot of the "
               "host (the NVIDIA kernel module changes).")
    out.append("# TYPE provisioner_drift_reboot_required gauge")
    for name in sorted(result.hosts):
        h = result.hosts[name]
        if not h.unreachable and h.state != "not_run":
            out.append(f'provisioner_drift_reboot_required{{host="{_esc(name)}"}} {1 if h.reboot_required else 0}')
    if any(h.tier for h in result.hosts.values()):
        out.append("# HELP provisioner_drift_tier The drift tier that checked the host: 1 the probe alone, 2 Ansible.")
        out.append("# TYPE provisioner_drift_tier gauge")
        for name in sorted(result.hosts):
            if result.hosts[name].tier:
                out.append(f'provisioner_drift_tier{{host="{_esc(name)}"}} {result.hosts[name].tier}')
    out.append("# HELP provisioner_drift_last_run_timestamp_seconds When the last drift check finished (Unix time).")
    out.append("# TYPE provisioner_drift_last_run_timestamp_seconds gauge")
    out.append(f"provisioner_drift_last_run_timestamp_seconds {ts:.3f}")
    out.append("# HELP provisioner_drift_last_run_duration_seconds How long the last drift check ran.")
    out.append("# TYPE provisioner_drift_last_run_duration_seconds gauge")
    out.append(f"provisioner_drift_last_run_duration_seconds {result.duration:.3f}")
    return "\n".join(out) + "\n"
