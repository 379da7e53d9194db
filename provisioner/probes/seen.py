"""What `provision status --nodes` reads on each node in one SSH exec: the in-service mark, the loaded NVIDIA driver's
version and the vLLM in the vLLM venv. The shell snippet, its parser and the table cells are pure (unit-tested
without SSH); `look` runs the snippet on the hosts in parallel."""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: The in-service mark (provisioner.probes.health.IN_SERVICE; not imported: that module imports the SSH layer).
IN_SERVICE = "/etc/provisioner/in-service"
#: The vLLM venv (roles/vllm/defaults/main.yml `vllm_venv`); a host's own plain `vllm_venv` wins.
VLLM_VENV = "/opt/vllm/venv"
#: Where the loaded module's version is read, in this order (the simulated node's first, as hoststate.FACTS);
#: nvidia-smi answers only when none of them is there.
DRIVER_FILES = ("/var/lib/hwsim/sys/module/nvidia/version", "/sys/module/nvidia/version",
                "/var/lib/hwsim/proc/driver/nvidia/version", "/proc/driver/nvidia/version")
TIMEOUT = 30.0  # seconds per node: connect, authenticate, run the snippet
PREFIX = "seen:"
COLUMNS = ("mark", "driver", "vllm")


def snippet(venv: str = VLLM_VENV) -> str:
    """POSIX shell, read-only: one `seen:KEY=VALUE` line per fact, `seen:end` last. Always exits 0."""
    q = shlex.quote
    files = " ".join(q(f) for f in DRIVER_FILES)
    return "; ".join([
        f"m={q(IN_SERVICE)}",
        'if [ -e "$m" ]; then echo seen:mark=1; '
        "printf 'seen:mark_body=%s\\n' \"$(head -c 4096 \"$m\" 2>/dev/null | tr '\\n\\r' '  ')\"; "
        "else echo seen:mark=0; fi",
        "d=",
        f'for f in {files}; do if [ -r "$f" ]; then d=$(head -n 1 "$f" 2>/dev/null); '
        "printf 'seen:driver_file=%s\\n' \"$f\"; printf 'seen:driver=%s\\n' \"$d\"; break; fi; done",
        'if [ -z "$d" ] && command -v nvidia-smi >/dev/null 2>&1; then printf \'seen:smi=%s\\n\' '
        '"$(timeout 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"; fi',
        f"for v in {q(venv)}/lib/python3*/site-packages/vllm-*.dist-info; do "
        "if [ -d \"$v\" ]; then printf 'seen:vllm=%s\\n' \"${v##*/}\"; fi; done",
        f"if [ -d {q(venv)} ]; then echo seen:venv=1; else echo seen:venv=0; fi",
        "echo seen:end",
    ])


def command(user: str | None, venv: str = VLLM_VENV) -> str:
    """The snippet as the SSH user runs it: through `sudo -n sh -c` unless that user is root (as serving_ops)."""
    from provisioner.probes.ssh import as_root

    return as_root(snippet(venv), user)


def venv_of(host: Any) -> str:
    """The host's vLLM venv: its `vllm_venv` when that is a plain absolute path (no template), else the default."""
    v = host.get("vllm_venv") if hasattr(host, "get") else None
    return v if isinstance(v, str) and v.startswith("/") and "{" not in v else VLLM_VENV


class SeenError(ValueError):
    """The output is not the snippet's (a refused sudo, a shell that did not run it)."""


@dataclass(frozen=True)
class Seen:
    mark: bool  # the in-service mark file exists
    mark_since: str | None  # its JSON note's `since` (None: no note, or not JSON)
    mark_by: str | None  # its note's `by`
    driver: str | None  # the loaded driver's version (None: no module loaded, no nvidia-smi answer)
    driver_source: str | None  # the file it came from, or `nvidia-smi`
    vllm: str | None  # the vLLM version(s) in the venv, comma-separated (None: none installed)
    venv: bool  # the venv directory exists
    complete: bool  # the snippet ran to its end


_DIST = re.compile(r"vllm-([^-/]+)\.dist-info")


def driver_version(text: str | None) -> str | None:
    """A bare version (`/sys/module/nvidia/version`, nvidia-smi's answer) or the `NVRM version: ... Kernel Module
    ...  580.95.05 ...` line of `/proc/driver/nvidia/version`; None when neither."""
    from provisioner.probes.nodeparse import parse_nvrm_version

    return parse_nvrm_version(text)


def parse_seen(stdout: str) -> Seen:
    """The snippet's output (other lines, such as a banner, ignored); SeenError when it printed none of its lines."""
    kv: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        line = line.rstrip("\r")
        if line == PREFIX + "end":
            kv.setdefault("end", []).append("")
        elif line.startswith(PREFIX) and "=" in line:
            k, _, v = line[len(PREFIX):].partition("=")
            kv.setdefault(k, []).append(v.strip())
    if "mark" not in kv:
        raise SeenError("the node printed nothing of the probe" + (f": {stdout.strip()[:200]}" if stdout.strip()
                                                                    else ""))
    since = by = None
    mark = kv["mark"][0] == "1"
    if mark and kv.get("mark_body"):
        try:
            note = json.loads(kv["mark_body"][0])
        except ValueError:
            note = None
        if isinstance(note, dict):
            since = str(note["since"]) if note.get("since") else None
            by = str(note["by"]) if note.get("by") else None
    driver = source = None
    if kv.get("driver"):
        driver, source = driver_version(kv["driver"][0]), (kv.get("driver_file") or [""])[0] or None
    if driver is None and kv.get("smi"):
        driver, source = driver_version(kv["smi"][0]), "nvidia-smi"
    if driver is None:
        source = None
    versions = sorted({m.group(1) for v in kv.get("vllm", []) if (m := _DIST.fullmatch(v))})
    return Seen(mark=mark, mark_since=since, mark_by=by, driver=driver, driver_source=source,
                vllm=",".join(versions) or None, venv=(kv.get("venv") or ["0"])[0] == "1", complete="end" in kv)


def field(value: str | None, source: str | None, *, detail: str | None = None, run: int | None = None,
          at: float | None = None, now: float | None = None, **extra: Any) -> dict[str, Any]:
    """One seen column's JSON: the value, where it came from (`health`, `recorded`, `node`; None: unknown), the run
    that recorded it, when, and how old that is (seconds)."""
    age = None if at is None else max(0, round((time.time() if now is None else now) - at))
    return {"value": value, "source": source, "detail": detail, "run": run, "at": at, "age_s": age, **extra}


UNKNOWN: dict[str, Any] = field(None, None)


def fields(ok: bool, rc: int | None, stdout: str, stderr: str = "", error: str | None = None,
           at: float | None = None) -> dict[str, dict[str, Any]]:
    """{mark, driver, vllm} from one SSH exec (run_one's ExecResult fields): what the node showed, or `unreachable` /
    `error` (with why) in all three."""
    at = time.time() if at is None else at
    try:
        if not ok:
            raise SeenError(f"unreachable: {error or 'no connection'}")
        s = parse_seen(stdout)
    except SeenError as exc:
        why = str(exc)
        if ok and rc:
            why = f"the probe exited {rc}: {(stderr.strip() or stdout.strip() or 'no output')[-200:]}"
        return {k: field(None, "node", at=at, now=at, error=why, unreachable=not ok) for k in COLUMNS}
    return {
        "mark": field("yes" if s.mark else "no", "node", detail=IN_SERVICE, at=at, now=at, since=s.mark_since,
                      by=s.mark_by),
        "driver": field(s.driver, "node", detail=s.driver_source or "no NVIDIA module loaded, no nvidia-smi answer",
                        at=at, now=at),
        "vllm": field(s.vllm, "node", detail="vllm-*.dist-info in the venv" if s.vllm else
                      ("no vllm in the venv" if s.venv else "no venv"), at=at, now=at),
    }


def cell(f: Mapping[str, Any] | None, kind: str = "") -> str:
    """A seen column's text: the value; `unreachable` / `error`; `none` when the node was read and has none; `-` when
    unknown. The mark reads `yes (since ...)`, `no`, or `recorded` (the ledger's recorded state holds the file)."""
    if not f:
        return "-"
    if f.get("unreachable"):
        return "unreachable"
    if f.get("error"):
        return "error"
    v = f.get("value")
    if v is None:
        return "none" if f.get("source") == "node" else "-"
    if kind == "mark" and v == "yes" and f.get("since"):
        return f"yes (since {f['since']})"
    return str(v)


def look(fleet: Any, hosts: Iterable[str], timeout: float = TIMEOUT, forks: int = 16) -> dict[str, dict[str, Any]]:
    """Run the snippet on every host, in parallel (at most `forks` at once, one exec each): {host: fields(...)}."""
    from concurrent.futures import ThreadPoolExecutor

    from provisioner.probes.ssh import run_one, target_for  # its paramiko logs nothing (ssh._quiet_paramiko)

    def one(h: str) -> tuple[str, dict[str, Any]]:
        t = target_for(fleet.hosts[h])
        r = run_one(t, command(t.user, venv_of(fleet.hosts[h])), timeout=timeout)
        return h, fields(r.ok, r.rc, r.stdout, r.stderr, r.error)

    hosts = list(hosts)
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(forks, len(hosts))) as pool:
        return dict(pool.map(one, hosts))
