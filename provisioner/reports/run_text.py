"""Human summary of a `provision run` (recap table, failures, unreachable hosts, hosts that need a reboot, the retry
command)."""

from __future__ import annotations

import shlex

from provisioner.reports import count
from provisioner.results import RunResult

COLUMNS = ("ok", "changed", "failed", "unreachable", "skipped", "rescued", "ignored")
#: What an operator does about a host that needs a reboot (the health gate fails it until it rebooted).
REBOOT_FIX = ("reboot it before it serves (`provision health` fails it until then), or run again with "
              "-e provision_allow_reboot=true")


def reboot_line(host: str, reason: str | None, *, check: bool = False) -> str:
    """`REBOOT REQUIRED node01: <why>; <what to do>` (check mode: what applying would leave)."""
    head = "WOULD REQUIRE A REBOOT" if check else "REBOOT REQUIRED"
    return f"{head} {host}: {reason or 'a task said so'}" + ("" if check else f"; {REBOOT_FIX}")


def render(result: RunResult, *, quiet: bool = False) -> str:
    lines: list[str] = []
    if result.error:
        lines.append(f"ERROR: the run could not complete: {result.error}")
    if not quiet:
        width = max([len(n) for n in result.hosts] + [4])
        # a REBOOT column only when a host needs one (before BATCH, which stays the last column)
        reboot = bool(result.reboot_hosts)
        header = f"{'HOST':<{width}}  {'STATE':<11}  " + "  ".join(f"{c:>{len(c)}}" for c in COLUMNS)
        lines.append(header + ("  REBOOT  " if reboot else "") + "  BATCH")
        for name in sorted(result.hosts):
            h = result.hosts[name]
            row = f"{name:<{width}}  {h.state:<11}  " + "  ".join(f"{getattr(h, c):>{len(c)}}" for c in COLUMNS)
            if reboot:
                row += f"  {'required' if h.reboot_required else '-':<8}"
            lines.append(row + f"  {h.batch if h.batch is not None else '-':>5}")
    if result.check:
        for d in result.drift:
            where = f"{d.role} : {d.task}" if d.role else d.task
            lines.append(f"WOULD CHANGE {d.host}: {d.kind} {d.resource} (TASK [{where}])")
            if d.diff and not quiet:
                lines.extend("      " + ln for ln in d.diff.rstrip("\n").splitlines())
    for f in result.failures:
        where = f"{f.role} : {f.task}" if f.role else f.task
        msg = f.message.replace("\n", "\n      ")
        lines.append(f"FAILED {f.host}: TASK [{where}]\n      {msg}")
    for name in result.unreachable_hosts:
        msg = (result.hosts[name].unreachable_message or "").replace("\n", "\n      ")
        lines.append(f"UNREACHABLE {name}: {msg}")
    for name in result.reboot_hosts:
        lines.append(reboot_line(name, result.hosts[name].reboot_reason, check=result.check))
    if result.aborted and result.not_run_hosts:
        lines.append("NOT RUN (the rollout stopped before reaching them): " + ", ".join(result.not_run_hosts))
    t = result.totals()
    lines.append(
        f"{count(len(result.targeted), 'host')} in {result.duration:.1f}s: {len(result.failed_hosts)} failed, "
        f"{len(result.unreachable_hosts)} unreachable, {count(t['changed'], 'change')}"
        + (f", {len(result.not_run_hosts)} not run" if result.not_run_hosts else "")
        + (f", {len(result.reboot_hosts)} {'that would need' if result.check else 'needing'} a reboot"
           if result.reboot_hosts else "")
        + ("; rollout stopped (--max-fail-percent / all hosts of a batch failed)" if result.aborted else "")
    )
    if result.retry_file:
        lines.append(f"retry: provision {result.command} {shlex.quote(result.inventory)} --limit @{result.retry_file}")
    lines.append(f"run dir: {result.run_dir}")
    return "\n".join(lines) + "\n"
