"""A rack's on-disk state (what `up` created, so `down` can remove it even after a crash) and tracked processes.

Layout, per rack NAME (override the root with `PROVISIONER_TESTBED_STATE`):
    /var/lib/provisioner-testbed/racks/NAME/state.json      this file (written atomically)
    /var/lib/provisioner-testbed/racks/NAME/ssh/            testbed keypair + known_hosts
    /var/lib/provisioner-testbed/racks/NAME/hosts/HOST/     upper/ work/ root/ (overlay) hwsim/ spec.json boot.log
    /var/lib/provisioner-testbed/racks/NAME/proxy/          tinyproxy config + log
    /var/lib/provisioner-testbed/racks/NAME/serve.log       the repo HTTP server's log
Processes are tracked by pid AND start time (field 22 of /proc/PID/stat) so a recycled pid is never signalled.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_STATE_ROOT = Path("/var/lib/provisioner-testbed")
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,15}$")


def state_root() -> Path:
    return Path(os.environ.get("PROVISIONER_TESTBED_STATE", str(DEFAULT_STATE_ROOT)))


def racks_dir() -> Path:
    return state_root() / "racks"


def rack_dir(name: str) -> Path:
    return racks_dir() / name


@dataclass(frozen=True)
class Proc:
    """A process we started: pid + kernel start time (clock ticks since boot)."""

    pid: int
    start: int

    @staticmethod
    def of(pid: int) -> Proc | None:
        st = proc_start_time(pid)
        return Proc(pid, st) if st is not None else None

    def alive(self) -> bool:
        return self.pid > 0 and proc_start_time(self.pid) == self.start and not _is_zombie(self.pid)

    def signal(self, sig: int) -> bool:
        if not self.alive():
            return False
        try:
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def to_json(self) -> list[int]:
        return [self.pid, self.start]

    @staticmethod
    def from_json(v: Any) -> Proc | None:
        if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v):
            return Proc(v[0], v[1])
        return None


def proc_start_time(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces/parens: split after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return int(rest[19])  # field 22 overall
    except (IndexError, ValueError):
        return None


def _is_zombie(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return raw[raw.rfind(")") + 2 :].split()[0] in ("Z", "X")


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                out += [int(x) for x in (task / "children").read_text().split()]
            except OSError:
                continue
    except OSError:
        pass
    return out


def cmdline(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def pids_with_arg_under(prefix: str) -> list[int]:
    """Pids whose command line has an argument containing `prefix` (a rack's own directory: only ours match)."""
    me = os.getpid()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        if any(prefix in a for a in cmdline(int(d.name))):
            out.append(int(d.name))
    return out


def wait_gone(procs: list[Proc], timeout: float) -> list[Proc]:
    """Wait until every process exited (reaping our children); return those still alive."""
    deadline = time.monotonic() + timeout
    left = [p for p in procs if p.alive()]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        for p in left:
            try:
                os.waitpid(p.pid, os.WNOHANG)
            except ChildProcessError:
                pass
        left = [p for p in left if p.alive()]
    return left


def terminate(procs: list[Proc], grace: float = 10.0) -> None:
    """SIGTERM, wait `grace`, then SIGKILL what is left."""
    for p in procs:
        p.signal(signal.SIGTERM)
    left = wait_gone(procs, grace)
    for p in left:
        p.signal(signal.SIGKILL)
    wait_gone(left, 5.0)


@dataclass
class HostState:
    name: str
    machine: str  # nspawn machine name (unique across racks: the veth is named after it)
    address: str
    index: int  # 1-based
    nspawn: list[int] | None = None  # Proc.to_json of systemd-nspawn
    host_key: str = ""  # "ssh-ed25519 AAAA..." public host key
    role: str = "node"  # "node": a GPU node (group gpu_nodes); "balancer": a plain host in group lb (lb01..)
    lowers: list[str] | None = None  # its own overlay lowers (a bare host on a vLLM rack: base only); None: the rack's

    @property
    def proc(self) -> Proc | None:
        return Proc.from_json(self.nspawn)


@dataclass
class RackState:
    name: str
    index: int  # subnet index: 198.18.0.0/15 split in /24s, 0 = 198.18.0.0/24
    bridge: str
    gateway: str  # controller address on the bridge
    prefix: int
    nodes: int
    with_vllm: bool = False
    balancers: int = 0  # plain hosts after the nodes (lb01..), in the inventory's group lb
    clusters: bool = True  # the inventory declares vLLM cluster groups (a plain rack: only when asked)
    spec_file: str | None = None
    lowers: list[str] = field(default_factory=list)  # overlay lower dirs, top first
    inventory: str = ""
    repo_url: str = ""  # plain HTTP (test tools, the EFA installer)
    repo_tls_url: str = ""  # the same over HTTPS, signed by the rack's repo CA: what the inventory names ("" before)
    proxy: list[int] | None = None
    serve: list[int] | None = None
    hosts: list[HostState] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    complete: bool = False  # True once `up` finished
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase of the last create

    @property
    def dir(self) -> Path:
        return rack_dir(self.name)

    def host(self, name: str) -> HostState | None:
        return next((h for h in self.hosts if h.name == name), None)

    def save(self) -> None:
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, d / "state.json")

    @staticmethod
    def load(name: str) -> RackState | None:
        p = rack_dir(name) / "state.json"
        try:
            raw = json.loads(p.read_text())
        except (OSError, ValueError):
            return None
        try:
            hosts = [HostState(**h) for h in raw.pop("hosts", [])]
            return RackState(hosts=hosts, **raw)
        except TypeError:
            return None


def rack_names() -> list[str]:
    """Every rack with a directory (complete, half-built or crashed)."""
    d = racks_dir()
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if p.is_dir() and NAME_RE.match(p.name))
