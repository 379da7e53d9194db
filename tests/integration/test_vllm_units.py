"""Rendered vLLM units and env files (provision render == what the roles write), no root, no network."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provisioner import PROJECT_ROOT, ROLES, TEMPLATES
from provisioner.inventory import load_fleet
from provisioner.render import REDACTED, host_files, role_defaults
from provisioner.vllm_args import serve_command

SECRET = "s3cret-api-key-value"
HF = "hf_secret_token_value"


def _inventory(tmp: Path, executor: str = "mp", extra: list[str] | None = None) -> Path:
    (tmp / "group_vars").mkdir(parents=True, exist_ok=True)
    (tmp / "hosts.ini").write_text(
        "[gpu_nodes]\n"
        "node01 ansible_host=10.9.0.11 node_rank=0\n"
        "node02 ansible_host=10.9.0.12 node_rank=1\n"
        "node03 ansible_host=10.9.0.13\n"
        "[vllm_pp]\nnode01\nnode02\n[vllm_single]\nnode03\n"
    )
    (tmp / "group_vars/gpu_nodes.yml").write_text(yaml.safe_dump({
        "gpu_model": "H100-SXM5-80GB", "gpu_count": 8, "fabric": "infiniband", "bootstrap_interface": "ens1f0",
        "ib_hcas": ["mlx5_0", "mlx5_1"], "vllm_api_key": SECRET, "vllm_hf_token": HF,
        "vllm_env_extra": {"VLLM_CPU_KVCACHE_SPACE": "4", "WEIRD": 'a "quoted" $value'},
        "vllm_timeout_stop_sec": 120,
    }))
    (tmp / "group_vars/vllm_pp.yml").write_text(yaml.safe_dump({"vllm_cluster": {
        "model": "meta-llama/Llama-3.1-70B-Instruct", "model_arch": "Llama-3.1-70B", "served_model_name": "llama70b",
        "tensor_parallel_size": 8, "pipeline_parallel_size": 2, "executor": executor,
        "extra_args": extra if extra is not None else
        ["--enable-log-requests", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
    }}))
    (tmp / "group_vars/vllm_single.yml").write_text(yaml.safe_dump({"vllm_cluster": {
        "model": "/opt/models/tiny-llama", "model_arch": "Llama-3.1-8B", "tensor_parallel_size": 8, "port": 8001}}))
    return tmp / "hosts.ini"


def _files(inv: Path, host: str) -> dict[str, str]:
    return {f.dest: f.content for f in host_files(load_fleet(inv), host)}


def _exec_start(unit: str) -> list[str]:
    line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    # systemd unquoting of what we emit: POSIX-shell-like double quotes with \" and \\, %% and $$ escapes
    return [a.replace("%%", "%").replace("$$", "$") for a in shlex.split(line.removeprefix("ExecStart="))]


def _settings(unit: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ln in unit.splitlines():
        if "=" in ln and not ln.startswith("#"):
            k, v = ln.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def test_mp_head_and_worker_units_run_exactly_vllm_args(tmp_path: Path) -> None:
    inv = _inventory(tmp_path)
    fleet = load_fleet(inv)
    cluster = fleet.clusters["vllm_pp"]
    venv = role_defaults()["vllm_venv"]
    head = _files(inv, "node01")["/etc/systemd/system/vllm.service"]
    worker = _files(inv, "node02")["/etc/systemd/system/vllm.service"]
    for host, unit in (("node01", head), ("node02", worker)):
        argv = _exec_start(unit)
        cut = argv.index("--")
        assert argv[cut + 1:] == serve_command(cluster, host, fleet, vllm=f"{venv}/bin/vllm")
        s = _settings(unit)
        assert s["User"] == ["vllm"] and s["Group"] == ["vllm"]
        assert s["LimitMEMLOCK"] == ["infinity"] and s["LimitNOFILE"] == ["65536"]
        assert s["KillMode"] == ["control-group"] and s["Restart"] == ["on-failure"]
        # the head waits out vLLM's graceful stop (--shutdown-timeout = drain_wait, 120) plus 30 s
        assert s["TimeoutStopSec"] == (["150"] if host == "node01" else ["120"])
        after = " ".join(s["After"]).split()
        assert {"network-online.target", "nvidia-persistenced.service", "nvidia-fabricmanager.service"} <= set(after)
        assert s["EnvironmentFile"] == ["/etc/vllm/vllm.env"]
        assert SECRET not in unit  # the key travels in the env file only (VLLM_API_KEY), never on a command line
    h, w = _exec_start(head), _exec_start(worker)
    hv, wv = h[h.index("--") + 1:], w[w.index("--") + 1:]
    assert hv[:3] == [f"{venv}/bin/vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]
    for flag, value in (("--nnodes", "2"), ("--master-addr", "10.9.0.11"), ("--master-port", "29501"),
                        ("-tp", "8"), ("-pp", "2")):
        assert hv[hv.index(flag) + 1] == value and wv[wv.index(flag) + 1] == value
    assert hv[hv.index("--node-rank") + 1] == "0" and wv[wv.index("--node-rank") + 1] == "1"
    assert "--headless" in wv and "--headless" not in hv
    assert '{"method": "ngram", "num_speculative_tokens": 3}' in hv  # JSON survives systemd quoting
    # group semantics: the worker watches its head's rendezvous port, the head its own /health
    assert w[w.index("--head-addr") + 1] == "10.9.0.11" and w[w.index("--head-port") + 1] == "29501"
    assert h[h.index("--health-url") + 1] == "http://127.0.0.1:8000/health"


def test_single_node_cluster_has_no_multinode_flags(tmp_path: Path) -> None:
    inv = _inventory(tmp_path)
    unit = _files(inv, "node03")["/etc/systemd/system/vllm.service"]
    argv = _exec_start(unit)
    vargs = argv[argv.index("--") + 1:]
    assert not {"--nnodes", "--node-rank", "--master-addr", "--headless"} & set(vargs)
    assert vargs[vargs.index("--port") + 1] == "8001"
    assert argv[argv.index("--health-url") + 1] == "http://127.0.0.1:8001/health"


def test_env_file_has_bootstrap_nccl_and_redacted_secrets(tmp_path: Path) -> None:
    inv = _inventory(tmp_path)
    for host, ip in (("node01", "10.9.0.11"), ("node02", "10.9.0.12")):
        env = _files(inv, host)["/etc/vllm/vllm.env"]
        assert f'VLLM_HOST_IP="{ip}"' in env
        assert 'GLOO_SOCKET_IFNAME="ens1f0"' in env
        assert "NCCL_SOCKET_IFNAME==ens1f0" in env and "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1" in env
        assert f'VLLM_API_KEY="{REDACTED}"' in env
        assert 'WEIRD="a \\"quoted\\" $value"' in env
        assert SECRET not in env and HF not in env
    f = {x.dest: x for x in host_files(load_fleet(inv), "node01")}["/etc/vllm/vllm.env"]
    assert (f.mode, f.owner, f.group) == ("0640", "root", "vllm")


def test_ray_units(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, executor="ray")
    fleet = load_fleet(inv)
    head, worker = _files(inv, "node01"), _files(inv, "node02")
    assert set(worker) == {"/etc/nccl.conf", "/etc/vllm/vllm.env", "/etc/systemd/system/vllm-ray.service"}
    ray_w = _exec_start(worker["/etc/systemd/system/vllm-ray.service"])
    assert ray_w[1:4] == ["start", "--block", "--address=10.9.0.11:6379"]
    ray_h = _exec_start(head["/etc/systemd/system/vllm-ray.service"])
    assert "--head" in ray_h and "--port=6379" in ray_h
    serve = head["/etc/systemd/system/vllm.service"]
    assert "Requires=vllm-ray.service" in serve
    argv = _exec_start(serve)
    assert argv[argv.index("--wait-ray-gpus") + 1] == "16"
    vargs = argv[argv.index("--") + 1:]
    assert vargs == serve_command(fleet.clusters["vllm_pp"], "node01", fleet, vllm="/opt/vllm/venv/bin/vllm")
    assert vargs[vargs.index("--distributed-executor-backend") + 1] == "ray"
    assert "--nnodes" not in vargs


def test_cli_render_prints_and_writes(tmp_path: Path) -> None:
    inv = _inventory(tmp_path / "inv")
    exe = [str(Path(sys.executable).parent / "provision")]
    p = subprocess.run([*exe, "render", str(inv), "--host", "node02"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "# ==> /etc/systemd/system/vllm.service" in p.stdout and "--headless" in p.stdout
    assert SECRET not in p.stdout + p.stderr
    out = tmp_path / "out"
    p = subprocess.run([*exe, "render", str(inv), "--host", "node02", "--out", str(out)], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    assert (out / "etc/systemd/system/vllm.service").read_text() == _files(inv, "node02")[
        "/etc/systemd/system/vllm.service"]
    assert oct((out / "etc/vllm/vllm.env").stat().st_mode & 0o777) == "0o640"
    p = subprocess.run([*exe, "render", str(inv), "--host", "nope"], capture_output=True, text=True)
    assert p.returncode == 2 and "unknown host" in p.stderr


def _role_facts_call() -> str:
    (task,) = [t for t in yaml.safe_load((ROLES / "vllm/tasks/main.yml").read_text())
               if "vllm_facts" in t.get("ansible.builtin.set_fact", {})]
    call = task["ansible.builtin.set_fact"]["vllm_facts"]
    assert "provisioner_plan.hosts[inventory_hostname].vllm" in call  # the plan, computed once for the run
    return call


@pytest.mark.parametrize("executor", ["mp", "ray"])
def test_ansible_template_module_writes_the_same_bytes(tmp_path: Path, executor: str) -> None:
    """The roles' rendering (Ansible's template module, role defaults under inventory vars, the filter plugin that
    computes vllm_facts) produces exactly what `provision render` shows (secrets aside)."""
    inv = _inventory(tmp_path / "inv", executor=executor)
    out = tmp_path / "ansible-out"
    role = tmp_path / "roles/render_probe"
    (role / "defaults").mkdir(parents=True)
    (role / "tasks").mkdir()
    (role / "meta").mkdir()
    # the plan first, as the vllm role has it (a dependency)
    (role / "meta/main.yml").write_text(yaml.safe_dump({"dependencies": ["provisioner_plan"]}))
    # the real roles' defaults, at role-default precedence (under the inventory), as the roles see them
    (role / "defaults/main.yml").write_text(yaml.safe_dump(role_defaults()))
    (role / "tasks/main.yml").write_text(yaml.safe_dump([
        {"name": "facts", "ansible.builtin.set_fact": {
            # the role's own call, verbatim: the play's hostvars and the settings the role passes
            "vllm_facts": _role_facts_call()}},
        {"name": "dirs", "ansible.builtin.file": {
            "path": f"{out}/{{{{ inventory_hostname }}}}/{{{{ item }}}}", "state": "directory"},
         "loop": ["etc/vllm", "etc/systemd/system"]},
        {"name": "nccl", "ansible.builtin.template": {
            "src": f"{TEMPLATES}/nccl.conf.j2", "dest": f"{out}/{{{{ inventory_hostname }}}}/etc/nccl.conf"}},
        {"name": "env", "ansible.builtin.template": {
            "src": f"{TEMPLATES}/vllm.env.j2", "dest": f"{out}/{{{{ inventory_hostname }}}}/etc/vllm/vllm.env"}},
        {"name": "units", "ansible.builtin.template": {
            "src": f"{TEMPLATES}/{{{{ item.template }}}}", "dest": f"{out}/{{{{ inventory_hostname }}}}{{{{ item.dest }}}}"},
         "loop": "{{ vllm_facts.units }}"},
    ]))
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "gpu_nodes", "gather_facts": False, "connection": "local",
                                     "roles": ["render_probe"]}]))
    # the filter by FQCN: the repository's ansible.cfg makes the checkout the collection provisioner.gpu
    env = dict(os.environ, ANSIBLE_ROLES_PATH=f"{tmp_path / 'roles'}:{ROLES}", ANSIBLE_NOCOLOR="1",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"))
    p = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inv), str(play),
                        "-e", f"ansible_python_interpreter={sys.executable}"],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    fleet = load_fleet(inv)
    for host in ("node01", "node02", "node03"):
        for f in host_files(fleet, host):
            written = (out / host / f.dest.lstrip("/")).read_text()
            assert written.replace(SECRET, REDACTED).replace(HF, REDACTED) == f.content, (host, f.dest)
            if f.dest.endswith("vllm.env"):
                assert f'VLLM_API_KEY="{SECRET}"' in written  # the host gets the real key


# ---------------------------------------------------------------------------------------------------------------
# vllm-group-run: the group-restart wrapper the units run (real processes, real sockets, no mocks)

import http.server  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

WRAPPER = ROLES / "vllm_launch/files/vllm-group-run"


def _wrapper(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(WRAPPER), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _child_pid(out: str) -> int:
    return int(out.split("started pid ", 1)[1].split(":", 1)[0])


def test_group_run_worker_stops_when_its_head_goes_away(tmp_path: Path) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    port = srv.getsockname()[1]
    pidfile = tmp_path / "child.pid"
    p = _wrapper("--head-addr", "127.0.0.1", "--head-port", str(port), "--interval", "0.2", "--misses", "2",
                 "--stop-grace", "2", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 60")
    # the child's pid is written once the wrapper has started it (seconds on a loaded machine)
    assert _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 30)
    time.sleep(1.0)  # five probe intervals with the head up
    assert p.poll() is None  # head up: the worker keeps running
    child = int(pidfile.read_text())
    srv.close()  # the head dies
    rc = p.wait(timeout=10)
    out = p.stdout.read() if p.stdout else ""
    assert rc == 75, out
    assert "is up" in out and "gone" in out
    time.sleep(0.2)
    assert not _alive(child)  # the worker's vLLM was stopped with it


def test_group_run_worker_that_never_joins_restarts() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    p = _wrapper("--head-addr", "127.0.0.1", "--head-port", str(port), "--interval", "0.2", "--join-timeout", "1",
                 "--", "sleep", "60")
    assert p.wait(timeout=10) == 75


@pytest.mark.parametrize(("code", "expect"), [(0, 75), (3, 3)])
def test_group_run_any_unrequested_exit_is_a_failure(code: int, expect: int) -> None:
    p = _wrapper("--", "sh", "-c", f"exit {code}")
    assert p.wait(timeout=10) == expect


def test_group_run_sigterm_stops_the_child_and_exits_clean(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    p = _wrapper("--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 60")
    deadline = time.monotonic() + 30  # the wrapper starts it (seconds on a loaded machine)
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pidfile.read_text())
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 0
    time.sleep(0.2)
    assert not _alive(child)


def _health_server(state: dict[str, int]) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A stand-in vLLM /health on 127.0.0.1 answering `state["code"]`; (server, its /health URL)."""

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            code = state["code"]
            self.send_response(code)
            self.end_headers()
            state[f"answered_{code}"] = state.get(f"answered_{code}", 0) + 1

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/health"


def test_group_run_head_stops_when_its_engine_dies() -> None:
    state = {"code": 200}
    srv, url = _health_server(state)
    # interval 1 s: the probe's timeout is the interval, and a slower answer counts as up (a busy head is not killed),
    # so a shorter one could miss the 503s on a loaded machine
    p = _wrapper("--health-url", url, "--interval", "1", "--misses", "2", "--", "sleep", "60")
    deadline = time.monotonic() + 30
    while not state.get("answered_200") and time.monotonic() < deadline:  # the wrapper has seen the head healthy
        time.sleep(0.1)
    assert p.poll() is None and state.get("answered_200")
    state["code"] = 503  # what vLLM's /health answers once the engine died
    try:
        assert p.wait(timeout=30) == 75
    finally:
        srv.shutdown()


def test_group_run_head_stops_when_a_worker_connection_set_vanishes() -> None:
    """An idle head never notices a dead worker by itself: the wrapper watches the worker's connections."""
    srv, url = _health_server({"code": 200})
    rendezvous = socket.socket()
    rendezvous.bind(("127.0.0.1", 0))
    rendezvous.listen(4)
    worker = socket.create_connection(rendezvous.getsockname())  # the "worker" holds a connection to the head
    accepted, _ = rendezvous.accept()
    p = _wrapper("--health-url", url, "--interval", "0.3", "--misses", "2", "--peers", "127.0.0.1", "--",
                 "sleep", "60")
    try:
        time.sleep(2.5)
        assert p.poll() is None  # worker connected: the head keeps running
        worker.close()  # the worker process dies: its connections go away
        accepted.close()
        assert p.wait(timeout=15) == 75
        assert "gone" in (p.stdout.read() if p.stdout else "")
    finally:
        if p.poll() is None:
            p.kill()
        srv.shutdown()
        rendezvous.close()


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


def _wait_for(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def _worker_with_member_health(head_port: int, health_port: int) -> subprocess.Popen[str]:
    return _wrapper("--head-addr", "127.0.0.1", "--head-port", str(head_port), "--interval", "0.2",
                    "--misses", "3", "--stop-grace", "2", "--serve-health", f"127.0.0.1:{health_port}", "--",
                    "sleep", "60")


def test_group_run_worker_answers_member_health_only_while_its_vllm_runs() -> None:
    head = socket.socket()
    head.bind(("127.0.0.1", 0))
    head.listen(16)
    hp = _free_port()
    p = _worker_with_member_health(head.getsockname()[1], hp)
    try:
        assert _wait_for(lambda: _get(f"http://127.0.0.1:{hp}/health")[0] == 200, 10)
        first = _get(f"http://127.0.0.1:{hp}/health")[1]
        assert first and _get(f"http://127.0.0.1:{hp}/other")[0] == 503
        child = int(subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()[0])
        os.kill(child, signal.SIGKILL)  # the worker's vLLM dies
        assert p.wait(timeout=15) == 75
        assert _get(f"http://127.0.0.1:{hp}/health")[0] == 0  # nothing answers once the member is gone
    finally:
        if p.poll() is None:
            p.kill()
        head.close()


@pytest.mark.parametrize("how", ["silent", "restarted"])
def test_group_run_head_stops_when_a_worker_member_goes_silent_or_restarts(how: str) -> None:
    """Power lost or network cut: the worker's connections stay ESTABLISHED, only its member /health tells.
    A real worker wrapper is frozen (SIGSTOP: the kernel still accepts, nothing answers) or replaced by a new one."""
    srv, url = _health_server({"code": 200})
    head = socket.socket()
    head.bind(("127.0.0.1", 0))
    head.listen(16)
    hp = _free_port()
    worker = _worker_with_member_health(head.getsockname()[1], hp)
    p = None
    try:
        assert _wait_for(lambda: _get(f"http://127.0.0.1:{hp}/health")[0] == 200, 10)
        # restarted: misses high enough that only the changed member id can stop the head
        misses = "3" if how == "silent" else "1000"
        p = _wrapper("--health-url", url, "--interval", "0.3", "--misses", misses, "--peers", "127.0.0.1",
                     "--peer-port", str(hp), "--peer-interval", "0.3", "--peer-timeout", "0.5", "--stop-grace", "2",
                     "--", "sleep", "60")
        time.sleep(3)
        assert p.poll() is None  # worker answering: the head keeps serving
        t0 = time.monotonic()
        if how == "silent":
            os.kill(worker.pid, signal.SIGSTOP)
        else:
            worker.terminate()  # stops its child too
            worker.wait()
            worker = _worker_with_member_health(head.getsockname()[1], hp)
        assert p.wait(timeout=20) == 75
        took = time.monotonic() - t0
        out = p.stdout.read() if p.stdout else ""
        assert ("restarted" if how == "restarted" else "member /health probes failed") in out, out
        if how == "silent":
            assert took < 3 * (0.3 + 0.5) + 2 + 1.5, took  # misses x (interval + timeout) + stop + slack
    finally:
        for proc in (p, worker):
            if proc is not None and proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                proc.kill()
                proc.wait()
        srv.shutdown()
        head.close()


def test_group_run_kills_orphaned_rank_processes_when_vllm_dies(tmp_path: Path) -> None:
    """vLLM's main process killed: its rank processes (same process group) must not live on as orphans."""
    pidfile = tmp_path / "rank.pid"
    p = _wrapper("--stop-grace", "2", "--", "sh", "-c", f"sleep 60 & echo $! > {pidfile}; exec sleep 60")
    deadline = time.monotonic() + 30  # the wrapper starts it (seconds on a loaded machine)
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    rank = int(pidfile.read_text())
    main = int(subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()[0])
    os.kill(main, signal.SIGKILL)  # what the e2e test does to the worker's vLLM
    assert p.wait(timeout=15) == 75
    time.sleep(0.3)
    assert not _alive(rank)


# ------------------------------------------------------------------ the in-service gate (roles/vllm_launch)
def _gate():
    import importlib.util

    path = PROJECT_ROOT / "plugins/filter/provisioner_vllm_gate.py"
    spec = importlib.util.spec_from_file_location("provisioner_vllm_gate", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


MARK = "/etc/provisioner/in-service"


def _stat(host: str, exists: bool | None = True, **extra: object) -> dict:
    r: dict = {"item": host, "changed": False, **extra}
    if exists is not None:
        r["stat"] = {"exists": exists, "isreg": True} if exists else {"exists": False}
    return r


def test_gate_holds_a_cluster_back_when_one_member_lacks_the_mark() -> None:
    g = _gate()
    pp = {"cluster": "vllm_pp", "members": ["node01", "node02"], "head": "node01"}
    single = {"cluster": "vllm_single", "members": ["node03"], "head": "node03"}
    marks = {"results": [_stat("node01"), _stat("node02", False), _stat("node03")]}
    v = g.provisioner_vllm_gate(marks, pp, MARK, "inv/hosts.ini")
    assert v["held"] and v["cluster"] == "vllm_pp" and list(v["missing"]) == ["node02"]
    msg = v["message"]
    assert msg.startswith("vLLM cluster vllm_pp is not launched")
    assert f"node02 (no {MARK})" in msg and "provision onboard inv/hosts.ini node02" in msg
    assert "vllm_launch_require_in_service: false" in msg and "node01, node02" in msg
    assert v["summary"] == f"vLLM cluster vllm_pp held back, not in service: node02 (no {MARK})"
    # the other cluster goes on
    assert g.provisioner_vllm_gate(marks, single, MARK)["held"] is False
    # not in a cluster: nothing to gate
    assert g.provisioner_vllm_gate(marks, None, MARK)["held"] is False


def test_gate_counts_unreadable_and_unread_members_as_not_in_service() -> None:
    g = _gate()
    pp = {"cluster": "vllm_pp", "members": ["node01", "node02", "node04"]}
    marks = {"results": [_stat("node01", None, unreachable=True, msg="ssh: connect timed out"),
                         _stat("node02", None, failed=True, msg="Permission denied")]}
    v = g.provisioner_vllm_gate(marks, pp, MARK)
    assert v["held"] and set(v["missing"]) == {"node01", "node02", "node04"}
    assert "unreachable: ssh: connect timed out" in v["missing"]["node01"]
    assert "Permission denied" in v["missing"]["node02"] and v["missing"]["node04"] == f"{MARK} was not read"
    # a directory where the mark should be is not a mark
    d = {"results": [{"item": "node01", "stat": {"exists": True, "isreg": False}}]}
    assert g.provisioner_vllm_gate(d, {"cluster": "c", "members": ["node01"]}, MARK)["held"]
    # no loop ran (registered as skipped): every member unread
    assert g.provisioner_vllm_gate({"skipped": True, "results": []}, pp, MARK)["held"]


def test_gate_reads_every_member_of_gated_clusters_only() -> None:
    g = _gate()
    hv = {
        "node01": {"vllm_facts": {"cluster": "vllm_pp", "members": ["node01", "node02"]}, "vllm_launch_gated": True},
        "node03": {"vllm_facts": {"cluster": "vllm_single", "members": ["node03"]}, "vllm_launch_gated": "False"},
        "lb01": {"vllm_facts": None, "vllm_launch_gated": False},
    }
    # node02 is outside the play (--limit node01) and still read: the cluster launches with all its members
    assert g.provisioner_vllm_gate_hosts(hv, ["node01", "node03", "lb01"]) == ["node01", "node02"]
    assert g.provisioner_vllm_gate_hosts(hv, ["lb01"]) == []


def test_gate_is_on_by_default_and_documented() -> None:
    d = yaml.safe_load((PROJECT_ROOT / "roles/vllm_launch/defaults/main.yml").read_text())
    assert d["vllm_launch_require_in_service"] is True and d["vllm_launch_in_service_file"] == MARK
    from provisioner.probes.health import IN_SERVICE

    assert IN_SERVICE == MARK  # what onboard writes is what the launch reads
    specs = yaml.safe_load((PROJECT_ROOT / "roles/vllm_launch/meta/argument_specs.yml").read_text())
    opts = specs["argument_specs"]["main"]["options"]
    assert opts["vllm_launch_require_in_service"]["default"] is True


# ---------------------------------------------------------------------------------------------------------------
# vllm-argcheck's record of accepted command lines (issue 44: the parser's import is 10-30 s of every launch)

ARGCHECK = ROLES / "vllm/files/vllm-argcheck"
# a stand-in for vLLM's parser (the real one is exercised on the vLLM rack): it leaves a mark each time it is imported
_STUB = {
    "vllm/__init__.py": "import os\nopen(os.environ['STUB_MARK'], 'a').write('imported\\n')\n",
    "vllm/utils/__init__.py": "",
    "vllm/utils/argparse_utils.py": "from argparse import ArgumentParser as FlexibleArgumentParser\n",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/cli/__init__.py": "",
    "vllm/entrypoints/cli/serve.py": (
        "class ServeSubcommand:\n"
        "    def subparser_init(self, subs):\n"
        "        p = subs.add_parser('serve'); p.add_argument('model'); p.add_argument('--dtype')\n"
        "    def validate(self, ns):\n"
        "        pass\n"),
}


def test_argcheck_records_an_accepted_line_and_skips_the_import_next_time(tmp_path: Path) -> None:
    for rel, text in _STUB.items():
        (tmp_path / "stub" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "stub" / rel).write_text(text)
    mark, verdicts = tmp_path / "imports", tmp_path / "verdicts"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub"), "STUB_MARK": str(mark)}

    def check(argv: list[str], record: str = "1") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(ARGCHECK), json.dumps(argv), str(verdicts)], capture_output=True,
                              text=True, env={**env, "PROVISIONER_ARGCHECK_RECORD": record}, timeout=60)

    def imports() -> int:
        return len(mark.read_text().splitlines()) if mark.exists() else 0

    good = ["/opt/vllm/venv/bin/vllm", "serve", "/m", "--dtype", "float32"]
    p = check(good, record="0")  # check mode (the drift run): parsed, nothing written
    assert p.returncode == 0 and imports() == 1 and not verdicts.exists(), p.stderr
    p = check(good)
    assert p.returncode == 0 and imports() == 2 and len(list(verdicts.iterdir())) == 1, p.stderr
    p = check(good)  # the same line with the same venv: accepted from the record, vLLM not imported
    assert p.returncode == 0 and imports() == 2 and "recorded" in p.stdout, p.stdout
    bad = [*good, "--swap-space", "4"]
    for _ in range(2):  # a rejection is never recorded: parsed (and refused) every time
        p = check(bad)
        assert p.returncode == 2 and "unrecognized arguments: --swap-space" in p.stderr, p.stderr
    assert imports() == 4 and len(list(verdicts.iterdir())) == 1
    other = [*good[:-1], "bfloat16"]  # another line: parsed again
    assert check(other).returncode == 0 and imports() == 5 and len(list(verdicts.iterdir())) == 2
    # a change in the venv (a distribution added) is another key: parsed again
    (tmp_path / "stub" / "extra_dist-1.0.dist-info").mkdir()
    (tmp_path / "stub" / "extra_dist-1.0.dist-info" / "METADATA").write_text("Name: extra-dist\nVersion: 1.0\n")
    assert check(good).returncode == 0 and imports() == 6


def test_env_file_points_vllms_caches_at_the_managed_directory(tmp_path: Path) -> None:
    inv = _inventory(tmp_path)
    env = _files(inv, "node01")["/etc/vllm/vllm.env"]
    for line in ('VLLM_CACHE_ROOT="/var/cache/vllm/vllm"', 'TORCHINDUCTOR_CACHE_DIR="/var/cache/vllm/torchinductor"',
                 'TRITON_CACHE_DIR="/var/cache/vllm/triton"'):
        assert line in env, env
    with (tmp_path / "group_vars/gpu_nodes.yml").open("a") as f:
        f.write('vllm_cache_dir: ""\n')
    env = _files(inv, "node01")["/etc/vllm/vllm.env"]
    assert "VLLM_CACHE_ROOT" not in env and "TORCHINDUCTOR_CACHE_DIR" not in env, env
