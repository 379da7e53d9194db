"""Fold ansible-runner events into a `RunResult` as they arrive (`EventFolder`, the runner's event handler), and
classify what a changed or failed result stands for (`resources_of`, `failure_message`, `render_diff`), and note a
host a task said needs a reboot (`reboot_request`: a `<name>_reboot_required` fact).

Counts per host come from the events as they arrive (ansible-runner's `runner.stats` re-reads every event file); the
final `playbook_on_stats` event is authoritative for the recap numbers (it knows about rescued blocks). In check mode
(`drift`) each changed result of a non-handler task becomes one `DriftItem` per resource. No I/O.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from provisioner.errors import describe
from provisioner.reports.untrusted import terminal_safe
from provisioner.results import DriftItem, HostResult, RunResult, TaskFailure

if TYPE_CHECKING:
    from provisioner.runner.progress import Progress

#: Ansible's own placeholder for a `no_log` result; we never show anything else for such a task.
CENSORED = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"
#: Longest failure message kept per task (the artifacts hold the rest).
MAX_MESSAGE = 2000

FILE_ACTIONS = {
    "provisioner_file",
    "template", "copy", "file", "lineinfile", "blockinfile", "replace", "ini_file", "assemble", "get_url",
    "unarchive", "known_hosts", "authorized_key", "archive",
}
PACKAGE_ACTIONS = {"apt", "package", "dpkg_selections", "pip", "dnf", "dnf5", "yum", "apt_key", "apt_repository",
                   "deb822_repository", "rpm_key", "yum_repository", "provisioner_apt"}
SERVICE_ACTIONS = {"systemd", "systemd_service", "service", "sysvinit"}


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
    text = terminal_safe("".join(out))  # a file's content from the node: escapes shown, never acted on
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


def retry_subject(host: str, res: Any) -> str:
    """What a retrying (or finished) loop item waits for: its label, with the host it is delegated to when the item
    names one (`head`: the vLLM launch's plan); the host for a task without a loop or with a no_log result. Never
    anything else of the result."""
    if not isinstance(res, dict) or res.get("censored") or res.get("_ansible_no_log"):
        return host
    raw = res.get("_ansible_item_label", res.get("item"))
    label = _item_label(res)
    if not label or (isinstance(raw, dict) and label.startswith("{")):  # a whole item is no name (nor shown)
        return host
    item = res.get("item")
    head = item.get("head") if isinstance(item, dict) else None
    return f"{label} (head {head})" if isinstance(head, str) and head and head != label else label


#: A path on the controller, never the host's: a role's files/ or templates/, Ansible's local temp dir.
_CONTROLLER_PATH = re.compile(r"/roles/[^/]+/(?:files|templates)/|/\.ansible/tmp/")


def _diff_path(res: dict[str, Any]) -> str | None:
    """The managed path from a diff's headers: `before_header` is the destination (set only when it exists);
    `after_header` is the destination for `content:`, but the controller's source for `src:` (a role's files/, the
    rendered temporary of a template), so a controller path never counts."""
    diff = res.get("diff")
    for k in ("before_header", "after_header"):
        for d in diff if isinstance(diff, list) else [diff]:
            h = d.get(k) if isinstance(d, dict) else None
            if isinstance(h, str) and h.startswith("/") and not _CONTROLLER_PATH.search(h):
                return h.split(" ", 1)[0]
    return None


def host_path(action: str, args: Any, res: Any) -> tuple[str, str] | None:
    """(key, path on the host) to add to a changed result of a file task that does not name it, from the task's
    templated arguments: in check mode `copy`/`template` return only a diff, whose one header is the controller's
    source when the destination does not exist yet. None when the result names it already, or has no business to
    (no_log, not changed, not a file task). Used by the runner's event callback (runner/callback/awx_display.py)."""
    if not isinstance(res, dict) or not isinstance(args, dict) or not res.get("changed"):
        return None
    if res.get("_ansible_no_log") or res.get("censored") or isinstance(res.get("results"), list):
        return None
    if _kind(_short_action(action)) != "file" or res.get("dest") or res.get("path"):
        return None
    for key in ("dest", "path"):
        value = args.get(key)
        if isinstance(value, str) and value.startswith("/"):
            return key, value
    return None


def name_host_path(result: Any) -> None:
    """Add `host_path` to an ansible-core TaskResult (the task's templated arguments, its result dict) in place."""
    task = result._task
    found = host_path(str(getattr(task, "resolved_action", None) or task.action), task.args, result._result)
    if found is not None:
        result._result[found[0]] = found[1]


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
        return terminal_safe(str(res))[:MAX_MESSAGE]
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
    return terminal_safe(text)[:MAX_MESSAGE]  # a node's text: escapes shown, never acted on


#: A fact named `<name>_reboot_required` set true by a task (set_fact, a module's ansible_facts) marks its host as
#: needing a reboot; `<name>_reboot_reason` says why (roles/nvidia_driver/handlers/main.yml sets both).
REBOOT_FACT_SUFFIX = "_reboot_required"


def reboot_request(facts: Any, role: str | None = None) -> str | None:
    """Why a result's facts say the host needs a reboot (None: they do not); pure."""
    if not isinstance(facts, dict):
        return None
    for key in sorted(facts):
        value = facts[key]
        if key.endswith(REBOOT_FACT_SUFFIX) and (value is True or str(value).strip().lower() in ("true", "yes")):
            reason = facts.get(key[: -len("_required")] + "_reason")
            if isinstance(reason, str) and reason.strip():
                return reason.strip()
            return f"{key} set" + (f" by role {role}" if role else "")
    return None


def _says_changed(stdout: str, host: str) -> bool:
    return any(ln.strip().startswith(f"changed: [{host}") for ln in stdout.splitlines())


class EventFolder:
    """The event handler: folds ansible-runner events into a RunResult as they arrive."""

    def __init__(self, result: RunResult, progress: Progress,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.r = result
        self.progress = progress
        self.on_event = on_event
        self.play_counts: dict[str, int] = {}
        self.handler_tasks: set[str] = set()
        self.current_batch: dict[str, Any] | None = None
        self.current_task: str | None = None  # uuid of the task last started (meta tasks start once per host)
        self.stats_seen = False

    def __call__(self, event: dict[str, Any]) -> bool:
        try:
            self._fold(event)
            if self.on_event is not None:
                self.on_event(event)
        except Exception as exc:  # a display problem must never kill the run
            print(f"provision: event handler error: {describe(exc)}", file=sys.stderr)
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
            self.current_task = None
            self.progress.play(name, n)
        elif kind in ("playbook_on_task_start", "playbook_on_handler_task_start"):
            # ansible-runner reports handler starts as playbook_on_task_start with is_conditional=True
            handler = kind == "playbook_on_handler_task_start" or bool(ed.get("is_conditional"))
            uuid = str(ed.get("task_uuid") or ed.get("uuid") or "") or None
            if handler:
                self.handler_tasks.add(str(uuid))
            if uuid is not None and uuid == self.current_task:
                return  # a meta task (flush_handlers, end_host...) announces itself once per host: show it once
            self.current_task = uuid
            self.progress.task(ed.get("task") or ed.get("name") or "", ed.get("role"), handler)
        elif kind == "runner_on_ok":
            h = self._host(ed["host"])
            res = ed.get("res") or {}
            h.ok += 1
            self._role(h, ed)
            if res.get("censored") and "changed" not in res:
                # a no_log result carries no `changed` key; the display line ("changed: [host]") still tells
                res = dict(res, changed=_says_changed(event.get("stdout") or "", h.name))
            reboot = reboot_request(res.get("ansible_facts"), ed.get("role"))
            if reboot is not None:
                h.reboot_required, h.reboot_reason = True, reboot
            if res.get("rebooted") is True and not self.r.check and _short_action(
                    ed.get("resolved_action") or ed.get("task_action")) == "reboot":
                h.rebooted = True
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
        elif kind == "runner_retry":
            res = ed.get("res") or {}
            attempt, attempts = res.get("attempts"), res.get("retries")
            if isinstance(attempt, int) and isinstance(attempts, int) and ed.get("host"):
                self.progress.retry(ed["host"], retry_subject(ed["host"], res), attempt, attempts)
        elif kind in ("runner_item_on_ok", "runner_item_on_failed") and ed.get("host"):
            res = ed.get("res") or {}
            self.progress.item_event(ed["host"], retry_subject(ed["host"], res),
                                     "ok" if kind == "runner_item_on_ok" else "failed")
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
        """Ansible's recap: authoritative numbers (rescued blocks, ignored errors) for every host it reports; a host
        it reports but not under a key had none of those (a failure a block rescued is not a failure)."""
        self.stats_seen = True
        mapping = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable",
                   "skipped": "skipped", "rescued": "rescued", "ignored": "ignored"}
        reported = set(ed.get("processed") or {}).union(*((ed.get(k) or {}) for k in mapping))
        for host in reported:
            h = self.r.host(host)
            h.seen = True
            for key, attr in mapping.items():
                setattr(h, attr, int((ed.get(key) or {}).get(host, 0)))
            # a failure that stops a host is its last in the play; the earlier ones were rescued
            if len(h.failures) > h.failed:
                h.failures = h.failures[len(h.failures) - h.failed:]


    def finish(self, targeted: list[str] | tuple[str, ...]) -> None:
        """After the run: hosts a stopped play never reached are `stopped`; hosts outside the selection (the implicit
        localhost of a controller-side play such as validate.yml) stay only when something happened there."""
        r = self.r
        if r.aborted and r.batches:
            last = r.batches[-1]["play"]
            reached = {n for b in r.batches if b["play"] == last for n in b["hosts"]}
            for name in targeted:
                h = r.hosts.get(name)
                if h is not None and name not in reached and not h.failed and not h.unreachable:
                    h.stopped = True
        selected = set(targeted)
        for name in [n for n in r.hosts if n not in selected]:
            h = r.hosts[name]
            if h.state in ("ok", "not_run") and not h.drift:
                del r.hosts[name]
