"""The node health gate from the controller: run roles/node_health/files/node_health.py on hosts (one SSH exec per
host: the program and the parser module it imports, nodeparse.py, travel in the command itself and run from a
temporary directory laid out as the node_health role installs them, so a host needs only python3), collect its JSON
lines, aggregate.

    results = run_health(fleet, hosts)      # {host: HostHealth}
    render_text / render_json / render_prometheus(results)

The program's arguments come from the inventory (`health_argv`): GPU count, the catalog's nvidia-smi name for
`gpu_model`, the pinned driver (`nvidia_driver_version`, else the nvidia_driver role default), NCCL_IB_HCA from
`ib_hcas` (exact list), the IB rate, Fabric Manager required on NVSwitch models, the catalog's all-reduce threshold for
a full node. `node_health_*` host variables override (the same names the role uses:
roles/node_health/defaults/main.yml).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from provisioner.model import Fleet, Host
from provisioner.paths import ROLES, data_file
from provisioner.probes.ssh import DEFAULT_FORKS, ExecResult, run_many, target_for
from provisioner.reports import count
from provisioner.reports.textfile import sample
from provisioner.reports.untrusted import node_text

PROGRAM = ROLES / "node_health" / "files" / "node_health.py"
#: The files the program needs side by side (nodeparse.py: a symlink to provisioner/probes/nodeparse.py).
PROGRAM_FILES = (ROLES / "node_health" / "files" / "nodeparse.py", PROGRAM)
#: Linux limits one argument to 128 KiB (MAX_ARG_STRLEN) and sshd hands the command to the shell as one (`-c CMD`).
MAX_COMMAND = 128 * 1024 - 1
DEFAULT_TIMEOUT = 900.0  # the all-reduce on a full node takes a minute or two; FM/ECC reads are quick
HEREDOC = "__PROVISIONER_NODE_HEALTH__"


def _role_default(role: str, key: str) -> Any:
    from provisioner.defaults import role_default

    return role_default(role, key)


def pinned_driver(host: Host) -> str | None:
    v = host.get("nvidia_driver_version") or _role_default("nvidia_driver", "nvidia_driver_version")
    return str(v) if v and "{{" not in str(v) else None


def socket_ifname_setting(bootstrap_interface: str | None) -> str:
    """NCCL_SOCKET_IFNAME as templates/nccl.conf.j2 renders it from `bootstrap_interface`: an exact match
    (`=host0`) unless the value already starts with `=` or `^`; "" when the inventory names no interface."""
    v = str(bootstrap_interface or "").strip()
    if not v:
        return ""
    return v if v[0] in "=^" else "=" + v


def health_argv(fleet: Fleet, host: Host) -> list[str]:
    """Arguments of node_health.py for `host` (without the program path)."""
    from provisioner.probes.preflight import _smi_names, expected_ib_rate

    argv: list[str] = []
    v = host.vars

    def opt(name: str, default: Any) -> Any:
        return v.get(f"node_health_{name}", default)

    count = opt("gpu_count", host.gpu_count)
    if count is not None and str(count) != "":
        argv += ["--gpu-count", str(count)]
    names = opt("gpu_names", list(_smi_names(host.gpu_model)))
    for n in names or []:
        argv += ["--gpu-name", str(n)]
    drv = opt("driver_version", pinned_driver(host))
    if drv:
        argv += ["--driver", str(drv)]
    spec = None
    try:
        from provisioner import catalog

        spec = catalog.gpu(host.gpu_model)
    except Exception:
        spec = None
    fm_default = "required" if (spec is not None and spec.fabric_manager) else "auto"
    needs_fm = host.get("gpu_needs_fabric_manager")
    if needs_fm is not None and str(needs_fm).strip().lower() in ("false", "no", "0", "off"):
        fm_default = "auto"  # the site says this node has no NVSwitch fabric (the fabric_manager role skips FM too)
    argv += ["--fabricmanager", str(opt("fabricmanager", fm_default))]
    hca = opt("ib_hca", ("=" + ",".join(host.ib_hcas)) if host.ib_hcas else "")
    if hca:
        argv += ["--ib-hca", str(hca)]
    argv += ["--ib-rate", f"{float(opt('ib_rate', expected_ib_rate(host))):g}"]
    ifname = opt("socket_ifname", socket_ifname_setting(host.bootstrap_interface))
    if ifname:
        argv += ["--socket-ifname", str(ifname)]
    # node shapes (issue 18): EFA devices on fabric efa, NVLSM on its models, IMEX on NVL72 trays (catalog fields)
    efa = opt("efa_devices", host.efa_device_count if host.fabric == "efa" else None)
    if efa:
        argv += ["--efa-devices", str(efa)]
        if host.efa_devices:
            argv += ["--efa-names", ",".join(host.efa_devices)]
    argv += ["--nvlsm", str(opt("nvlsm", "required" if spec is not None and spec.nvlsm else "auto"))]
    imex = spec is not None and spec.imex
    argv += ["--imex", str(opt("imex", "required" if imex else "auto"))]
    if imex and host.nvlink_domain:
        trays = sum(1 for h in fleet.gpu_nodes
                    if h.nvlink_domain == host.nvlink_domain and h.gpu_model == host.gpu_model)
        argv += ["--imex-nodes", str(opt("imex_nodes", trays))]
    busbw = opt("busbw_min_gbps", None)
    if busbw in (None, "") and spec is not None and spec.allreduce_busbw_gbps and count == spec.all_reduce_gpus:
        busbw = spec.allreduce_busbw_gbps
    if busbw not in (None, ""):
        argv += ["--busbw-min", f"{float(busbw):g}"]
    argv += ["--allreduce", str(opt("allreduce", "auto"))]
    argv += ["--allreduce-sizes", str(opt("allreduce_sizes", "4G"))]
    # unset: the role's defaults, /dev/kmsg and / (the simulated rack's inventory points both at its hwsim files)
    kmsg = opt("kmsg", _role_default("node_health", "node_health_kmsg"))
    if kmsg:
        argv += ["--kmsg", str(kmsg)]
    sysfs_root = opt("sysfs_root", _role_default("node_health", "node_health_sysfs_root"))
    if sysfs_root and str(sysfs_root) != "/":  # / is the program's own default
        argv += ["--sysfs-root", str(sysfs_root)]
    for name, flag in (("torch_python", "--torch-python"),
                       ("nccl_tests", "--nccl-tests")):
        val = opt(name, "")
        if val:
            argv += [flag, str(val)]
    extra = opt("extra_args", [])
    if isinstance(extra, list):
        argv += [str(x) for x in extra]
    return argv


def program_files() -> dict[str, str]:
    """{file name: text} of what the node_health role installs in one directory (the program last)."""
    return {p.name: data_file(p).read_text() for p in PROGRAM_FILES}


def remote_command(argv: list[str], *, sudo: bool, files: dict[str, str] | None = None) -> str:
    """One shell command that writes `files` (default: program_files()) into a fresh temporary directory, runs the
    last one as `python3 -B DIR/NAME ARGS` (`sudo -n` for non-root logins; -B: no root-owned __pycache__ left
    behind), removes the directory and exits with the program's status."""
    files = program_files() if files is None else files
    main = list(files)[-1]
    out = ['d=$(mktemp -d) || exit 125', "trap 'rm -rf \"$d\"' EXIT"]
    for name, text in files.items():
        assert HEREDOC not in text and shlex.quote(name) == name and "/" not in name, name
        body = text if text.endswith("\n") else text + "\n"
        out.append(f"cat > \"$d/{name}\" <<'{HEREDOC}'\n{body}{HEREDOC}")
    out.append(f"{'sudo -n ' if sudo else ''}python3 -B \"$d/{main}\" {' '.join(shlex.quote(a) for a in argv)}")
    cmd = "\n".join(out) + "\n"
    assert len(cmd.encode()) <= MAX_COMMAND, f"node health command is {len(cmd.encode())} bytes: over {MAX_COMMAND}"
    return cmd


# ------------------------------------------------------------------------------------------ results
@dataclass
class HostHealth:
    host: str
    reachable: bool
    rc: int | None = None
    error: str | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    argv: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if c.get("status") == "fail"]

    @property
    def ok(self) -> bool:
        return self.reachable and self.error is None and self.rc == 0 and not self.failed \
            and self.summary.get("status") == "pass"

    @property
    def message(self) -> str:
        if not self.reachable:
            return f"unreachable: {self.error}"
        if self.error:
            return self.error
        return "; ".join(f"{c['check']}: {c.get('message', '')}" for c in self.failed)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "reachable": self.reachable, "rc": self.rc, "error": self.error,
                "seconds": self.seconds, "failed": [c["check"] for c in self.failed], "checks": self.checks,
                "summary": self.summary}


#: What a node may send back (node_health.py's JSON lines): at most this much output is read, this many checks kept,
#: each check name a word, each status one of STATUSES, each message one line of MAX_MESSAGE characters, each
#: `found`/`expected` at most MAX_DETAIL bytes of JSON. Anything else makes the host's result an error (not ok).
MAX_OUTPUT = 1024 * 1024
MAX_CHECKS = 64
MAX_MESSAGE = 500
MAX_DETAIL = 16384
STATUSES = frozenset({"pass", "fail", "warn", "skip"})
_CHECK_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


def _detail(v: Any) -> Any:
    """A check's `found`/`expected`, kept when it is small JSON; else a note that it was dropped."""
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        return {"dropped": "not JSON"}
    return v if len(text) <= MAX_DETAIL else {"dropped": f"{len(text)} bytes of JSON (over {MAX_DETAIL})"}


def check_record(obj: Any) -> tuple[dict[str, Any] | None, str | None]:
    """One JSON line from the node -> (a typed, bounded check record, None) or (None, why it was refused). Pure."""
    if not isinstance(obj, dict):
        return None, f"a result line is a {type(obj).__name__}, not an object"
    name, status = obj.get("check"), obj.get("status")
    if not (isinstance(name, str) and _CHECK_NAME.fullmatch(name)):
        return None, f"a check name {node_text(name, 40)!r} is not a word of [a-z0-9_]"
    if name == "summary":
        failed = obj.get("failed")
        failed = [x for x in failed if isinstance(x, str) and _CHECK_NAME.fullmatch(x)][:MAX_CHECKS] \
            if isinstance(failed, list) else []
        if status not in ("pass", "fail"):
            return None, f"the summary's status {node_text(status, 40)!r} is not pass/fail"
        return {"check": "summary", "status": status, "failed": failed,
                "host": node_text(obj.get("host", ""), 253)}, None
    if status not in STATUSES:
        return None, f"check {name}: status {node_text(status, 40)!r} is not one of {', '.join(sorted(STATUSES))}"
    rec: dict[str, Any] = {"check": name, "status": status, "message": node_text(obj.get("message", ""), MAX_MESSAGE)}
    for k in ("expected", "found"):
        if k in obj:
            rec[k] = _detail(obj[k])
    return rec, None



def json_lines(text: str) -> Iterator[Any]:
    """Each line of a node's output that is a JSON document opening with `{` (any other line skipped), as parsed:
    what the health and burn-in programs print, one result a line. The caller bounds the text first."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            yield json.loads(line)
        except (ValueError, RecursionError):
            continue

def parse_output(host: str, r: ExecResult) -> HostHealth:
    """node_health.py's JSON lines (+ exit status) -> HostHealth. Pure. What the node sends is data: typed and
    bounded by `check_record`; a malformed line or too much output makes the result an error, never a crash."""
    if not r.ok:
        return HostHealth(host, reachable=False, error=node_text(r.error, MAX_MESSAGE), seconds=r.seconds)
    h = HostHealth(host, reachable=True, rc=r.rc, seconds=r.seconds)
    problems: list[str] = []
    stdout = r.stdout
    if len(stdout) > MAX_OUTPUT:
        problems.append(f"over {MAX_OUTPUT} bytes of output (the rest ignored)")
        stdout = stdout[:MAX_OUTPUT]
    for obj in json_lines(stdout):
        if isinstance(obj, dict) and "check" not in obj:
            continue
        rec, why = check_record(obj)
        if rec is None:
            problems.append(str(why))
        elif rec["check"] == "summary":
            h.summary = rec
        elif len(h.checks) >= MAX_CHECKS:
            problems.append(f"more than {MAX_CHECKS} checks")
            break
        else:
            h.checks.append(rec)
    if problems:
        h.error = node_text(f"node_health.py sent a malformed result: {problems[0]}", MAX_MESSAGE)
    elif not h.summary:
        tail = (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or ["no output"])[-1]
        if "sudo" in tail and "password" in tail:
            tail += " (the login user needs passwordless sudo, or log in as root)"
        h.error = node_text(f"node_health.py gave no result (rc {r.rc}): {node_text(tail, 300)}", MAX_MESSAGE)
    return h


def run_health(fleet: Fleet, hosts: Iterable[str], *, timeout: float = DEFAULT_TIMEOUT, forks: int = DEFAULT_FORKS,
               on_result: Callable[[ExecResult], None] | None = None) -> dict[str, HostHealth]:
    names = list(hosts)
    files = program_files()
    cmds: dict[str, str] = {}
    argvs: dict[str, list[str]] = {}
    targets = []
    for n in names:
        host = fleet.hosts[n]
        t = target_for(host)
        targets.append(t)
        argvs[n] = health_argv(fleet, host)
        cmds[n] = remote_command(argvs[n], sudo=(t.user or "root") != "root", files=files)
    results = run_many(targets, lambda t: cmds[t.name], timeout=timeout, forks=forks, on_result=on_result)
    out = {}
    for n in names:
        h = parse_output(n, results[n])
        h.argv = argvs[n]
        out[n] = h
    return out


# ------------------------------------------------------------------------------------------ reports
CHECK_ORDER = ("gpu", "driver", "reboot", "persistence", "fabricmanager", "ecc", "xid", "nvlink", "ib", "socket_ifname",
               "gpudirect", "acs", "efa", "nvlsm", "imex", "allreduce")
_MARK = {"pass": "ok", "fail": "FAIL", "skip": "-", "warn": "warn"}


def render_text(results: dict[str, HostHealth], seconds: float | None = None) -> str:
    """A rich table, one row per host and a column per check under its whole name (marks aligned under it), then
    one line per failed check and the summary."""
    from provisioner.reports.table import plain_table, to_text

    cols = list(CHECK_ORDER)
    table = plain_table("host", "result", *cols, "error", right=tuple(cols))
    for name, h in results.items():
        if not h.reachable or h.error:
            table.add_row(name, "UNREACHABLE" if not h.reachable else "ERROR", *([""] * len(cols)), h.error or "")
            continue
        by = {c["check"]: c for c in h.checks}
        marks = [_MARK.get(by[c]["status"], by[c]["status"]) if c in by else "" for c in cols]
        table.add_row(name, "PASS" if h.ok else "FAIL", *marks, "")
    lines = [to_text(table).rstrip("\n")]
    for name, h in results.items():
        for c in h.failed:
            lines.append(f"{name}: {c['check']}: {c.get('message', '')}")
    n_ok = sum(1 for h in results.values() if h.ok)
    n_unr = sum(1 for h in results.values() if not h.reachable)
    tail = (f"health: {count(len(results), 'host')}, {n_ok} pass, {len(results) - n_ok - n_unr} fail, "
            f"{n_unr} unreachable")
    if seconds is not None:
        tail += f" ({seconds:.1f}s)"
    lines.append(tail)
    return "\n".join(lines) + "\n"


def render_json(results: dict[str, HostHealth], seconds: float | None = None) -> str:
    doc = {"ok": all(h.ok for h in results.values()), "seconds": None if seconds is None else round(seconds, 3),
           "hosts": {n: h.to_dict() for n, h in results.items()}}
    return json.dumps(doc, indent=2) + "\n"


def render_prometheus(results: dict[str, HostHealth], *, now: float | None = None) -> str:
    """node_exporter textfile collector format."""
    ts = time.time() if now is None else now
    out = [
        "# HELP provisioner_node_health_ok 1 when every health check passed on the host "
        "(skipped checks count as passed).",
        "# TYPE provisioner_node_health_ok gauge",
    ]
    def add(name: str, labels: dict[str, Any], value: Any) -> None:
        line = sample(name, labels, value)
        if line is not None:
            out.append(line)

    for n, h in results.items():
        add("provisioner_node_health_ok", {"host": n}, 1 if h.ok else 0)
    out += ["# HELP provisioner_node_health_reachable 1 when the host answered over SSH and ran the program.",
            "# TYPE provisioner_node_health_reachable gauge"]
    for n, h in results.items():
        add("provisioner_node_health_reachable", {"host": n}, 1 if h.reachable and not h.error else 0)
    out += ["# HELP provisioner_node_health_check_ok Per check: 1 pass or skip, 0 fail.",
            "# TYPE provisioner_node_health_check_ok gauge"]
    for n, h in results.items():
        for c in h.checks:
            add("provisioner_node_health_check_ok", {"host": n, "check": c.get("check", ""),
                                                     "status": c.get("status", "")},
                0 if c.get("status") == "fail" else 1)
    bw = [(n, c["found"]["busbw_gbps"]) for n, h in results.items() for c in h.checks
          if c.get("check") == "allreduce" and isinstance(c.get("found"), dict)
          and sample("x", {}, c["found"].get("busbw_gbps")) is not None
          and isinstance(c["found"].get("gpus"), int) and c["found"]["gpus"] >= 2]
    if bw:
        out += ["# HELP provisioner_node_health_allreduce_busbw_gbps Single-node all-reduce bus bandwidth (GB/s).",
                "# TYPE provisioner_node_health_allreduce_busbw_gbps gauge"]
        for n, v in bw:
            add("provisioner_node_health_allreduce_busbw_gbps", {"host": n}, v)
    out += ["# HELP provisioner_node_health_last_run_timestamp_seconds When the health gate last ran.",
            "# TYPE provisioner_node_health_last_run_timestamp_seconds gauge",
            f"provisioner_node_health_last_run_timestamp_seconds {ts:.0f}"]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ in service
IN_SERVICE = "/etc/provisioner/in-service"


def mark_command(ok: bool, note: dict[str, Any], *, sudo: bool) -> str:
    """Shell that marks the host in service (writes IN_SERVICE with a JSON note) or takes it out (removes it)."""
    s = "sudo -n " if sudo else ""
    if ok:
        body = shlex.quote(json.dumps(note, sort_keys=True) + "\n")
        return (f"{s}mkdir -p /etc/provisioner && printf %s {body} | {s}tee {IN_SERVICE}.tmp >/dev/null && "
                f"{s}mv {IN_SERVICE}.tmp {IN_SERVICE} && echo marked")
    return f"{s}rm -f {IN_SERVICE} && echo unmarked"
