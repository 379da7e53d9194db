"""The remediation steps on a node: GPU reset (only when no process holds a GPU; the holders are named), reboot
over SSH, power cycle through the BMC, each waiting for the node to answer again (a new boot id, systemd done
booting)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from provisioner.model import Fleet
from provisioner.probes.ssh import as_root, run_one, target_for

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
#: the suite's own NVIDIA daemons (their /proc comm, 15 characters at most): they keep the device files open by
#: design and come back with the host, so they never count as a workload holding the GPU
MANAGED_DAEMONS = ("nvidia-persiste", "nv-fabricmanage", "nvidia-imex", "nv-hostengine")


def holders_script(dev: str = "/dev") -> str:
    """Shell that prints `pid device comm` for every process with an NVIDIA device file open (a GPU, nvidiactl,
    nvidia-uvm*, nvidia-modeset, nvidia-caps/*) other than MANAGED_DAEMONS, one line per process. One `find` reads
    every /proc/*/fd link (needs root); only the matches cost a fork more."""
    skip = "|".join(MANAGED_DAEMONS)
    kinds = ("nvidia[0-9]*", "nvidiactl", "nvidia-uvm*", "nvidia-modeset", "nvidia-caps/*")
    match = " -o ".join(f"-lname '{dev}/{k}'" for k in kinds)
    return (f"find /proc/[0-9]*/fd -mindepth 1 -maxdepth 1 \\( {match} \\) -printf '%h %l\\n' 2>/dev/null "
            "| awk '{sub(/^\\/proc\\//, \"\", $1); sub(/\\/fd$/, \"\", $1)} !seen[$1]++' "
            '| while read -r p d; do c=$(cat "/proc/$p/comm" 2>/dev/null); case $c in ' + skip + ') continue;; esac; '
            'echo "$p $d $c"; done')


HOLDERS = holders_script()


def holder_names(lines: str) -> list[str]:
    """`pid N (comm) on DEVICE` for each line of holders_script's output."""
    out = []
    for ln in lines.strip().splitlines():
        pid, dev, comm = (ln.split(" ", 2) + ["", ""])[:3]
        out.append(f"pid {pid} ({comm or '?'}) on {dev}")
    return out


HELD = 3  # gpu_reset's exit status when a process holds a GPU


@dataclass(frozen=True)
class StepResult:
    ok: bool
    detail: str


def gpu_reset_command(user: str | None) -> str:
    script = (f'h=$({HOLDERS}); if [ -n "$h" ]; then echo "$h" | sed "s/^/held: /"; exit {HELD}; fi; '
              "nvidia-smi --gpu-reset")
    return as_root(script, user)


def gpu_reset(fleet: Fleet, host: str, timeout: float = 300.0) -> StepResult:
    t = target_for(fleet.hosts[host])
    r = run_one(t, gpu_reset_command(t.user), timeout=timeout)
    if not r.ok:
        return StepResult(False, f"unreachable: {r.error}")
    if r.rc == HELD:
        held = holder_names("\n".join(ln.removeprefix("held: ") for ln in r.stdout.splitlines()
                                      if ln.startswith("held: ")))
        return StepResult(False, f"GPU held by {', '.join(held)}: not reset (stop it, or reboot)")
    if r.rc != 0:
        tail = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()[-1][:200]
        return StepResult(False, f"nvidia-smi --gpu-reset exited {r.rc}: {tail}")
    return StepResult(True, "GPUs reset")


def _boot_id(fleet: Fleet, host: str) -> str | None:
    r = run_one(target_for(fleet.hosts[host]), BOOT_ID, timeout=15.0)
    return r.stdout.strip() if r.ok and r.rc == 0 and r.stdout.strip() else None


#: How long one poll lets systemd finish booting before it answers (`--wait` blocks while the state is starting).
READY_WAIT = 60
#: systemd states that mean booted: `degraded` is up with a failed unit (the health gate judges those).
READY_STATES = ("running", "degraded")


def back_command(wait: int = READY_WAIT) -> str:
    """One exec: the boot id, then systemd's state once booting is over (at most `wait` s: `--wait` blocks while it
    is initializing or starting), as the driver role's reboot handler tests it."""
    return (f"{BOOT_ID}; timeout {int(wait)} systemctl is-system-running --wait 2>/dev/null; true")


def not_back(before: str | None, out: str | None) -> str | None:
    """Why a node that answered `back_command` with `out` is not back yet (None: it is): the same boot id as before
    the reboot, or a new one with systemd not running yet (a new boot id alone is a host still starting its
    services: sshd answers before them). Pure."""
    if out is None:
        return "not answering over SSH"
    lines = [ln.strip() for ln in out.strip().splitlines()]
    boot = lines[0] if lines else ""
    state = lines[1] if len(lines) > 1 else ""
    if not boot:
        return "no boot id"
    if boot == before:
        return "not rebooted yet (same boot id)"
    if state not in READY_STATES:
        return f"rebooted, but systemd is {state or 'still starting'}"
    return None


def wait_back(fleet: Fleet, host: str, before: str | None, timeout: float, poll: float = 5.0) -> StepResult:
    """Until the node answers over SSH with a boot id other than `before` and systemd says it finished booting
    (running or degraded), within `timeout`."""
    deadline = time.monotonic() + timeout
    why = "not answering over SSH"
    t = target_for(fleet.hosts[host])
    while time.monotonic() < deadline:
        wait = max(1, min(READY_WAIT, int(deadline - time.monotonic())))
        r = run_one(t, back_command(wait), timeout=wait + 15.0)
        why = not_back(before, r.stdout if r.ok and r.rc == 0 else None) or ""
        if not why:
            return StepResult(True, "back after a reboot")
        time.sleep(poll)
    return StepResult(False, f"not back within {timeout:g}s: {why}")


def reboot(fleet: Fleet, host: str, timeout: float = 900.0) -> StepResult:
    before = _boot_id(fleet, host)
    if before is None:
        return StepResult(False, "unreachable before the reboot: not rebooted (power_cycle is the next step)")
    t = target_for(fleet.hosts[host])
    run_one(t, as_root("systemctl reboot", t.user), timeout=30.0)  # the connection may drop: judged by the boot id
    return wait_back(fleet, host, before, timeout)


def power_cycle(fleet: Fleet, host: str, timeout: float = 900.0) -> StepResult:
    from provisioner.bmc.config import BmcConfigError
    from provisioner.bmc.redfish import Bmc, BmcError
    from provisioner.bmc.session import bmc_target

    before = _boot_id(fleet, host)
    try:
        Bmc(bmc_target(fleet, host)).power("cycle", timeout=min(timeout, 300.0))
    except (BmcConfigError, BmcError) as exc:
        return StepResult(False, f"BMC: {exc}")
    return wait_back(fleet, host, before, timeout)


STEP_FUNCS = {"gpu_reset": gpu_reset, "reboot": reboot, "power_cycle": power_cycle}
