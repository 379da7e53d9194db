"""Human drift report: per host, each resource that differs, with the diff for files."""

from __future__ import annotations

from provisioner.reports import count
from provisioner.results import RunResult


def render(result: RunResult, *, diffs: bool = True) -> str:
    lines: list[str] = []
    if result.error:
        lines.append(f"ERROR: the drift check could not run: {result.error}")
    for name in sorted(result.hosts):
        h = result.hosts[name]
        if h.state == "unreachable":
            first = (h.unreachable_message or "").strip().splitlines()
            lines.append(f"{name}: UNREACHABLE (not checked): {first[0] if first else ''}")
            continue
        if h.failures:
            lines.append(f"{name}: CHECK FAILED (drift incomplete)")
            for f in h.failures:
                lines.append(f"  task [{f.role + ' : ' if f.role else ''}{f.task}]: {f.message.splitlines()[0]}")
        if h.drift:
            lines.append(f"{name}: {count(len(h.drift), 'resource')} drifted")
            for d in h.drift:
                lines.append(f"  {d.kind:<8} {d.resource}    (task [{d.role + ' : ' if d.role else ''}{d.task}])")
                if diffs and d.diff:
                    lines.extend("      " + ln for ln in d.diff.rstrip("\n").splitlines())
        elif not h.failures and h.state != "not_run":
            lines.append(f"{name}: no drift" + (" (probe)" if h.tier == 1 else ""))
        if h.tier == 2 and h.probe_changes:
            lines.append(f"  the probe found: {'; '.join(h.probe_changes[:5])}"
                         + (f"; ... ({len(h.probe_changes) - 5} more)" if len(h.probe_changes) > 5 else ""))
        if h.reboot_required:
            lines.append(f"  applying would require a reboot: {h.reboot_reason or 'a task said so'}")
    n_drift = len(result.drift)
    n_hosts = len({d.host for d in result.drift})
    problems = result.unreachable_hosts + result.failed_hosts
    lines.append(
        f"drift: {count(n_drift, 'resource')} on {count(n_hosts, 'host')}"
        f" of {len(result.targeted)} checked in {result.duration:.1f}s"
        + (f"; {len(problems)} host(s) could not be checked: {', '.join(sorted(problems))}" if problems else "")
    )
    if result.tiers:
        why = ", ".join(f"{k} {n}" for k, n in sorted(result.tiers.get("reasons", {}).items()))
        lines.append(f"tiers: {count(result.tiers.get('tier1', 0), 'host')} clean by the probe, "
                     f"{result.tiers.get('tier2', 0)} checked with Ansible" + (f" ({why})" if why else ""))
    lines.append(f"run dir: {result.run_dir}")
    return "\n".join(lines) + "\n"
