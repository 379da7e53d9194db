"""Onboarding as pure data: each host's outcome, the burn-in tier it runs, which firmware findings wait for the run,
the gates a host in service passed and the launch that follows. No I/O: day2/onboard_steps.py acts on these,
provision onboard calls it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioner.model import Fleet

IN_SERVICE = "/etc/provisioner/in-service"
BURNIN_TIERS = ("quick", "standard", "soak")
#: seconds a burn-in tier may take on onboarding
BURNIN_TIMEOUT = {"quick": 600.0, "standard": 3600.0, "soak": 43200.0}


@dataclass
class Outcome:
    host: str
    in_service: bool = False
    stage: str | None = None  # where it failed: power, firmware, preflight, run, health, burn-in, mark
    powered_on: bool = False  # its BMC powered it on first
    problems: list[str] = field(default_factory=list)
    clusters: list[str] = field(default_factory=list)
    marked: bool | None = None  # the in-service file was written/removed on the host
    passed: list[str] = field(default_factory=list)  # the gates a host in service went through
    launch: str | None = None  # vLLM launch after the mark: ok, failed, or None (not run: no cluster / skipped)
    launch_problems: list[str] = field(default_factory=list)
    lifecycle: str | None = None  # its state in the ledger after onboarding (None: the ledger could not be written)
    burnin: str | None = None  # the burn-in tier it passed in this onboarding (None: none ran or it failed)

    def fail(self, stage: str, problems: list[str]) -> None:
        self.stage, self.problems = stage, problems

    def line(self) -> str:
        if self.in_service:
            text = f"{self.host}: IN SERVICE ({', '.join(self.passed)} passed; {IN_SERVICE} written)"
            if self.launch == "ok":
                text += f"; vLLM launched: {', '.join(self.clusters)}"
            elif self.launch == "failed":
                text += f"; vLLM launch FAILED: {'; '.join(self.launch_problems) or 'failed'}"
            return text
        why = "; ".join(self.problems) or "failed"
        cl = f"; left out of the launch of {', '.join(self.clusters)}" if self.clusters else ""
        return f"{self.host}: LEFT OUT at {self.stage}: {why}{cl}"


def burnin_tiers(fleet: Fleet, hosts: Iterable[str]) -> dict[str, list[str]]:
    """{tier: hosts} for the onboarding burn-in: each host's `burnin_onboard_tier` (default standard; an unknown
    value is standard; off: none)."""
    tiers: dict[str, list[str]] = {}
    for h in hosts:
        tier = str(fleet.hosts[h].vars.get("burnin_onboard_tier", "standard")).strip().lower()
        if tier != "off":
            tiers.setdefault(tier if tier in BURNIN_TIERS else "standard", []).append(h)
    return tiers


def unburnt(fleet: Fleet, out: Mapping[str, Outcome]) -> None:
    """With the burn-in gate on (the default), a host that came through every other stage but ran no burn-in
    (`burnin_onboard_tier: off`) is left out at `burn-in`: in-service needs a passed tier (docs/burn-in.md)."""
    from provisioner.day2.lifecycle import burnin_gate_on

    for h, o in out.items():
        if o.stage is None and o.burnin is None and burnin_gate_on(fleet.hosts[h].vars.get("burnin_gate", True)):
            o.fail("burn-in", ["burnin_onboard_tier is off and burnin_gate is on: in-service needs a passed burn-in "
                               "(set burnin_onboard_tier: quick, or burnin_gate: false to weaken acceptance)"])


def check_line(r: Mapping[str, Any], *, message: bool = True) -> str:
    """A failed burn-in check as one line: `check gpuN [CODE]: message`."""
    gpu = "" if r.get("gpu") is None else f" gpu{r['gpu']}"
    code = f" [{r['code']}]" if r.get("code") else ""
    return f"{r['check']}{gpu}{code}" + (f": {r['message']}" if message else "")


def before_the_run(findings: Iterable[Any], node_components: Sequence[str]) -> list[Any]:
    """The firmware findings that fail a host before its run: a bare node has no nvidia-smi yet, so what it cannot
    report of its own components (FW011) is judged after the run."""
    return [f for f in findings if not (f.code == "FW011" and f.component in node_components)]


def stages(out_of_band: Sequence[str], *, run: bool, node_firmware: bool, burn_in: bool) -> list[str]:
    """The gates a host in service went through, in order."""
    return [*out_of_band, "preflight"] + (["run"] if run else []) + (["node firmware"] if node_firmware else []) + \
        ["health"] + (["burn-in"] if burn_in else [])


def mark_note(now: str, passed: list[str]) -> dict[str, Any]:
    """What the in-service file on the host says."""
    return {"since": now, "by": "provision onboard", "passed": passed}


def launch_targets(fleet: Fleet, in_service: list[str]) -> list[str]:
    """Hosts of the vLLM launch after onboarding: every member of each cluster that has an onboarded host in
    service (a cluster launches whole; the vllm_launch role refuses it when a member has no mark)."""
    out: list[str] = []
    for h in in_service:
        for c in fleet.cluster_of(h):
            for m in fleet.clusters[c].members:
                if m not in out:
                    out.append(m)
    return out


def launched_clusters(out: Mapping[str, Outcome]) -> list[str]:
    """Clusters the onboarding launched (an onboarded member reports `launch == "ok"`), in first-seen order."""
    names: list[str] = []
    for o in out.values():
        if o.launch == "ok":
            names += [c for c in o.clusters if c not in names]
    return names


def judge_run(out: Mapping[str, Outcome], hosts: Iterable[str], result: Any) -> None:
    """Fail each of `hosts` the provisioning run (a RunResult) did not bring through (stage run)."""
    for h in hosts:
        hr = result.hosts.get(h)
        state = hr.state if hr is not None else "not_run"
        if result.error or state in ("failed", "unreachable", "not_run"):
            fails = [f"{f.task}: {f.message[:200]}" for f in result.failures if f.host == h]
            out[h].fail("run", fails or [result.error or f"host {state} in the provisioning run"])


def judge_launch(out: Mapping[str, Outcome], fleet: Fleet, result: Any) -> None:
    """Each onboarded host in service: its clusters' vLLM launch (a RunResult) ok, failed (with why), or not run
    (the playbook has no vllm-tagged task for the host, e.g. --playbook health.yml)."""
    for o in out.values():
        if not (o.in_service and o.clusters):
            continue
        members = {m for c in o.clusters for m in fleet.clusters[c].members}
        fails = [f"{f.host}: {f.task}: {f.message[:300]}" for f in result.failures if f.host in members]
        bad = [m for m in members
               if (hr := result.hosts.get(m)) is not None and hr.state in ("failed", "unreachable", "not_run")]
        if result.error or fails or bad:
            o.launch = "failed"
            o.launch_problems = fails or [result.error or f"{', '.join(sorted(bad))} not launched"]
        elif o.host in result.hosts and result.hosts[o.host].ok > 0:
            o.launch = "ok"
