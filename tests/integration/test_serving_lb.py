"""The serving edge for real: roles/serving_lb renders the nginx config (the same bytes as the CLI), `nginx -t`
accepts it, and a real nginx on 127.0.0.1 in front of tiny HTTP stubs on 127.0.0.2-4 proves least_conn, routing by
the request's model field, unbuffered SSE, failover, upstream keepalive, the active /health check, and that the
API key is forwarded but never logged.

Needs the nginx binary and the njs module (Debian: nginx-light or nginx, libnginx-mod-http-js); no root install:
nginx runs from a temporary prefix.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from provisioner import PROJECT_ROOT, ROLES, TEMPLATES
from provisioner.inventory import load_fleet
from provisioner.monitoring import render_lb_config

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
NJS_MODULE = next(
    (p for p in ("/usr/lib/nginx/modules/ngx_http_js_module.so", "/usr/share/nginx/modules/ngx_http_js_module.so")
     if os.path.exists(p)),
    None,
)
# Skipped on a developer machine without them; in CI (CI=true, .ci/run installs them) a missing one fails loudly.
if not os.path.exists(NGINX) or NJS_MODULE is None:
    if os.environ.get("CI"):
        raise RuntimeError("CI needs nginx and its njs module: apt-get install nginx-light libnginx-mod-http-js")
    pytest.skip("needs nginx and its njs module (apt-get install nginx-light libnginx-mod-http-js)",
                allow_module_level=True)
VENV_BIN = Path(sys.executable).parent
SECRET = "sk-test-9f8e7d6c5b4a-DO-NOT-LOG"


# --- stub vLLM heads -------------------------------------------------------------------------------------------
class Stub(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, name: str, addr: tuple[str, int]) -> None:
        self.name = name
        self.requests: list[dict] = []  # what this head received
        self.active = 0
        self.healthy = True
        self.answer = " jumps over"  # choices[0].text of every completion (the generation probe compares it)
        self.stall = 0.0  # seconds a completion takes (a wedged engine: /health still answers)
        self.error = 0  # HTTP status of every completion when set (an engine that died: vLLM's 500/503)
        self.tokens = 100.0  # vllm:generation_tokens_total on /metrics (flat: a stopped engine core)
        self.generating = False  # True: the counter advances between two reads of /metrics (busy for others)
        self.lock = threading.Lock()
        super().__init__(addr, Handler)
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keepalive from nginx's upstream pool
    server: Stub

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, code: int, body: dict | str, ctype: str = "application/json") -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self._send(200 if self.server.healthy else 503, "")
            return
        if self.path == "/metrics":  # what vLLM's API server exposes (no key), a few lines of it
            with self.server.lock:
                if self.server.generating:
                    self.server.tokens += 7
                tokens = self.server.tokens
            self._send(200, "# TYPE vllm:generation_tokens counter\n"
                            f'vllm:generation_tokens_total{{engine="0",model_name="llama"}} {tokens}\n'
                            f'vllm:generation_tokens_created{{engine="0",model_name="llama"}} 1.7e9\n'
                            'vllm:num_requests_running{engine="0",model_name="llama"} 3.0\n', "text/plain")
            return
        self._record(None)
        self._send(200, {"served_by": self.server.name, "path": self.path})

    def _record(self, body: dict | None) -> None:
        with self.server.lock:
            self.server.requests.append({
                "path": self.path,
                "auth": self.headers.get("Authorization"),
                "client_port": self.client_address[1],
                "model": (body or {}).get("model"),
            })

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self._record(body)
        with self.server.lock:
            self.server.active += 1
        try:
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(3):
                    self._chunk(f"data: {json.dumps({'i': i, 'served_by': self.server.name})}\n\n")
                    time.sleep(float(body.get("gap", 1.0)))
                self._chunk("data: [DONE]\n\n")
                self._chunk("")
                return
            time.sleep(float(body.get("hold", 0)) + self.server.stall)
            if self.server.error:
                self._send(self.server.error, {"object": "error", "message": "engine dead"})
                return
            self._send(200, {"served_by": self.server.name, "model": body.get("model"),
                             "choices": [{"index": 0, "text": self.server.answer}]})
        finally:
            with self.server.lock:
                self.server.active -= 1

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the rendered balancer -------------------------------------------------------------------------------------
def inventory(path: Path, port_llama: int, port_qwen: int, lb_port: int) -> Path:
    """2 clusters serving `llama` (one of them 2 nodes: only its head is a backend) + 1 cluster serving `qwen`."""
    path.write_text(f"""\
[lb]
lb01 ansible_host=127.0.0.1 ansible_connection=local

[llama_a]
node01 ansible_host=127.0.0.2 node_rank=0
node02 ansible_host=127.0.0.5 node_rank=1

[llama_b]
node03 ansible_host=127.0.0.3 node_rank=0

[qwen]
node04 ansible_host=127.0.0.4 node_rank=0

[gpu_nodes:children]
llama_a
llama_b
qwen

[llama_a:vars]
vllm_cluster={{"model": "/opt/models/llama", "served_model_name": "llama", "port": {port_llama}}}

[llama_b:vars]
vllm_cluster={{"model": "/opt/models/llama", "served_model_name": "llama", "port": {port_llama}}}

[qwen:vars]
vllm_cluster={{"model": "/opt/models/qwen", "served_model_name": ["qwen", "qwen-latest"], "port": {port_qwen}}}

[lb:vars]
serving_lb_listen_address=127.0.0.1
serving_lb_listen_port={lb_port}
""")
    return path


def role_render(inv: Path, work: Path, **extra: object) -> Path:
    """Run the role's config tasks with real ansible-playbook into `work/etc` (no service management); returns the
    file the role rendered: with the active health check (the default) its source `work/state/vllm-lb.conf.in`,
    which the checker turns into the live file, otherwise the live file itself."""
    play = work / "render.yml"
    play.write_text(
        "- name: Render the balancer\n  hosts: lb\n  gather_facts: false\n  tasks:\n"
        "    - name: Role config tasks\n      ansible.builtin.include_role:\n"
        "        name: serving_lb\n        tasks_from: config.yml\n"
    )
    evars = {
        "ansible_python_interpreter": sys.executable,
        "serving_lb_manage_service": False,
        "serving_lb_conf_dir": str(work / "etc"),
        "serving_lb_conf_file": str(work / "etc" / "vllm-lb.conf"),
        "serving_lb_log_dir": str(work / "logs"),
        "serving_lb_check_bin": str(work / "nginx-check"),
        "serving_lb_nginx_bin": NGINX,
        "serving_lb_nginx_modules_include": str(work / "modules.conf"),
        "serving_lb_templates_dir": str(TEMPLATES),
        "serving_lb_state_dir": str(work / "state"),
        **extra,
    }
    (work / "logs").mkdir(exist_ok=True)
    (work / "modules.conf").write_text(f"load_module {NJS_MODULE};\n")
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(ROLES), PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_NOCOLOR="1")
    r = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inv), str(play), "-e", json.dumps(evars)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    if str(extra.get("serving_lb_active_health", True)).lower() in ("false", "no", "0", "off"):
        return work / "etc" / "vllm-lb.conf"
    assert not (work / "etc" / "vllm-lb.conf").exists()  # the checker writes the live file, not the template
    return work / "state" / "vllm-lb.conf.in"


def main_conf(work: Path, snippet: Path) -> Path:
    conf = work / "nginx.conf"
    conf.write_text(f"""\
load_module {NJS_MODULE};
worker_processes 2;
pid {work}/nginx.pid;
error_log {work}/logs/error.log warn;
events {{ worker_connections 256; }}
http {{
    client_body_temp_path {work}/tmp/body;
    proxy_temp_path {work}/tmp/proxy;
    include {snippet};
}}
""")
    (work / "tmp").mkdir(exist_ok=True)
    return conf


def nginx_t(conf: Path) -> subprocess.CompletedProcess:
    return subprocess.run([NGINX, "-t", "-c", str(conf)], capture_output=True, text=True, timeout=60)


class LB:
    def __init__(self, work: Path, lb_port: int, stubs: dict[str, Stub], conf: Path, snippet: Path) -> None:
        self.work, self.port, self.stubs, self.conf, self.snippet = work, lb_port, stubs, conf, snippet
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen([NGINX, "-c", str(self.conf), "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/lb-health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("nginx did not come up: " + (self.work / "logs" / "error.log").read_text())

    def reload(self) -> None:
        assert self.proc
        pid_before = self._worker_pids()
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self._worker_pids() & pid_before:
            time.sleep(0.1)

    def _worker_pids(self) -> set[int]:
        assert self.proc
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.proc.pid)], capture_output=True, text=True)
        return {int(x) for x in out.stdout.split()}

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def post(self, path: str, body: dict, auth: str | None = None, timeout: float = 20) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": auth} if auth else {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def served_by(self, n: int, model: str = "llama") -> list[str]:
        out = []
        for _ in range(n):
            code, body = self.post("/v1/completions", {"model": model, "prompt": "x"})
            assert code == 200, body
            out.append(body["served_by"])
        return out


@pytest.fixture(scope="module")
def lb(tmp_path_factory):
    work = tmp_path_factory.mktemp("lb")
    port_llama, port_qwen, lb_port = free_port(), free_port(), free_port()
    stubs = {
        "node01": Stub("node01", ("127.0.0.2", port_llama)),
        "node03": Stub("node03", ("127.0.0.3", port_llama)),
        "node04": Stub("node04", ("127.0.0.4", port_qwen)),
    }
    inv = inventory(work / "hosts.ini", port_llama, port_qwen, lb_port)
    snippet = role_render(inv, work)
    conf = main_conf(work, snippet)
    balancer = LB(work, lb_port, stubs, conf, snippet)
    balancer.inv = inv  # type: ignore[attr-defined]
    balancer.start()
    yield balancer
    balancer.stop()
    for s in stubs.values():
        try:
            s.stop()
        except OSError:
            pass


CHECKER = ROLES / "serving_lb" / "files" / "vllm-lb-healthcheck.py"


def run_check(lb: LB, source: Path, live: Path, *, timeout: float, probe: Path | None = None) -> dict:
    """The balancer's active check as its timer runs it (nginx -t with the test's nginx, no reload), `source` ->
    `live`: its JSON line."""
    r = subprocess.run([sys.executable, str(CHECKER), "--source", str(source), "--dest", str(live),
                        "--timeout", str(timeout), "--check-cmd", str(lb.work / "nginx-check"), "--reload-cmd", "",
                        *(["--probe", str(probe)] if probe else [])], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def reset(lb: LB) -> None:
    for s in lb.stubs.values():
        with s.lock:
            s.requests.clear()


# --- tests -----------------------------------------------------------------------------------------------------
def test_rendered_config_passes_nginx_t_and_matches_the_cli(lb):
    r = nginx_t(lb.conf)
    assert r.returncode == 0, r.stderr
    text = lb.snippet.read_text()
    # one upstream per model; llama across both cluster heads (not node02, a worker), qwen on its own head
    assert text.count("upstream vllm_model_") == 2
    assert "server 127.0.0.2:" in text and "server 127.0.0.3:" in text and "127.0.0.5" not in text
    for directive in ("least_conn;", "keepalive 32;", "proxy_read_timeout 300s;", "keepalive_timeout 60s;",
                      "proxy_buffering off;", "max_fails=3 fail_timeout=10s"):
        assert directive in text, directive
    # the CLI renders the same bytes from the Fleet model
    fleet = load_fleet(lb.inv)
    cli = render_lb_config(fleet, overrides={"serving_lb_conf_dir": str(lb.work / "etc"),
                                             "serving_lb_log_dir": str(lb.work / "logs")})
    assert cli == text


@pytest.mark.parametrize("extra", [
    {"serving_lb_balance": "hash"},
    {"serving_lb_route_by_model_field": False, "serving_lb_model_ports": {"qwen": 18999}},
])
def test_variants_pass_nginx_t(tmp_path, extra):
    inv = inventory(tmp_path / "hosts.ini", 18001, 18002, 18000)
    fleet = load_fleet(inv)
    (tmp_path / "etc" / "njs").mkdir(parents=True)
    shutil.copy(ROLES / "serving_lb" / "files" / "vllm-route.js", tmp_path / "etc" / "njs")
    (tmp_path / "logs").mkdir()
    snippet = tmp_path / "vllm-lb.conf"
    snippet.write_text(render_lb_config(fleet, overrides={"serving_lb_conf_dir": str(tmp_path / "etc"),
                                                          "serving_lb_log_dir": str(tmp_path / "logs"), **extra}))
    r = nginx_t(main_conf(tmp_path, snippet))
    assert r.returncode == 0, r.stderr
    text = snippet.read_text()
    if extra.get("serving_lb_balance") == "hash":
        assert "hash $http_authorization consistent;" in text and "least_conn;" not in text
    else:
        assert "js_content" not in text and "listen 127.0.0.1:18999;" in text


def test_routes_by_model_field_and_lists_models(lb):
    reset(lb)
    assert set(lb.served_by(4, "qwen-latest")) == {"node04"}
    assert set(lb.served_by(4, "qwen")) == {"node04"}
    assert set(lb.served_by(4, "llama")) <= {"node01", "node03"}
    code, body = lb.post("/v1/completions", {"model": "nope", "prompt": "x"})
    assert code == 404 and body["error"]["param"] == "model"
    with urllib.request.urlopen(lb.url + "/v1/models", timeout=5) as r:
        assert [m["id"] for m in json.loads(r.read())["data"]] == ["llama", "qwen"]
    # no model field (GET /version): the default model's upstream answers
    with urllib.request.urlopen(lb.url + "/version", timeout=5) as r:
        assert json.loads(r.read())["served_by"] in {"node01", "node03"}


def test_least_conn_sends_new_requests_to_the_idle_head(lb):
    reset(lb)
    results: list = []
    hold = threading.Thread(target=lambda: results.append(
        lb.post("/v1/completions", {"model": "llama", "prompt": "long", "hold": 3})))
    hold.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(s.active for s in lb.stubs.values()):
        time.sleep(0.05)
    busy = next(name for name, s in lb.stubs.items() if s.active)
    idle = {"node01": "node03", "node03": "node01"}[busy]
    # round robin would alternate; least_conn keeps choosing the head with no request in flight
    assert lb.served_by(6) == [idle] * 6
    hold.join()
    assert results and results[0][0] == 200 and results[0][1]["served_by"] == busy


def test_sse_is_streamed_unbuffered(lb):
    req = urllib.request.Request(lb.url + "/v1/completions", method="POST",
                                 data=json.dumps({"model": "qwen", "stream": True, "gap": 1.0}).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    arrivals = []
    with urllib.request.urlopen(req, timeout=20) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r:
            if line.startswith(b"data:"):
                arrivals.append((time.monotonic() - t0, line.strip()))
    assert [a[1] for a in arrivals][-1] == b"data: [DONE]"
    assert len(arrivals) == 4
    # the first event arrives while the stub is still generating (it sleeps 1 s between events)
    assert arrivals[0][0] < 0.8, arrivals
    assert arrivals[-1][0] >= 2.5, arrivals


def test_upstream_keepalive_reuses_connections(lb):
    reset(lb)
    lb.served_by(8, "qwen")
    ports = {r["client_port"] for r in lb.stubs["node04"].requests}
    assert len(lb.stubs["node04"].requests) == 8
    assert len(ports) <= 2, ports  # at most one pooled connection per nginx worker


def test_authorization_forwarded_but_not_logged(lb):
    reset(lb)
    code, body = lb.post("/v1/completions", {"model": "qwen", "prompt": "x"}, auth=f"Bearer {SECRET}")
    assert code == 200
    assert lb.stubs["node04"].requests[-1]["auth"] == f"Bearer {SECRET}"
    log = (lb.work / "logs" / "vllm-lb-access.log").read_text()
    assert "POST /v1/completions" in log and "upstream=127.0.0.4:" in log
    assert SECRET not in log and "Bearer" not in log
    assert SECRET not in (lb.work / "logs" / "error.log").read_text()


def test_active_health_check_marks_a_failing_head_down(lb, tmp_path):
    # the checker the role installs, run on the rendered config against the stubs' /health
    live = tmp_path / "live.conf"
    lb.stubs["node01"].healthy = False
    try:
        out = run_check(lb, lb.snippet, live, timeout=2)
        assert out["changed"] and [a.split(":")[0] for a in out["down"]] == ["127.0.0.2"]
        down_lines = [ln for ln in live.read_text().splitlines() if " down;" in ln]
        assert len(down_lines) == 1 and "127.0.0.2:" in down_lines[0]
        # point nginx at the checked file: requests avoid the head although it still answers completions
        main_conf(lb.work, live)
        lb.reload()
        reset(lb)
        assert set(lb.served_by(6)) == {"node03"}
    finally:
        lb.stubs["node01"].healthy = True
        main_conf(lb.work, lb.snippet)
        lb.reload()


def test_active_check_takes_out_a_head_that_does_not_generate_as_at_launch(lb, tmp_path):
    """The generation probe (a root-only probe file as serving_lb writes it): /health 200 is not enough; a head
    whose completion is slower than the bound (a wedged engine) or differs from its launch answer is marked down."""
    live = tmp_path / "live.conf"
    servers = {f"127.0.0.{n}:{lb.stubs[h].server_address[1]}": h for n, h in ((2, "node01"), (4, "node04"))}
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"servers": {a: {"model": "qwen" if h == "node04" else "llama", "prompt": "p",
                                                 "max_tokens": 4, "expected": " jumps over", "key": SECRET}
                                             for a, h in servers.items()}}))

    def check(timeout: float = 15.0) -> dict:  # generous where a head must pass: the lane runs niced under load
        return run_check(lb, lb.snippet, live, timeout=timeout, probe=probe)

    try:
        assert check()["down"] == []
        assert lb.stubs["node01"].requests[-1]["auth"] == f"Bearer {SECRET}"  # the key goes with the probe
        lb.stubs["node01"].answer = "garbage"
        assert [servers[a] for a in check()["down"]] == ["node01"]
        lb.stubs["node01"].answer, lb.stubs["node01"].stall = " jumps over", 6.0  # wedged: /health still 200
        out = check(timeout=2.0)
        assert [servers[a] for a in out["down"]] == ["node01"] and lb.stubs["node01"].healthy
        a1 = f"127.0.0.2:{lb.stubs['node01'].server_address[1]}"
        assert out["busy"] == [] and "token counters flat" in out["why"][a1], out  # a stub's counter is flat
        assert "# node01  # active check failed" in live.read_text() or "active check failed" in live.read_text()
        lb.stubs["node01"].stall = 0.0
        assert check()["down"] == [] and " down;" not in live.read_text()
    finally:
        lb.stubs["node01"].answer, lb.stubs["node01"].stall = " jumps over", 0.0


def test_active_check_keeps_a_busy_head_and_takes_out_a_stuck_one(lb, tmp_path):
    """Busy or stuck (what the check on by default needs, docs/serving.md "Health of the heads"): both miss the
    probe's bound; a head whose engine token counter (vllm:generation_tokens_total on /metrics) advanced while the
    probe waited is kept and said busy, one whose counter stayed flat is down. A wrong answer or an HTTP error is
    down however fast the counter runs, and so is a slow head with no counter to read."""
    live = tmp_path / "live.conf"
    a1, a3 = (f"127.0.0.{n}:{lb.stubs[h].server_address[1]}" for n, h in ((2, "node01"), (3, "node03")))
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"servers": {a: {"model": "llama", "prompt": "p", "max_tokens": 4,
                                                 "expected": " jumps over", "key": SECRET} for a in (a1, a3)}}))

    def check(timeout: float) -> dict:
        return run_check(lb, lb.snippet, live, timeout=timeout, probe=probe)

    def down_in_live() -> list[str]:
        return [a for a in (a1, a3) if any(a in ln and " down;" in ln for ln in live.read_text().splitlines())]

    node01 = lb.stubs["node01"]
    try:
        # busy: the probe runs out of time, the engine keeps generating for others -> kept, and said why
        node01.stall, node01.generating = 4.0, True
        out = check(timeout=1.5)
        assert out["down"] == [] and out["busy"] == [a1] and a1 in out["up"], out
        assert "no answer within 1.5 s" in out["why"][a1] and "tokens meanwhile" in out["why"][a1], out
        assert down_in_live() == []
        # stuck: as slow, the counter flat (a stopped engine core; the API server still answers) -> down
        node01.generating = False
        out = check(timeout=1.5)
        assert out["down"] == [a1] and out["busy"] == [] and "token counters flat" in out["why"][a1], out
        assert down_in_live() == [a1]
        # garbage, fast, while the counter runs -> down (a wrong answer is never load)
        node01.stall, node01.generating, node01.answer = 0.0, True, "garbage"
        out = check(timeout=10.0)
        assert out["down"] == [a1] and out["busy"] == [] and "at launch ' jumps over'" in out["why"][a1], out
        # an HTTP error (the engine died: vLLM's 500) while the counter runs -> down
        node01.answer, node01.error = " jumps over", 500
        out = check(timeout=10.0)
        assert out["down"] == [a1] and out["why"][a1] == "HTTP 500", out
        node01.error = 0
        assert check(timeout=10.0)["down"] == [] and down_in_live() == []
    finally:
        node01.stall, node01.generating, node01.answer, node01.error = 0.0, False, " jumps over", 0


def test_failover_when_one_head_stops(lb):
    port = lb.stubs["node01"].server_address[1]
    lb.stubs["node01"].stop()
    try:
        reset(lb)
        # every request succeeds: connection refused moves it on to the other head (proxy_next_upstream error)
        assert set(lb.served_by(10)) == {"node03"}
        log = (lb.work / "logs" / "vllm-lb-access.log").read_text().splitlines()[-10:]
        assert all(" 200 " in ln for ln in log)
    finally:
        lb.stubs["node01"] = Stub("node01", ("127.0.0.2", port))


def test_drained_head_is_rendered_down_and_in_flight_requests_finish(lb, tmp_path):
    # the balancer host's drained list (what `provision drain` writes through playbooks/balancer.yml)
    port = lb.stubs["node01"].server_address[1]
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "drained").write_text(f"127.0.0.2:{port}\n")
    drained = role_render(lb.inv, tmp_path)
    text = drained.read_text()
    down = [ln for ln in text.splitlines() if " down;" in ln]
    assert len(down) == 1 and f"server 127.0.0.2:{port} " in down[0] and "(drained: provision drain)" in down[0]
    # the CLI renders the same bytes when given the same list
    cli = render_lb_config(load_fleet(lb.inv), overrides={
        "serving_lb_conf_dir": str(tmp_path / "etc"), "serving_lb_log_dir": str(tmp_path / "logs"),
        "serving_lb_drained_heads": [f"127.0.0.2:{port}"]})
    assert cli == text
    # long requests in flight on both heads (least_conn spreads them; a head the test before stopped may still be
    # skipped for fail_timeout), then nginx reloads onto the drained config
    reset(lb)
    results: list = []
    holds: list[threading.Thread] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(lb.stubs[n].active for n in ("node01", "node03")):
        t = threading.Thread(target=lambda: results.append(
            lb.post("/v1/completions", {"model": "llama", "prompt": "long", "hold": 4})))
        t.start()
        holds.append(t)
        time.sleep(0.5)
    assert all(lb.stubs[n].active for n in ("node01", "node03"))
    try:
        main_conf(lb.work, drained)
        lb.reload()
        # new requests avoid the drained head; the one it was answering finishes (no dropped connection)
        assert set(lb.served_by(6)) == {"node03"}
        for t in holds:
            t.join()
        assert len(results) == len(holds) and all(c == 200 for c, _ in results), results
        assert "node01" in {b["served_by"] for _, b in results}
        # the active check keeps a drained head down and never counts it as live: with node03 failing /health it
        # is not marked down (it is the model's only live server: fail open)
        lb.stubs["node03"].healthy = False
        live = tmp_path / "live.conf"
        run_check(lb, drained, live, timeout=2)
        downs = [ln for ln in live.read_text().splitlines() if " down" in ln]
        assert len(downs) == 1 and f"127.0.0.2:{port}" in downs[0] and "down down" not in downs[0], downs
    finally:
        lb.stubs["node03"].healthy = True
        main_conf(lb.work, lb.snippet)
        lb.reload()


def test_the_drain_step_with_the_active_check_writes_its_source_and_runs_it(lb, tmp_path):
    """The script of `provision drain`'s step over SSH (drain.balancer_script, run here with bash as it runs as root
    on a balancer) with the active check (the default): the drained `down` goes into the check's rendered source
    (as the template renders a drained head), the drained list is written, and the check's own command writes the
    live file from it (one run at a time: SOURCE.lock), keeping the head down although it generates; a failing
    `nginx -t` puts the source back and leaves the list alone (exit 7); the return brings the head back."""
    from provisioner.day2.drain import LbPaths, balancer_script

    if os.geteuid() != 0:
        pytest.skip("the script installs its state directory owned by root, as on a balancer")
    server = f"127.0.0.2:{lb.stubs['node01'].server_address[1]}"
    state = tmp_path / "state"
    state.mkdir()
    source, live, drained = state / "vllm-lb.conf.in", tmp_path / "live.conf", state / "drained"
    source.write_text(lb.snippet.read_text())

    def paths(check: str) -> LbPaths:
        return LbPaths(str(drained), str(source), (sys.executable, "-B", str(CHECKER), "--source", str(source),
                                                   "--dest", str(live), "--timeout", "15", "--check-cmd", check,
                                                   "--reload-cmd", ""))

    def step(check: str, **change: list[str]) -> int:
        now = drained.read_text().split() if drained.exists() else []
        script = balancer_script(paths(check), now, source.read_text(), **change)
        assert script is not None
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120).returncode

    assert step("/bin/false", add=[server]) == 7  # nginx -t refused the live file: nothing changes
    assert source.read_text() == lb.snippet.read_text() and not drained.exists() and not live.exists()
    assert step(str(lb.work / "nginx-check"), add=[server]) == 0
    assert drained.read_text() == server + "\n" and (state / "vllm-lb.conf.in.lock").exists()
    downs = [ln for ln in live.read_text().splitlines() if " down" in ln]
    assert len(downs) == 1 and server in downs[0] and "(drained: provision drain)" in downs[0], downs
    assert step(str(lb.work / "nginx-check"), remove=[server]) == 0
    assert source.read_text() == lb.snippet.read_text() and drained.read_text() == ""
    assert " down" not in live.read_text()


def test_active_check_with_no_heads_and_heads_with_no_launch_record(lb, tmp_path):
    """The check on by default must be sane before anything serves: a source with no server (no head yet) is
    written as it is; a head with no launch record yet (the balancer set up before its cluster launched) must still
    generate within the bound, any text; a head that does not answer within it is down unless it is its model's
    last."""
    live = tmp_path / "live.conf"

    def check(source: Path, probe: Path | None = None, timeout: float = 15.0) -> dict:
        return run_check(lb, source, live, timeout=timeout, probe=probe)

    empty = tmp_path / "empty.conf.in"
    empty.write_text("# no vLLM head yet\n")
    assert check(empty) == {"changed": True, "down": [], "up": [], "busy": [], "why": {}}
    assert live.read_text() == empty.read_text()
    assert check(empty)["changed"] is False  # idempotent
    a1, a3 = (f"127.0.0.{n}:{lb.stubs[h].server_address[1]}" for n, h in ((2, "node01"), (3, "node03")))
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"servers": {a: {"model": "llama", "prompt": "p", "max_tokens": 4, "expected": None,
                                                 "key": SECRET} for a in (a1, a3)}}))
    lb.stubs["node01"].answer = "anything at all"
    try:
        assert check(lb.snippet, probe)["down"] == []  # no record: any answer within the bound
        lb.stubs["node01"].stall = 4.0  # no answer within the bound: down, node03 serves the model
        out = check(lb.snippet, probe, timeout=2.0)
        assert out["down"] == [a1] and any(a1 in ln and " down;" in ln for ln in live.read_text().splitlines())
    finally:
        lb.stubs["node01"].answer, lb.stubs["node01"].stall = " jumps over", 0.0
