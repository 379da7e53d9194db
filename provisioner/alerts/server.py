"""The receiver's HTTP service and its one worker.

POST /alerts (Alertmanager's webhook_config, `Authorization: Bearer TOKEN`): each alert decided (payload.decide),
an acting one recorded (store) and queued; the answer comes at once (Alertmanager's timeout is short). Requests are
handled in threads, but their alerts pass the decision and the claim one at a time (one intake lock), so two
requests never both act on one alert. The worker runs, one host at a time from the queue: `provision health
INVENTORY --limit HOST`, then `provision remediate INVENTORY --limit HOST` (+ `--source alert --alert-key KEY` where
remediate offers them): remediate acts on the ledger's newest health results, so an alert whose fault has already
cleared acts on nothing. Under a storm, alerts for a host that already waits in the queue join it (`coalesced`):
one health + remediate answers them all (each alert is still recorded and finished once, with that action's
outcome); an alert arriving while its host's action runs waits for the next one. The resolve of an alert it acted
on queues the same pair once more (the return: the policy returns a node whose health passes). GET /metrics:
counters and a histogram of the action's duration. One log line per alert, one per action.
"""

from __future__ import annotations

import hmac
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from provisioner.alerts.payload import Alert, PayloadError, decide, parse, safe
from provisioner.alerts.store import Store

MAX_BODY = 1 << 20
#: Buckets of provisioner_receiver_action_seconds (health + remediate, a drain included).
BUCKETS = (5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0, 600.0)
OUTCOMES = ("act", "coalesced", "resolved", "not an acting alert", "duplicate", "unknown host")

#: (host, key) -> (ok, detail): what acting on one alert means.
Action = Callable[[str, str], tuple[bool, str]]


def log(line: str) -> None:
    sys.stderr.write(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + line + "\n")
    sys.stderr.flush()


def resolved_key(key: str) -> str:
    """The key the return after an alert's resolve acts under (the ledger acts on one key once)."""
    return key + "/resolved"


def remediate_alert_args(key: str) -> list[str]:
    """What tells `provision remediate` the alert it acts for: the source (rails and incidents record it) and the
    alert's key (the ledger acts on one key once, whichever receiver or controller sees it)."""
    return ["--source", "alert", "--alert-key", key]


def health_then_remediate(provision: str, inventory: Path, timeout: float = 1800.0) -> Action:
    """The action: the node's health gate (its result is the ledger's newest), then the policy on it."""

    def act(host: str, key: str) -> tuple[bool, str]:
        parts = []
        for argv in ([provision, "health", str(inventory), "--limit", host],
                     [provision, "remediate", str(inventory), "--limit", host, *remediate_alert_args(key)]):
            try:
                p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                return False, f"{argv[1]} timed out after {timeout:.0f} s"
            parts.append(f"{argv[1]} rc={p.returncode}")
            if argv[1] == "remediate":
                tail = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()][-3:]
                parts += tail
                return p.returncode == 0, "; ".join(parts)
        return False, "; ".join(parts)

    return act


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.alerts = dict.fromkeys(OUTCOMES, 0)
        self.actions = {"ok": 0, "failed": 0}
        self.buckets = [0] * len(BUCKETS)
        self.sum = 0.0
        self.requests = {"accepted": 0, "unauthorized": 0, "bad request": 0}
        self.queued = 0

    def observe(self, seconds: float, ok: bool) -> None:
        with self.lock:
            self.actions["ok" if ok else "failed"] += 1
            self.sum += seconds
            for i, b in enumerate(BUCKETS):
                if seconds <= b:
                    self.buckets[i] += 1

    def render(self) -> str:
        with self.lock:
            n = sum(self.actions.values())
            out = ["# HELP provisioner_receiver_alerts_total Alerts received, by what the receiver did with them.",
                   "# TYPE provisioner_receiver_alerts_total counter"]
            out += [f'provisioner_receiver_alerts_total{{outcome="{k}"}} {v}' for k, v in self.alerts.items()]
            out += ["# HELP provisioner_receiver_requests_total Webhook requests, by answer.",
                    "# TYPE provisioner_receiver_requests_total counter"]
            out += [f'provisioner_receiver_requests_total{{result="{k}"}} {v}' for k, v in self.requests.items()]
            out += ["# HELP provisioner_receiver_actions_total Health + remediate runs, by result.",
                    "# TYPE provisioner_receiver_actions_total counter"]
            out += [f'provisioner_receiver_actions_total{{result="{k}"}} {v}' for k, v in self.actions.items()]
            out += ["# HELP provisioner_receiver_queue Alerts accepted and not yet acted on.",
                    "# TYPE provisioner_receiver_queue gauge", f"provisioner_receiver_queue {self.queued}",
                    "# HELP provisioner_receiver_action_seconds Alert accepted to health + remediate finished.",
                    "# TYPE provisioner_receiver_action_seconds histogram"]
            out += [f'provisioner_receiver_action_seconds_bucket{{le="{b:g}"}} {c}'
                    for b, c in zip(BUCKETS, self.buckets, strict=True)]
            out += [f'provisioner_receiver_action_seconds_bucket{{le="+Inf"}} {n}',
                    f"provisioner_receiver_action_seconds_sum {self.sum:.3f}",
                    f"provisioner_receiver_action_seconds_count {n}"]
            return "\n".join(out) + "\n"


class Receiver:
    """The state the handler and the worker share."""

    def __init__(self, *, token: str, gpu_nodes: Collection[str], store: Store, action: Action,
                 day2_metrics: Callable[[], str] | None = None) -> None:
        self.token, self.gpu_nodes, self.store, self.action = token, frozenset(gpu_nodes), store, action
        self.metrics = Metrics()
        self.day2_metrics = day2_metrics  # the site's incidents and breaker (the ledger's), appended to /metrics
        self.intake = threading.Lock()  # decide + claim + enqueue, one alert at a time
        # host -> [(key, name, accepted)] waiting for the host's next action (the first one is the queue's entry)
        self.pending: dict[str, list[tuple[str, str, float]]] = {}
        self.queue: queue.Queue[str | None] = queue.Queue()
        for key, host, name in store.unfinished():  # accepted before a restart, never finished
            log(f"alert {safe(key)} {safe(name)} host={safe(host)}: accepted before the restart, acting now")
            self._enqueue(key, host, name)
        self.worker = threading.Thread(target=self._work, name="receiver-worker", daemon=True)
        self.worker.start()

    def _enqueue(self, key: str, host: str, name: str) -> bool:
        """Queue the alert; True when it starts a new action, False when it joins its host's waiting one."""
        with self.metrics.lock:
            self.metrics.queued += 1
        waiting = self.pending.get(host)
        if waiting is not None:
            waiting.append((key, name, time.monotonic()))
            return False
        self.pending[host] = [(key, name, time.monotonic())]
        self.queue.put(host)
        return True

    def authorized(self, header: str | None) -> bool:
        scheme, _, cred = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(cred.strip().encode(), self.token.encode())

    def receive(self, doc: Any) -> int:
        """Decide every alert of one webhook body; return how many were queued (new actions and coalesced)."""
        queued = 0
        for a in parse(doc):
            with self.intake:
                d = decide(a, self.gpu_nodes, () if not self.store.seen(a.key) else (a.key,))
                why = d.why
                if d.act and not self.store.claim(a.key, a.host, a.name):
                    why = "duplicate"  # recorded since the check above (a restart's replay): acted on once
                if why == "act" and not self._enqueue(a.key, a.host, a.name):
                    why = "coalesced"
            with self.metrics.lock:
                self.metrics.alerts[why] += 1
            if why == "resolved" and self._return_on_resolve(a):
                queued += 1
                continue
            log(f"alert {safe(a.key)} {safe(a.name)} host={safe(a.host)} status={a.status}: "
                + {"act": "queued: health + remediate",
                   "coalesced": "queued: joins the host's waiting health + remediate"}.get(why, f"no action ({why})"))
            if why in ("act", "coalesced"):
                queued += 1
        return queued

    def _return_on_resolve(self, a: Alert) -> bool:
        """The resolve of an alert this receiver acted on queues the node's way back, once: health + remediate
        again (key KEY/resolved), whose policy returns a node whose health now passes (its cluster relaunched and
        back into the balancer, the incident's returned_at set) and does nothing to one still failing. A resolve
        of an alert it never acted on changes nothing."""
        if a.labels.get("remediate") != "true" or a.host not in self.gpu_nodes or not self.store.seen(a.key):
            return False
        key = resolved_key(a.key)
        with self.intake:
            if not self.store.claim(key, a.host, a.name):
                return False
            joined = not self._enqueue(key, a.host, a.name)
        log(f"alert {safe(a.key)} {safe(a.name)} host={safe(a.host)} status=resolved: "
            + ("queued: joins the host's waiting health + remediate (the return)" if joined
               else "queued: health + remediate (the return)"))
        return True

    def _work(self) -> None:
        while True:
            host = self.queue.get()
            if host is None:
                return
            with self.intake:  # what waits for this host now is answered by this action; later alerts queue again
                alerts = self.pending.pop(host, [])
            if not alerts:
                continue
            key, name, t0 = alerts[0]
            try:
                ok, detail = self.action(host, key)
            except Exception as exc:  # the worker must outlive one bad action
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            seconds = time.monotonic() - t0
            self.store.finish(key, "done" if ok else "failed", detail)
            for other, _, _ in alerts[1:]:
                self.store.finish(other, "done" if ok else "failed", f"with {key}: {detail}")
            self.metrics.observe(seconds, ok)
            with self.metrics.lock:
                self.metrics.queued -= len(alerts)
            log(f"action {safe(key)} {safe(name)} host={safe(host)}"
                + (f" (+{len(alerts) - 1} coalesced)" if len(alerts) > 1 else "")
                + f": {'done' if ok else 'FAILED'} in {seconds:.1f} s ({safe(detail, 400)})")

    def render_day2(self) -> str:
        """The site's incidents, open incidents, breaker and waiting recommendations (read from the ledger, so the
        breaker alert fires from here); a ledger that cannot be read is a gauge at 0, never a failed scrape."""
        if self.day2_metrics is None:
            return ""
        ok = 1
        try:
            text = self.day2_metrics()
        except Exception as exc:  # the scrape must answer: say it in the gauge and the journal
            log(f"metrics: the ledger cannot be read ({safe(str(exc), 200)})")
            text, ok = "", 0
        return (text + "# HELP provisioner_receiver_ledger_readable 1 when the ledger's day-2 state could be read.\n"
                "# TYPE provisioner_receiver_ledger_readable gauge\n"
                f"provisioner_receiver_ledger_readable {ok}\n")

    def idle(self) -> bool:
        with self.metrics.lock:
            return self.metrics.queued == 0

    def stop(self) -> None:
        self.queue.put(None)
        self.worker.join(timeout=5)


def handler_for(rx: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "provisioner-receiver"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # one line per alert instead (Receiver.receive)
            pass

        def _answer(self, code: int, body: str, ctype: str = "application/json") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            if code == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="provisioner-receiver"')
            self.end_headers()
            self.wfile.write(data)

        def _count(self, result: str) -> None:
            with rx.metrics.lock:
                rx.metrics.requests[result] += 1

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._answer(200, rx.metrics.render() + rx.render_day2(), "text/plain; version=0.0.4")
            elif self.path == "/healthz":
                self._answer(200, '{"ok": true}')
            else:
                self._answer(404, '{"error": "not found"}')

        def do_POST(self) -> None:
            if self.path != "/alerts":
                self._answer(404, '{"error": "not found"}')
                return
            if not rx.authorized(self.headers.get("Authorization")):
                self._count("unauthorized")
                log(f"request from {self.client_address[0]}: 401 (no or wrong bearer token)")
                self._answer(401, '{"error": "unauthorized"}')
                return
            try:
                length = int(self.headers.get("Content-Length") or "0")
            except ValueError:
                length = -1
            if not 0 < length <= MAX_BODY:
                self._count("bad request")
                self._answer(400, '{"error": "Content-Length missing or over 1 MiB"}')
                return
            try:
                queued = rx.receive(json.loads(self.rfile.read(length)))
            except (ValueError, PayloadError) as exc:  # JSONDecodeError is a ValueError
                self._count("bad request")
                log(f"request from {self.client_address[0]}: 400 ({safe(str(exc), 200)})")
                self._answer(400, json.dumps({"error": safe(str(exc), 200)}))
                return
            self._count("accepted")
            self._answer(200, json.dumps({"queued": queued}))

    return Handler


def serve(rx: Receiver, host: str, port: int) -> ThreadingHTTPServer:
    """Bind (raises OSError) and return the server; the caller runs serve_forever()."""
    srv = ThreadingHTTPServer((host, port), handler_for(rx))
    srv.daemon_threads = True
    return srv
