"""Execute playbooks through ansible-runner's Python API and fold the events into a `RunResult`.

- A fresh run directory per execution (`.runs/<UTC timestamp>-<command>/` in a checkout, `runs/` of the per-user state
  directory when installed: provisioner/paths.py; printed by the CLI) is ansible-runner's
  private data dir, so options ansible-runner writes into `env/` are never reused by a later run; artifacts
  (`artifacts/ansible/`: stdout, job_events, status, rc) stay there, with our `result.json` and `retry` file beside.
- Counts per host come from the event handler as events arrive (ansible-runner's `runner.stats` re-reads every event
  file); the final `playbook_on_stats` event, also folded here, is authoritative for the recap numbers (it knows about
  rescued blocks).
- Check mode (`drift`) adds `--check --diff`; each changed result becomes a `DriftItem` (handlers excluded: they only
  follow a drifted resource).
- The project's `ansible.cfg` is used explicitly (`ANSIBLE_CONFIG`), and the two settings ansible-runner would override
  silently are put back: host key checking stays on, and the fact cache stays ours (`.cache/facts.d/<inventory>`), not per run.
- The data root is the Ansible collection provisioner.gpu: the run directory gets `collections/` linking it
  (`paths.link_collection`), first on ANSIBLE_COLLECTIONS_PATH, so the roles' FQCN module and filters resolve in a
  checkout and in an installed wheel alike.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol

from provisioner import paths
from provisioner.errors import UsageError
from provisioner.results import DriftItem, HostResult, RunResult, TaskFailure

ANSIBLE_CFG = paths.ANSIBLE_CFG
#: Run directories kept per command; older ones are pruned (override: PROVISION_KEEP_RUNS).
KEEP_RUNS = 50
#: Upper bound for forks sized to the inventory (override: PROVISION_MAX_FORKS).
MAX_FORKS = 50
#: Ansible's own placeholder for a `no_log` result; we never show anything else for such a task.
CENSORED = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"
#: Longest failure message kept per task (the artifacts hold the rest).
MAX_MESSAGE = 2000

FILE_ACTIONS = {
    "template", "copy", "file", "lineinfile", "blockinfile", "replace", "ini_file", "assemble", "get_url",
    "unarchive", "known_hosts", "authorized_key", "archive",
}
PACKAGE_ACTIONS = {"apt", "package", "dpkg_selections", "pip", "dnf", "dnf5", "yum", "apt_key", "apt_repository",
                   "deb822_repository", "rpm_key", "yum_repository", "provisioner_apt"}
SERVICE_ACTIONS = {"systemd", "systemd_service", "service", "sysvinit"}


# ----------------------------------------------------------------------------------------------------------------
# progress
class Progress(Protocol):
    def start(self, result: RunResult) -> None: ...

    def play(self, name: str, batch: int) -> None: ...

    def task(self, name: str, role: str | None, handler: bool) -> None: ...

    def host_event(self, host: str, kind: str, message: str | None = None) -> None: ...

    def finish(self, result: RunResult) -> None: ...


class NullProgress:
    def start(self, result: RunResult) -> None:
        pass

    def play(self, name: str, batch: int) -> None:
        pass

    def task(self, name: str, role: str | None, handler: bool) -> None:
        pass

    def host_event(self, host: str, kind: str, message: str | None = None) -> None:
        pass

    def finish(self, result: RunResult) -> None:
        pass


@dataclass
class _View:
    """What both progress displays show."""

    result: RunResult | None = None
    play_name: str = ""
    batch: int = 1
    task_name: str = ""
    task_done: set[str] = field(default_factory=set)
    tasks: int = 0
    t0: float = field(default_factory=time.monotonic)

    def counts(self) -> tuple[int, int, int, int]:
        r = self.result
        if r is None:
            return 0, 0, 0, 0
        reached = sum(1 for h in r.hosts.values() if h.seen)
        failed = sum(1 for h in r.hosts.values() if h.failed and not h.unreachable)
        unreach = sum(1 for h in r.hosts.values() if h.unreachable)
        return len(r.targeted), reached, failed, unreach


class LineProgress(_View):
    """Plain progress lines (logs, CI, pipes): plays, batches, tasks, failures as they happen."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__()
        self.stream = stream or sys.stderr

    def _say(self, text: str) -> None:
        el = time.monotonic() - self.t0
        print(f"[{el:7.1f}s] {text}", file=self.stream, flush=True)

    def start(self, result: RunResult) -> None:
        self.result = result
        self.t0 = time.monotonic()
        mode = "check (drift)" if result.check else "apply"
        self._say(f"{result.command}: {len(result.targeted)} hosts, forks {result.forks}, {mode}; run dir {result.run_dir}")

    def play(self, name: str, batch: int) -> None:
        self.play_name, self.batch = name, batch
        suffix = f" batch {batch}" if batch > 1 or (self.result and self.result.serial) else ""
        self._say(f"PLAY [{name}]{suffix}")

    def task(self, name: str, role: str | None, handler: bool) -> None:
        self.tasks += 1
        kind = "HANDLER" if handler else "TASK"
        self._say(f"{kind} [{role + ' : ' if role else ''}{name}]")

    def host_event(self, host: str, kind: str, message: str | None = None) -> None:
        if kind in ("failed", "unreachable"):
            msg = (message or "").splitlines()[0][:200] if message else ""
            self._say(f"  {kind.upper()}: {host}: {msg}")

    def finish(self, result: RunResult) -> None:
        t, reached, failed, unreach = self.counts()
        self._say(f"done in {result.duration:.1f}s: {t} hosts, {failed} failed, {unreach} unreachable")


class LiveProgress(_View):
    """rich live panel on a terminal: play, batch, task, hosts done/failed/unreachable, elapsed."""

    def __init__(self, console: Any = None) -> None:
        super().__init__()
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.live: Any = None

    def _render(self) -> Any:
        from rich.table import Table

        t, reached, failed, unreach = self.counts()
        el = time.monotonic() - self.t0
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("play", f"{self.play_name}" + (f"  [cyan]batch {self.batch}[/]" if self.batch > 1 or (
            self.result and self.result.serial) else ""))
        grid.add_row("task", f"{self.task_name}  ({len(self.task_done)} hosts done)")
        grid.add_row("hosts", f"{t} targeted · {reached} reached · [red]{failed} failed[/] · "
                              f"[magenta]{unreach} unreachable[/]")
        grid.add_row("elapsed", f"{el:.1f}s · {self.tasks} tasks")
        return grid

    def start(self, result: RunResult) -> None:
        from rich.live import Live

        self.result = result
        self.t0 = time.monotonic()
        self.console.print(f"[bold]{result.command}[/]: {len(result.targeted)} hosts, forks {result.forks}"
                           f"{', check mode' if result.check else ''}; run dir {result.run_dir}", highlight=False)
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True,
                         get_renderable=self._render)
        self.live.start()

    def play(self, name: str, batch: int) -> None:
        self.play_name, self.batch = name, batch
        if batch > 1 or (self.result and self.result.serial):
            self.console.print(f"PLAY [{name}] [cyan]batch {batch}[/]", highlight=False)

    def task(self, name: str, role: str | None, handler: bool) -> None:
        self.tasks += 1
        self.task_name = f"{role + ' : ' if role else ''}{name}"
        self.task_done = set()

    def host_event(self, host: str, kind: str, message: str | None = None) -> None:
        self.task_done.add(host)
        if kind in ("failed", "unreachable"):
            msg = (message or "").splitlines()[0][:200] if message else ""
            self.console.print(f"  [red]{kind.upper()}[/]: {host} [{self.task_name}]: {msg}", highlight=False)

    def finish(self, result: RunResult) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def make_progress(mode: str) -> Progress:
    """`mode`: "auto" (live on a terminal, lines otherwise), "live", "lines" or "none"."""
    if mode == "none":
        return NullProgress()
    if mode == "live" or (mode == "auto" and sys.stderr.isatty()):
        return LiveProgress()
    return LineProgress()


# ----------------------------------------------------------------------------------------------------------------
# helpers
def _now_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def new_run_dir(command: str, runs_dir: str | os.PathLike[str] | None = None) -> Path:
    """A fresh, empty directory `<runs>/<UTC timestamp>-<command>[-n]/`; prunes old ones of the same command."""
    # <repo>/.runs in a checkout, the per-user state directory when installed; PROVISION_RUNS_DIR overrides
    base = Path(runs_dir) if runs_dir else paths.runs_dir()
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the run directory: {exc.strerror} (set PROVISION_STATE_DIR or "
                         "PROVISION_RUNS_DIR to a writable directory)", path=str(base)) from None
    stamp = _now_stamp()
    for n in range(1, 1000):
        d = base / (f"{stamp}-{command}" if n == 1 else f"{stamp}-{command}-{n}")
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue
        _prune(base, command, keep=int(os.environ.get("PROVISION_KEEP_RUNS", KEEP_RUNS)))
        return d
    raise RuntimeError(f"cannot create a run directory under {base}")


def _prune(base: Path, command: str, keep: int) -> None:
    if keep <= 0:
        return
    pat = re.compile(rf"^\d{{8}}T\d{{6}}Z-{re.escape(command)}(-\d+)?$")
    dirs = sorted(p for p in base.iterdir() if p.is_dir() and pat.match(p.name))
    for old in dirs[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def resolve_limit(limit: str | None) -> str | None:
    """Make `@file` parts of a --limit absolute (ansible-runner runs from its own directory)."""
    if not limit:
        return limit
    parts = []
    for part in limit.split(","):
        if part.startswith("@"):
            p = Path(part[1:]).expanduser()
            if not p.is_file():
                raise UsageError("retry/limit file not found", path=str(p))
            part = "@" + str(p.resolve())
        parts.append(part)
    return ",".join(parts)


def target_hosts(inventory: str | os.PathLike[str], limit: str | None) -> list[str]:
    """The hosts the inventory + --limit select, as ansible-playbook will see them."""
    os.environ.setdefault("ANSIBLE_LOCALHOST_WARNING", "False")
    os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_WARNING", "False")
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    try:
        inv = InventoryManager(loader=DataLoader(), sources=[str(inventory)])
        if limit:
            inv.subset(limit)
        return [h.name for h in inv.get_hosts("all")]
    except AnsibleError as exc:
        raise UsageError(f"cannot select hosts: {str(exc).strip().splitlines()[0]}", path=str(inventory)) from None


def fact_cache_dir(inventory: Path) -> Path:
    """The jsonfile fact cache of one inventory: `.cache/facts.d/<inventory dir name>-<hash of its path>` (in a
    checkout; `facts.d/` of the per-user state directory when installed: provisioner/paths.py).

    Ansible keys cached facts by inventory hostname only; two inventories that both name a host `node01` (two racks,
    two sites) must not read each other's facts."""
    import hashlib

    inv = inventory.resolve()
    digest = hashlib.sha256(str(inv).encode()).hexdigest()[:12]
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{inv.parent.name}-{inv.stem}")[:60]
    return paths.facts_dir() / f"{label}-{digest}"


def size_forks(n_hosts: int) -> int:
    cap = int(os.environ.get("PROVISION_MAX_FORKS", MAX_FORKS))
    return max(1, min(n_hosts, cap))


def _short_action(action: str | None) -> str:
    return (action or "").rsplit(".", 1)[-1]


def _kind(action: str) -> str:
    if action in FILE_ACTIONS:
        return "file"
    if action in PACKAGE_ACTIONS:
        return "package"
    if action in SERVICE_ACTIONS:
        return "service"
    return "other"


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    return json.dumps(v, indent=2, sort_keys=True, default=str) + "\n"


def render_diff(diff: Any, path: str | None = None) -> str | None:
    """Ansible's diff structure(s) as a unified diff (or apt's `prepared` text); `path` names both sides."""
    if not diff:
        return None
    items = diff if isinstance(diff, list) else [diff]
    out: list[str] = []
    for d in items:
        if not isinstance(d, dict):
            continue
        if "prepared" in d:
            out.append(str(d["prepared"]).rstrip("\n") + "\n")
            continue
        if "before" not in d and "after" not in d:
            continue
        before, after = _text(d.get("before")), _text(d.get("after"))
        if before == after:
            continue
        a = before.splitlines(keepends=True)
        b = after.splitlines(keepends=True)
        if a and not a[-1].endswith("\n"):
            a[-1] += "\n\\ No newline at end of file\n"
        if b and not b[-1].endswith("\n"):
            b[-1] += "\n\\ No newline at end of file\n"
        bh, ah = (path, path) if path else (d.get("before_header", ""), d.get("after_header", ""))
        out.extend(difflib.unified_diff(a, b, fromfile=f"before: {bh}".rstrip(": "),
                                        tofile=f"after: {ah}".rstrip(": ")))
    text = "".join(out)
    return text or None


_INST = re.compile(r"^(?:Inst|Remv) (\S+)(?: \[([^\]]+)\])?(?: \((\S+))?", re.M)


def _packages_from(res: dict[str, Any]) -> list[str]:
    """Package names apt's simulation would touch (stdout of `apt-get -s`, or the diff's `prepared` text)."""
    texts = [str(res.get("stdout") or "")]
    diff = res.get("diff")
    for d in diff if isinstance(diff, list) else [diff]:
        if isinstance(d, dict) and d.get("prepared"):
            texts.append(str(d["prepared"]))
    names: list[str] = []
    for t in texts:
        for m in _INST.finditer(t):
            if m.group(1) not in names:
                names.append(m.group(1))
    return names


def _item_label(res: dict[str, Any]) -> str | None:
    label = res.get("_ansible_item_label", res.get("item"))
    if label is None:
        return None
    if isinstance(label, dict):
        for k in ("name", "path", "dest", "unit", "package", "key"):
            if isinstance(label.get(k), str):
                return label[k]
        return json.dumps(label, sort_keys=True, default=str)
    return str(label)


def _diff_path(res: dict[str, Any]) -> str | None:
    """The managed path from a diff's headers: `before_header` is the destination; `after_header` may be the
    rendered temporary source (template in check mode), so it only counts when it is not Ansible's temp dir."""
    diff = res.get("diff")
    for k in ("before_header", "after_header"):
        for d in diff if isinstance(diff, list) else [diff]:
            h = d.get(k) if isinstance(d, dict) else None
            if isinstance(h, str) and h.startswith("/") and "/.ansible/tmp/" not in h:
                return h.split(" ", 1)[0]
    return None


def resources_of(action: str, res: dict[str, Any], task: str) -> list[tuple[str, str]]:
    """(kind, resource) pairs one changed result stands for."""
    kind = _kind(action)
    if res.get("censored"):
        return [(kind, task)]
    label = _item_label(res)
    # Our own modules (plugins/modules/provisioner_apt.py) name what drifted: [[kind, name], ...]
    own = res.get("resources")
    if action.startswith("provisioner_") and isinstance(own, list) and own:
        return [(str(k), str(r)) for k, r in own]
    if kind == "file":
        r = res.get("dest") or res.get("path") or _diff_path(res) or label or task
        return [(kind, str(r))]
    if kind == "package":
        pkgs = _packages_from(res) if action in ("apt", "package") else []
        if pkgs:
            return [(kind, p) for p in pkgs]
        if action == "dpkg_selections" and isinstance(res.get("name"), str):
            return [(kind, res["name"])]
        return [(kind, str(label or res.get("name") or task))]
    if kind == "service":
        r = res.get("name") or label or task
        return [(kind, str(r))]
    r = label or (res.get("name") if isinstance(res.get("name"), str) else None) or task
    return [(kind, str(r))]


def failure_message(res: dict[str, Any]) -> str:
    """A short, censored-aware message for a failed result."""
    if not isinstance(res, dict):
        return str(res)[:MAX_MESSAGE]
    if res.get("censored"):
        return CENSORED
    parts: list[str] = []
    msg = res.get("msg") or res.get("reason")
    if msg:
        rc = res.get("rc")
        parts.append(str(msg).strip() + (f" (rc {rc})" if isinstance(rc, int) and rc else ""))
    for item in res.get("results") or []:
        if isinstance(item, dict) and item.get("failed"):
            label = _item_label(item)
            parts.append(f"item {label}: {failure_message(item)}" if label else failure_message(item))
    for k in ("stderr", "module_stderr"):
        v = res.get(k)
        if v and str(v).strip():
            tail = "\n".join(str(v).strip().splitlines()[-5:])
            if tail not in parts:
                parts.append(tail)
    if not parts and res.get("stdout"):
        parts.append("\n".join(str(res["stdout"]).strip().splitlines()[-5:]))
    text = "\n".join(parts) or "failed (no message)"
    return text[:MAX_MESSAGE]


def _says_changed(stdout: str, host: str) -> bool:
    return any(ln.strip().startswith(f"changed: [{host}") for ln in stdout.splitlines())


# ----------------------------------------------------------------------------------------------------------------
class EventFolder:
    """The event handler: folds ansible-runner events into a RunResult as they arrive."""

    def __init__(self, result: RunResult, progress: Progress) -> None:
        self.r = result
        self.progress = progress
        self.play_counts: dict[str, int] = {}
        self.handler_tasks: set[str] = set()
        self.current_batch: dict[str, Any] | None = None
        self.stats_seen = False

    def __call__(self, event: dict[str, Any]) -> bool:
        try:
            self._fold(event)
        except Exception as exc:  # a display problem must never kill the run
            print(f"provision: event handler error: {exc!r}", file=sys.stderr)
        return True  # keep the event in the artifacts

    def _host(self, name: str) -> HostResult:
        h = self.r.host(name)
        h.seen = True
        if self.current_batch is not None and name not in self.current_batch["hosts"]:
            self.current_batch["hosts"].append(name)
            h.batch = self.current_batch["batch"]
        return h

    def _fold(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        ed = event.get("event_data") or {}
        if kind == "playbook_on_play_start":
            base = str(ed.get("play_uuid") or ed.get("uuid") or ed.get("name")).split("_")[0]
            n = self.play_counts[base] = self.play_counts.get(base, 0) + 1
            name = ed.get("name") or ed.get("play") or ""
            self.current_batch = {"play": name, "batch": n, "hosts": []}
            self.r.batches.append(self.current_batch)
            self.progress.play(name, n)
        elif kind in ("playbook_on_task_start", "playbook_on_handler_task_start"):
            # ansible-runner reports handler starts as playbook_on_task_start with is_conditional=True
            handler = kind == "playbook_on_handler_task_start" or bool(ed.get("is_conditional"))
            if handler:
                self.handler_tasks.add(str(ed.get("task_uuid") or ed.get("uuid")))
            self.progress.task(ed.get("task") or ed.get("name") or "", ed.get("role"), handler)
        elif kind == "runner_on_ok":
            h = self._host(ed["host"])
            res = ed.get("res") or {}
            h.ok += 1
            self._role(h, ed)
            if res.get("censored") and "changed" not in res:
                # a no_log result carries no `changed` key; the display line ("changed: [host]") still tells
                res = dict(res, changed=_says_changed(event.get("stdout") or "", h.name))
            if res.get("changed"):
                h.changed += 1
                if self.r.check and str(ed.get("task_uuid")) not in self.handler_tasks:
                    self._drift(h, ed, res)
            self.progress.host_event(h.name, "changed" if res.get("changed") else "ok")
        elif kind == "runner_on_failed":
            h = self._host(ed["host"])
            res = ed.get("res") or {}
            self._role(h, ed)
            if ed.get("ignore_errors"):
                h.ignored += 1
                self.progress.host_event(h.name, "ignored")
                return
            h.failed += 1
            msg = failure_message(res)
            h.failures.append(TaskFailure(host=h.name, task=ed.get("task") or "", message=msg, role=ed.get("role"),
                                          play=ed.get("play"), action=_short_action(ed.get("resolved_action")
                                                                                    or ed.get("task_action"))))
            self.progress.host_event(h.name, "failed", msg)
        elif kind == "runner_on_unreachable":
            h = self._host(ed["host"])
            res = ed.get("res") or {}
            h.unreachable += 1
            h.unreachable_message = failure_message(res)
            self.progress.host_event(h.name, "unreachable", h.unreachable_message)
        elif kind == "runner_on_skipped":
            h = self._host(ed["host"])
            h.skipped += 1
            self._role(h, ed)
            self.progress.host_event(h.name, "skipped")
        elif kind == "playbook_on_no_hosts_remaining":
            self.r.aborted = True
        elif kind == "playbook_on_stats":
            self._stats(ed)

    def _role(self, h: HostResult, ed: dict[str, Any]) -> None:
        role = ed.get("role") or ""
        if role not in h.roles:
            h.roles.append(role)

    def _drift(self, h: HostResult, ed: dict[str, Any], res: dict[str, Any]) -> None:
        action = _short_action(ed.get("resolved_action") or ed.get("task_action"))
        task = ed.get("task") or action
        results = res.get("results") if isinstance(res.get("results"), list) else None
        parts = [x for x in results if isinstance(x, dict) and x.get("changed")] if results else [res]
        for part in parts:
            censored = part.get("censored") or res.get("censored")
            for kind, resource in resources_of(action, part, task):
                diff = None if censored else render_diff(part.get("diff"), resource if kind == "file" else None)
                if any(d.kind == kind and d.resource == resource for d in h.drift):
                    continue
                h.drift.append(DriftItem(host=h.name, task=task, kind=kind, resource=resource, role=ed.get("role"),
                                         action=action, diff=diff, play=ed.get("play")))

    def _stats(self, ed: dict[str, Any]) -> None:
        """Ansible's recap: authoritative numbers (rescued blocks, ignored errors) for hosts it reports."""
        self.stats_seen = True
        mapping = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable",
                   "skipped": "skipped", "rescued": "rescued", "ignored": "ignored"}
        for key, attr in mapping.items():
            for host, n in (ed.get(key) or {}).items():
                h = self.r.host(host)
                h.seen = True
                setattr(h, attr, int(n))


def run_playbook(
    inventory: str | os.PathLike[str],
    *,
    command: str = "run",
    playbook: str | os.PathLike[str] | None = None,
    limit: str | None = None,
    tags: str | None = None,
    skip_tags: str | None = None,
    check: bool = False,
    diff: bool | None = None,
    serial: str | None = None,
    max_fail_percent: int | None = None,
    extravars: dict[str, Any] | None = None,
    forks: int | None = None,
    progress: Progress | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
    envvars: dict[str, str] | None = None,
    timeout: int | None = None,
    on_run_dir: Callable[[Path], None] | None = None,
) -> RunResult:
    """Run `playbook` (default playbooks/site.yml) on `inventory` and return the folded result.

    Raises UsageError for bad input (missing playbook/inventory, a --limit matching nothing). Ansible-side problems
    (syntax errors, failed/unreachable hosts) are in the result, never raised.
    """
    import ansible_runner

    inv = Path(inventory)
    if not inv.exists():
        raise UsageError("inventory not found", path=str(inv))
    pb = Path(playbook) if playbook else paths.data_file(paths.PLAYBOOKS / "site.yml")
    if not pb.is_file():
        raise UsageError("playbook not found", path=str(pb))
    paths.data_file(ANSIBLE_CFG)
    limit = resolve_limit(limit)
    targeted = target_hosts(inv, limit)
    if not targeted:
        raise UsageError(f"no hosts match{' --limit ' + limit if limit else ''}", path=str(inv))
    serial = validate_serial(serial)
    if max_fail_percent is not None and not 0 <= max_fail_percent <= 100:
        raise UsageError(f"--max-fail-percent must be 0..100, got {max_fail_percent}")

    run_dir = new_run_dir(command, runs_dir)
    if on_run_dir:
        on_run_dir(run_dir)
    artifacts_root = run_dir / "artifacts"
    ident = "ansible"
    forks = forks or size_forks(len(targeted))
    result = RunResult(
        command=command, inventory=str(inv), playbook=str(pb), run_dir=str(run_dir),
        artifact_dir=str(artifacts_root / ident), started=time.time(), check=check, limit=limit, tags=tags,
        skip_tags=skip_tags, serial=serial, max_fail_percent=max_fail_percent, forks=forks, targeted=list(targeted),
    )
    for name in targeted:
        result.host(name)

    if command in ("run", "drift") and "validate" not in (tags or "").split(","):
        # `provision run/drift` already ran the same rules in Python (provisioner.rules): skip the validate.yml plays,
        # ~27 assert tasks per host that cost a third of a no-op run's controller CPU (benchmarks/README.md).
        skip_tags = ",".join(filter(None, [skip_tags, "validate"]))
    xv: dict[str, Any] = dict(extravars or {})
    if serial is not None:
        xv["provision_serial"] = serial
    if max_fail_percent is not None:
        xv["provision_max_fail_percent"] = max_fail_percent

    # the roles call provisioner.gpu.* (module, filters): the data root, linked as that collection in the run
    # directory (a checkout and an installed wheel alike), ahead of the collections the site has installed
    user_collections = os.environ.get("ANSIBLE_COLLECTIONS_PATH") or os.pathsep.join(
        [str(Path("~/.ansible/collections").expanduser()), "/usr/share/ansible/collections"])
    env = {
        "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
        "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join([str(paths.link_collection(run_dir)), user_collections]),
        # ansible-runner sets host key checking off unless told; ours stays on (ansible.cfg says so too)
        "ANSIBLE_HOST_KEY_CHECKING": os.environ.get("ANSIBLE_HOST_KEY_CHECKING", "True"),
        "ANSIBLE_FORCE_COLOR": "False",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": os.environ.get("ANSIBLE_CACHE_PLUGIN_CONNECTION",
                                                          str(fact_cache_dir(inv))),
        # the ansible-playbook of the Python running us (a venv's bin/ need not be on PATH)
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "ANSIBLE_NOCOLOR": "True",
    }
    env = {k: v for k, v in env.items() if v}
    env.update(envvars or {})
    cmdline = []
    if check:
        cmdline.append("--check")
    if diff if diff is not None else check:
        cmdline.append("--diff")

    prog = progress or NullProgress()
    folder = EventFolder(result, prog)
    prog.start(result)
    t0 = time.monotonic()
    runner = None
    try:
        runner = ansible_runner.run(
            private_data_dir=str(run_dir),
            artifact_dir=str(artifacts_root),
            ident=ident,
            project_dir=str(paths.DATA_ROOT),
            playbook=str(pb.resolve()),
            inventory=str(inv.resolve()),
            limit=limit,
            tags=tags,
            skip_tags=skip_tags,
            forks=forks,
            extravars=xv or None,
            cmdline=" ".join(cmdline) or None,
            envvars=env,
            event_handler=folder,
            quiet=True,
            fact_cache_type="none",  # keep ansible.cfg's persistent fact cache (runner would use a per-run one)
            timeout=timeout,
        )
    finally:
        result.duration = time.monotonic() - t0
        if runner is not None:
            result.status = runner.status
            result.rc = runner.rc
        prog.finish(result)

    scrub_command_artifact(Path(result.artifact_dir))
    if result.aborted and result.batches:
        # the play that stopped never reached these hosts (earlier plays, e.g. validation, may have)
        last = result.batches[-1]["play"]
        reached = {n for b in result.batches if b["play"] == last for n in b["hosts"]}
        for name in targeted:
            h = result.hosts.get(name)
            if h is not None and name not in reached and not h.failed and not h.unreachable:
                h.stopped = True
    # hosts outside the inventory selection (the implicit localhost of a controller-side play such as validate.yml)
    # are reported only when something happened there
    for name in [n for n in result.hosts if n not in set(targeted)]:
        h = result.hosts[name]
        if h.state in ("ok", "not_run") and not h.drift:
            del result.hosts[name]
    if runner is not None and runner.rc not in (0, None) and not any(h.seen for h in result.hosts.values()):
        result.error = _error_tail(Path(result.artifact_dir) / "stdout") or f"ansible-playbook exited {runner.rc}"
    elif runner is not None and runner.status in ("timeout", "canceled", "error") and result.error is None:
        result.error = f"ansible-runner status {runner.status}"
    if result.retry_hosts:
        rf = run_dir / "retry"
        rf.write_text("".join(h + "\n" for h in result.retry_hosts))
        result.retry_file = str(rf)
    (run_dir / "result.json").write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    return result


_ENV_KEEP = re.compile(r"^(ANSIBLE_|RUNNER_|AWX_|PATH$|HOME$|LANG$|LC_|PWD$|USER$|SHELL$|TERM$)")


def scrub_command_artifact(artifact_dir: Path) -> None:
    """ansible-runner writes the whole process environment into `artifacts/<ident>/command`; keep only what
    explains the run (ANSIBLE_*, PATH, ...) so tokens living in the operator's environment never land in artifacts."""
    f = artifact_dir / "command"
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        return
    env = data.get("env") or {}
    data["env"] = {k: v for k, v in env.items() if _ENV_KEEP.match(k)}
    data["env_scrubbed"] = sorted(k for k in env if not _ENV_KEEP.match(k))
    f.write_text(json.dumps(data, ensure_ascii=False))


def validate_serial(serial: str | int | None) -> str | None:
    if serial is None or serial == "":
        return None
    s = str(serial).strip()
    if re.fullmatch(r"[1-9]\d*", s) or re.fullmatch(r"([1-9]\d?|100)%", s):
        return s
    raise UsageError(f"--serial must be a positive number or a percentage like 25%, got {serial!r}")


def _error_tail(stdout: Path, lines: int = 8) -> str | None:
    try:
        text = stdout.read_text(errors="replace")
    except OSError:
        return None
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    keep = [ln for ln in text.strip().splitlines() if ln.strip()]
    errs = [i for i, ln in enumerate(keep) if ln.startswith("ERROR!") or "[ERROR]" in ln]
    if errs:
        keep = keep[errs[0]:]
    return "\n".join(keep[:lines]) or None
