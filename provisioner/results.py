"""Result objects of an Ansible execution (`provision run`, `provision drift`); every report takes these.

Built by `provisioner.runner` from ansible-runner events as they arrive. Plain dataclasses, no Ansible imports, so
reports and tests can build them directly. Secrets never reach them: Ansible censors `no_log` results before the
events are emitted, and the runner keeps only the censored text (see `runner.CENSORED`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: Host states, in reporting order.
HOST_STATES = ("failed", "unreachable", "not_run", "changed", "ok")


@dataclass
class TaskFailure:
    """One failed task on one host (ignored errors are not failures)."""

    host: str
    task: str
    message: str
    role: str | None = None
    play: str | None = None
    action: str | None = None


@dataclass
class DriftItem:
    """One resource on one host that differs from what the playbooks would set (a changed task in check mode).

    `kind` is `file`, `package`, `service` or `other`; `resource` names it (a path, a package name, a unit name, or
    the task name when nothing better is known); `diff` is a unified diff for files (None when Ansible gave none, e.g.
    a `no_log` task: its content is never shown).
    """

    host: str
    task: str
    kind: str
    resource: str
    role: str | None = None
    action: str | None = None
    diff: str | None = None
    play: str | None = None
    tier: int | None = None  # two-tier drift: 1 = the probe found this resource changed too, 2 = only Ansible did

    @property
    def key(self) -> str:
        """Stable identifier of the resource on a host, e.g. `file:/etc/nccl.conf`."""
        return f"{self.kind}:{self.resource}"


@dataclass
class HostResult:
    """Per-host counts folded from the events, plus what went wrong and (check mode) what differs."""

    name: str
    ok: int = 0  # includes changed, as Ansible's recap counts
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0
    failures: list[TaskFailure] = field(default_factory=list)
    unreachable_message: str | None = None
    drift: list[DriftItem] = field(default_factory=list)
    batch: int | None = None  # serial batch number (1-based) the host ran in
    roles: list[str] = field(default_factory=list)  # roles that ran tasks on the host ("" for play-level tasks)
    seen: bool = False  # any event for this host arrived
    stopped: bool = False  # the rollout stopped (max fail percentage) before the play that stopped reached this host
    # a task set a `<name>_reboot_required: true` fact (the nvidia_driver handlers: the kernel module changed and no
    # reboot was allowed); the host's state is unchanged (a run's exit code too), the reports say it per host
    reboot_required: bool = False
    reboot_reason: str | None = None  # the matching `<name>_reboot_reason` fact, else who set the flag
    rebooted: bool = False  # ansible.builtin.reboot rebooted the host in this run (not in check mode)
    # two-tier drift: 1 = the probe matched the recorded state (clean, Ansible did not run), 2 = Ansible checked it
    # (tier_reason says why); probe_changes = what the probe found against the record
    tier: int | None = None
    tier_reason: str | None = None
    probe_changes: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        if not self.seen or self.stopped:
            return "not_run"
        if self.changed:
            return "changed"
        return "ok"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("seen")
        d.pop("stopped")
        d["state"] = self.state
        return d


@dataclass
class RunResult:
    """Everything one `provision run` / `provision drift` execution produced."""

    command: str  # "run" or "drift"
    inventory: str
    playbook: str
    run_dir: str
    artifact_dir: str
    started: float  # epoch seconds
    duration: float = 0.0
    check: bool = False
    limit: str | None = None
    tags: str | None = None
    skip_tags: str | None = None
    serial: str | None = None
    max_fail_percent: int | None = None
    forks: int | None = None
    status: str = "unstarted"  # ansible-runner status: successful, failed, timeout, canceled, error
    rc: int | None = None  # ansible-playbook's exit code
    hosts: dict[str, HostResult] = field(default_factory=dict)
    targeted: list[str] = field(default_factory=list)  # hosts the inventory + --limit selected
    # every play start, in order: {"play": name, "batch": n (1-based; >1 only with --serial), "hosts": [...]}
    batches: list[dict[str, Any]] = field(default_factory=list)
    aborted: bool = False  # Ansible stopped early ("no more hosts left": all failed, or --max-fail-percent hit)
    retry_file: str | None = None
    error: str | None = None  # why the run could not happen at all (ansible error before any host ran)
    # a sharded run (`--exec-node`): one entry per execution node (node, hosts, status, rc, duration, error, ...)
    shards: list[dict[str, Any]] = field(default_factory=list)
    # a two-tier drift: {"tier1": n, "tier2": n, "reasons": {reason kind: n}, "probe_seconds": s}; {} otherwise
    tiers: dict[str, Any] = field(default_factory=dict)

    # -- views ---------------------------------------------------------------------------------------------
    def host(self, name: str) -> HostResult:
        h = self.hosts.get(name)
        if h is None:
            h = self.hosts[name] = HostResult(name=name)
        return h

    def hosts_in(self, state: str) -> list[str]:
        return sorted(n for n, h in self.hosts.items() if h.state == state)

    @property
    def failed_hosts(self) -> list[str]:
        return self.hosts_in("failed")

    @property
    def unreachable_hosts(self) -> list[str]:
        return self.hosts_in("unreachable")

    @property
    def not_run_hosts(self) -> list[str]:
        return self.hosts_in("not_run")

    @property
    def retry_hosts(self) -> list[str]:
        """Hosts to run again: failed, unreachable, or never reached (a rollout stopped by --max-fail-percent)."""
        retry = set(self.failed_hosts) | set(self.unreachable_hosts)
        if self.aborted:  # hosts never reached because the rollout stopped; otherwise no play targets them
            retry |= set(self.not_run_hosts)
        return sorted(retry)

    @property
    def reboot_hosts(self) -> list[str]:
        """Hosts a task said need a reboot (the NVIDIA kernel module changed and provision_allow_reboot was false)."""
        return sorted(n for n, h in self.hosts.items() if h.reboot_required)

    @property
    def drift(self) -> list[DriftItem]:
        return [d for n in sorted(self.hosts) for d in self.hosts[n].drift]

    @property
    def failures(self) -> list[TaskFailure]:
        return [f for n in sorted(self.hosts) for f in self.hosts[n].failures]

    @property
    def succeeded(self) -> bool:
        """All targeted hosts ran, none failed or was unreachable, and Ansible itself did not error."""
        return self.error is None and not self.retry_hosts and self.rc == 0 and self.status == "successful"

    def totals(self) -> dict[str, int]:
        keys = ("ok", "changed", "failed", "unreachable", "skipped", "rescued", "ignored")
        return {k: sum(getattr(h, k) for h in self.hosts.values()) for k in keys}

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "inventory": self.inventory,
            "playbook": self.playbook,
            "check": self.check,
            "limit": self.limit,
            "tags": self.tags,
            "skip_tags": self.skip_tags,
            "serial": self.serial,
            "max_fail_percent": self.max_fail_percent,
            "forks": self.forks,
            "started": self.started,
            "duration": round(self.duration, 3),
            "status": self.status,
            "rc": self.rc,
            "succeeded": self.succeeded,
            "error": self.error,
            "run_dir": self.run_dir,
            "artifact_dir": self.artifact_dir,
            "retry_file": self.retry_file,
            "totals": self.totals(),
            "failed_hosts": self.failed_hosts,
            "unreachable_hosts": self.unreachable_hosts,
            "not_run_hosts": self.not_run_hosts,
            "reboot_required_hosts": self.reboot_hosts,
            "aborted": self.aborted,
            "batches": self.batches,
            "hosts": {n: self.hosts[n].to_dict() for n in sorted(self.hosts)},
            "shards": self.shards,
            "tiers": self.tiers,
        }
