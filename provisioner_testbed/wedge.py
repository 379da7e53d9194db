"""A wedged vLLM engine on the simulated rack, and a paced client that keeps timestamps (tests/vllm and
benchmarks/wedge_bench.py): SIGSTOP of a head's engine processes (`VLLM::EngineCore`, `VLLM::Worker*`) while the API
server keeps answering `/health` 200 (vLLM issues #39863, #16259), SIGCONT to undo it, and the balancer's live view of
a server (its `down` mark in the nginx file the active check writes)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

ENGINE = "^VLLM::(EngineCore|Worker)"
LB_CONF = "/etc/nginx/conf.d/vllm-lb.conf"


class Ssh(Protocol):
    def ssh(self, host: str, command: str, *, timeout: float = ...) -> Any: ...


def signal_engine(rack: Ssh, host: str, sig: str) -> list[int]:
    """Send `sig` (STOP or CONT) to the engine processes on `host`; their pids (by process title, one exec)."""
    r = rack.ssh(host, f"p=$(pgrep -f '{ENGINE}'); [ -n \"$p\" ] && kill -{sig} $p; echo $p", timeout=30)
    return [int(p) for p in r.stdout.split()]


ROLE_DEFAULTS = Path(__file__).resolve().parents[1] / "roles/serving_lb/defaults/main.yml"


def role_default(var: str) -> Any:
    """A serving_lb default as the role's defaults/main.yml has it (a testbed rack's inventory may override it)."""
    import yaml

    return yaml.safe_load(ROLE_DEFAULTS.read_text())[var]


@contextlib.contextmanager
def balancer_vars(inventory: str, lb: str, **values: object) -> Iterator[None]:
    """The balancer host provisioned with these values (`-e`) for the block, then with the inventory's own again: a
    bench's probe bound, or the role's default check interval on a testbed rack (its inventory slows the check)."""
    run = [str(Path(sys.executable).parent / "provision"), "run", inventory, "--limit", lb]
    extra = [a for k, v in values.items() for a in ("-e", f"{k}={v}")]
    p = subprocess.run([*run, *extra], capture_output=True, text=True, timeout=1800, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"`provision run --limit {lb}` with {values} failed:\n{(p.stdout + p.stderr)[-3000:]}")
    try:
        yield
    finally:
        q = subprocess.run(run, capture_output=True, text=True, timeout=1800, check=False)
        if q.returncode != 0:
            print(f"restoring {lb} failed:\n{(q.stdout + q.stderr)[-3000:]}", file=sys.stderr)


def head_server(inventory: str, host: str) -> str:
    """"addr:port" of head `host` as the balancer lists it: its address and its cluster's vLLM port."""
    from provisioner.inventory import load_fleet

    fleet = load_fleet(Path(inventory))
    cluster = next(c for c in fleet.clusters.values() if c.head == host)
    return f"{fleet.hosts[host].address}:{int(cluster.settings.get('port', 8000))}"


def marked_down(rack: Ssh, lb: str, server: str) -> bool:
    """The balancer's live file has `server` (addr:port) marked `down`."""
    r = rack.ssh(lb, f"grep -F 'server {server} ' {LB_CONF}", timeout=30)
    return r.returncode == 0 and " down;" in r.stdout


def check_runs(rack: Ssh, lb: str, since: float) -> list[tuple[float, dict]]:
    """The balancer's active check runs on `lb` since `since` (epoch s): (time, its JSON line) each (its journal)."""
    r = rack.ssh(lb, f"journalctl -u vllm-lb-healthcheck.service -o short-unix --no-pager --since @{int(since)}",
                 timeout=60)
    out = []
    for line in r.stdout.splitlines():
        head, _, rest = line.partition(" ")
        i = rest.find("{")
        if i < 0:
            continue
        try:
            out.append((float(head), json.loads(rest[i:])))
        except ValueError:
            continue
    return out


def wait_for(pred: Any, timeout: float, poll: float = 0.5) -> float | None:
    """Seconds until pred() is true (None after `timeout`)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(poll)
    return None


def post(url: str, body: dict[str, Any], key: str, timeout: float) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - the rack's balancer
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


@dataclass
class Request:
    start: float  # time.monotonic()
    end: float
    code: int


@dataclass
class Client:
    """`threads` threads sending completions to `url` (the balancer), each at most one per `period` seconds (paced:
    vLLM's CPU workers spin after every message), every request's start/end/status kept; `timeout` bounds each."""

    url: str
    key: str
    body: dict[str, Any]
    threads: int = 2
    period: float = 2.0
    timeout: float = 60.0
    done: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._ts = [threading.Thread(target=self._loop, args=(i * self.period / self.threads,), daemon=True)
                    for i in range(self.threads)]

    def _loop(self, offset: float) -> None:
        self._stop.wait(offset)
        while not self._stop.is_set():
            t0 = time.monotonic()
            code, _ = post(self.url + "/v1/completions", self.body, self.key, self.timeout)
            self.done.append(Request(t0, time.monotonic(), code))
            self._stop.wait(max(0.0, self.period - (time.monotonic() - t0)))

    def __enter__(self) -> Client:
        for t in self._ts:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._ts:
            t.join(timeout=self.timeout + 10)

    def between(self, t0: float, t1: float) -> list[Request]:
        """Requests that started in [t0, t1)."""
        return [r for r in list(self.done) if t0 <= r.start < t1]

    def in_flight(self, t: float) -> list[Request]:
        return [r for r in list(self.done) if r.start <= t < r.end]


@dataclass
class Wedge:
    """One wedge of `host`'s engine and its undoing, with the balancer's reaction times (monotonic clock)."""

    stopped_at: float
    out_s: float | None = None  # SIGSTOP -> the balancer's file marks the server down
    resumed_at: float | None = None
    back_s: float | None = None  # SIGCONT -> the mark is gone
    health_while_wedged: int | None = None  # GET /health of the wedged head while out (the liveness hint)
    pids: list[int] = field(default_factory=list)


def wedge_cycle(rack: Ssh, host: str, lb: str, server: str, *, bound: float = 180, hold: float = 3,
                health_url: str | None = None) -> Wedge:
    """SIGSTOP the engine of `host`, wait until the balancer marks `server` down (at most `bound` s), keep it
    wedged `hold` s more, SIGCONT, wait until it is back. Always resumes the engine."""
    w = Wedge(time.monotonic())
    w.pids = signal_engine(rack, host, "STOP")
    try:
        w.out_s = wait_for(lambda: marked_down(rack, lb, server), bound)
        if health_url:
            try:
                with urllib.request.urlopen(health_url, timeout=10) as r:  # noqa: S310 - the rack's head
                    w.health_while_wedged = r.status
            except urllib.error.HTTPError as e:
                w.health_while_wedged = e.code
            except (urllib.error.URLError, OSError):
                w.health_while_wedged = 0
        time.sleep(hold)
    finally:
        w.resumed_at = time.monotonic()
        signal_engine(rack, host, "CONT")
    w.back_s = wait_for(lambda: not marked_down(rack, lb, server), bound)
    return w
