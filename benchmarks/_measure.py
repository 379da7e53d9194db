"""Shared measuring helpers for the Ansible benchmarks (benchmarks/ansible_bench.py).

What one measured command gives (`run_measured`):
- wall seconds;
- controller CPU seconds: user+sys of the command's whole process tree. The bench process makes itself a child
  subreaper (prctl PR_SET_CHILD_SUBREAPER), so processes that daemonize out of the tree (OpenSSH ControlPersist
  masters: the connections that carry every task) are re-parented to it; when the command ends they are told to exit
  (SIGTERM), reaped with wait4 and their CPU is added. Without this the SSH master's encryption/compression work would
  be missed on both sides;
- whole-machine CPU seconds from /proc/stat busy jiffies (includes every other process on this shared machine:
  other engineers' racks and tests; reported, but noisy);
- rack CPU seconds: user+sys of the simulated rack's own processes (each host's nspawn supervisor tree = every
  process inside the host, plus the rack's proxy and repo server), from /proc/<pid>/stat utime+stime+cutime+cstime
  summed over the live trees (exited processes are folded into their reaped parent's cutime/cstime). This is the
  hosts' share, immune to the neighbours' load; "attributed machine CPU" = controller + rack;
- module executions per host, from a small callback plugin (`callback_env`) enabled in both the tuned and the stock
  run: every task result that ran a module on the host (items of a loop counted one each; controller-only actions
  such as assert/set_fact/include_vars/meta are not counted), and a per-task profile (wall and controller CPU of the
  ansible-playbook process and its workers between task starts, as profile_tasks would give).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

CLK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36


def machine_busy_seconds() -> float:
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return (sum(vals[:8]) - idle) / CLK


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, starttime, cpu ticks incl. reaped children)."""
    out: dict[int, tuple[int, int, int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rindex(")") + 2:].split()
        # rest[0] = state (field 3); utime field 14 -> rest[11]; stime 15; cutime 16; cstime 17; starttime 22
        ppid = int(rest[1])
        cpu = int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
        out[int(d)] = (ppid, int(rest[19]), cpu)
    return out


def tree_cpu_seconds(roots: list[tuple[int, int]]) -> float:
    """CPU seconds of every live process under the given (pid, starttime) roots, reaped descendants included."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total = 0
    seen: set[int] = set()
    stack = [pid for pid, start in roots if pid in table and (start is None or table[pid][1] == start)]
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += table[pid][2]
        stack.extend(children.get(pid, []))
    return total / CLK


def _sessions_in_tree(roots: list[tuple[int, int]]) -> int:
    """sshd per-connection processes still alive under the roots (ssh sessions not yet closed)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    n, stack = 0, [pid for pid, _ in roots if pid in table]
    while stack:
        pid = stack.pop()
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            cmd = b""
        if cmd.startswith(b"sshd:") and b"[listener]" not in cmd:
            n += 1
        stack.extend(children.get(pid, []))
    return n


def settled_tree_cpu_seconds(roots: list[tuple[int, int]], timeout: float = 20.0) -> float:
    """tree_cpu_seconds once the hosts' ssh sessions have closed and been reaped (after the controller's
    connections were ended): a session that exits between reading its parent and itself would be lost."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        v = tree_cpu_seconds(roots)
        if (_sessions_in_tree(roots) == 0 and last is not None and abs(v - last) < 0.02) \
                or time.monotonic() > deadline:
            return v
        last = v
        time.sleep(0.5)


def rack_roots(name: str, hosts: list[str] | None = None) -> list[tuple[int, int]]:
    """The rack's host supervisors, proxy and repo server, from the testbed's state.json; with `hosts`, only those
    hosts' supervisors."""
    state_dir = Path(os.environ.get("PROVISIONER_TESTBED_STATE", "/var/lib/provisioner-testbed"))
    st = json.loads((state_dir / "racks" / name / "state.json").read_text())
    roots = [tuple(h["nspawn"]) for h in st["hosts"] if h.get("nspawn") and (hosts is None or h["name"] in hosts)]
    for key in ("proxy", "serve") if hosts is None else ():
        if st.get(key):
            roots.append(tuple(st[key]))
    return [(int(p), int(s)) for p, s in roots]


def set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _my_children(ssh_only: bool = False) -> list[int]:
    me = os.getpid()
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    s = f.read()
            except OSError:
                continue
            if int(s[s.rindex(")") + 2:].split()[1]) == me:
                if ssh_only:
                    try:
                        cmd = open(f"/proc/{d}/cmdline", "rb").read()
                    except OSError:
                        continue
                    # ssh ControlPersist masters; with Mitogen also its connection multiplexers (python
                    # children of ansible-playbook) and their ssh, should any outlive the playbook
                    if not (cmd.startswith(b"ssh") or b"ansible" in cmd or b"mitogen" in cmd):
                        continue
                kids.append(int(d))
    return kids


class TreeSampler:
    """Samples the command's live process tree every `interval` s (a thread): peak memory (sum of PSS from
    smaps_rollup, so the forked workers' shared pages count once), peak process count, and the own CPU (no
    children) of the ansible-playbook main process: the strategy loop, single-threaded, the serial part of a run."""

    def __init__(self, root: int, interval: float = 1.0):
        import threading
        self.root, self.interval = root, interval
        self.peak_pss_kib = self.peak_procs = 0
        self.main_cpu_ticks = 0
        self._main: int | None = None
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        table: dict[int, tuple[int, int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        st = f.read()
                except OSError:
                    continue
                rest = st[st.rindex(")") + 2:].split()
                table[int(d)] = (int(rest[1]), int(rest[11]) + int(rest[12]))
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        tree, stack = [], [self.root]
        while stack:
            pid = stack.pop()
            tree.append(pid)
            stack.extend(children.get(pid, []))
        pss = 0
        for pid in tree:
            try:
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    pss += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
            except (OSError, StopIteration):
                continue
            if self._main is None:
                try:
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                except OSError:
                    continue
                if any(c.endswith(b"ansible-playbook") for c in cmd[:2]):
                    self._main = pid
        self.peak_pss_kib = max(self.peak_pss_kib, pss)
        self.peak_procs = max(self.peak_procs, len(tree))
        if self._main in table:
            self.main_cpu_ticks = table[self._main][1]

    def stop(self) -> dict:
        self._stop.set()
        self._t.join()
        return {"controller_peak_pss_mib": round(self.peak_pss_kib / 1024, 1), "controller_peak_procs": self.peak_procs,
                "playbook_main_cpu_s": round(self.main_cpu_ticks / CLK, 2)}


def run_measured(argv: list[str], *, env: dict[str, str], cwd: Path, rack: str | None = None,
                 stdout_path: Path | None = None) -> dict:
    """Run argv as the controller; return wall/controller/machine/rack CPU, peak memory, the ansible-playbook
    main process's own CPU (TreeSampler) and the exit code."""
    before = set(_my_children())
    set_subreaper(True)
    roots = rack_roots(rack) if rack else []
    r0 = tree_cpu_seconds(roots) if roots else 0.0
    m0 = machine_busy_seconds()
    t0 = time.monotonic()
    out = open(stdout_path, "w") if stdout_path else subprocess.DEVNULL
    try:
        p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        sampler = TreeSampler(p.pid)
        _, status, ru = os.wait4(p.pid, 0)
        sampled = sampler.stop()
        p.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if stdout_path:
            out.close()
    wall = time.monotonic() - t0
    cpu = ru.ru_utime + ru.ru_stime
    # daemonized leftovers of this command (ssh ControlPersist masters) re-parented to us: end them, add their CPU.
    # Only ssh processes that were not our children before: a rack brought up by this process has its host
    # supervisors re-parented here too, and those must be left alone.
    set_subreaper(False)
    orphans = [p for p in _my_children(ssh_only=True) if p not in before]
    for pid in orphans:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    orphan_cpu = 0.0
    for pid in orphans:
        try:
            _, _, oru = os.wait4(pid, 0)
            orphan_cpu += oru.ru_utime + oru.ru_stime
        except ChildProcessError:
            pass
    r1 = settled_tree_cpu_seconds(roots) if roots else 0.0
    m1 = machine_busy_seconds()
    return {
        "rc": p.returncode,
        "wall_s": round(wall, 2),
        **sampled,
        "controller_cpu_s": round(cpu + orphan_cpu, 2),
        "controller_ssh_masters_cpu_s": round(orphan_cpu, 2),
        "ssh_masters": len(orphans),
        "rack_cpu_s": round(r1 - r0, 2),
        "attributed_machine_cpu_s": round(cpu + orphan_cpu + r1 - r0, 2),
        "machine_cpu_s": round(m1 - m0, 2),
    }


CALLBACK_NAME = "pv_bench_count"
CALLBACK_SOURCE = r'''
"""Counts module executions per host and profiles tasks (written by benchmarks/_measure.py)."""
import json
import os
import time
from collections import Counter, defaultdict

from ansible.plugins.callback import CallbackBase

CONTROLLER_ONLY = {"assert", "debug", "set_fact", "include_vars", "meta", "fail", "add_host", "group_by",
                   "include_tasks", "import_tasks", "include_role", "import_role", "pause", "set_stats",
                   "validate_argument_spec", "fact"}


def _short(action):
    for prefix in ("ansible.builtin.", "ansible.legacy."):
        if action.startswith(prefix):
            return action[len(prefix):]
    return action


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "pv_bench_count"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.per_host = defaultdict(Counter)
        self.tasks = []
        self._cur = None

    def _cpu(self):
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def _start(self, task):
        now, cpu = time.monotonic(), self._cpu()
        if self._cur is not None:
            self._cur["wall_s"] = round(now - self._cur.pop("_t0"), 3)
            self._cur["cpu_s"] = round(cpu - self._cur.pop("_c0"), 3)
        self._cur = {"task": task.get_name(), "role": task._role.get_name() if task._role else "",
                     "action": _short(task.action), "module_runs": 0, "_t0": now, "_c0": cpu}
        self.tasks.append(self._cur)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._start(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._start(task)

    def _count(self, result):
        task = result._task
        action = _short(task.action)
        if action in CONTROLLER_ONLY:
            return
        if task.loop and "results" in result._result:
            return  # the loop's items were counted one by one
        self.per_host[result._host.get_name()][action] += 1
        if self._cur is not None:
            self._cur["module_runs"] += 1

    v2_runner_on_ok = v2_runner_on_failed = v2_runner_item_on_ok = v2_runner_item_on_failed = \
        lambda self, result, *a, **k: self._count(result)

    def v2_playbook_on_stats(self, stats):
        if self._cur is not None and "_t0" in self._cur:
            self._cur["wall_s"] = round(time.monotonic() - self._cur.pop("_t0"), 3)
            self._cur["cpu_s"] = round(self._cpu() - self._cur.pop("_c0"), 3)
        out = os.environ.get("PV_BENCH_COUNT_OUT")
        if out:
            with open(out, "w") as f:
                json.dump({"per_host": {h: dict(c) for h, c in self.per_host.items()}, "tasks": self.tasks}, f,
                          indent=1)
'''


def callback_env(workdir: Path, out_file: Path) -> dict[str, str]:
    """Environment that enables the counting callback (plugin written into workdir) and points it at out_file."""
    plug = workdir / "callback_plugins"
    plug.mkdir(parents=True, exist_ok=True)
    (plug / f"{CALLBACK_NAME}.py").write_text(CALLBACK_SOURCE)
    return {"ANSIBLE_CALLBACK_PLUGINS": str(plug), "ANSIBLE_CALLBACKS_ENABLED": CALLBACK_NAME,
            "PV_BENCH_COUNT_OUT": str(out_file)}


def read_counts(out_file: Path) -> dict:
    """Module executions per host (mean, min, max over hosts), by action, and the task profile."""
    if not out_file.is_file():
        return {}
    d = json.loads(out_file.read_text())
    per_host = {h: sum(c.values()) for h, c in d["per_host"].items()}
    by_action: dict[str, int] = {}
    for c in d["per_host"].values():
        for a, n in c.items():
            by_action[a] = by_action.get(a, 0) + n
    n = max(len(per_host), 1)
    return {
        "module_runs_per_host": round(sum(per_host.values()) / n, 1),
        "module_runs_per_host_min_max": [min(per_host.values(), default=0), max(per_host.values(), default=0)],
        "module_runs_by_action_per_host": {a: round(v / n, 2) for a, v in sorted(by_action.items())},
        "tasks": d.get("tasks", []),
    }


def emit(result: dict, path: Path | None) -> None:
    """A benchmark's result: indented JSON on stdout, and into `path` (--json) when given."""
    text = json.dumps(result, indent=1)
    if path:
        path.write_text(text + "\n")
    print(text)


def scratch(prefix: str) -> Path:
    base = Path(os.environ.get("ANSIBLE_BENCH_DIR", tempfile.gettempdir())) / prefix
    base.mkdir(parents=True, exist_ok=True)
    return base
