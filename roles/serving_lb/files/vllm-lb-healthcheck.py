#!/usr/bin/python3
"""Active check for the vLLM balancer (stock nginx has none; `health_check` is NGINX Plus only).

Reads the configuration the role rendered (SOURCE, every head up) and probes each upstream server. A head listed in
PROBE (a root-only JSON file: per "addr:port" the model, prompt, max_tokens, API key and the answer recorded at its
launch) must GENERATE: a greedy completion that answers within --timeout with the launch answer (vllm_probe.py, the
controller's provisioner/probes/generate.py). Busy or stuck: a head whose probe only ran out of time (no answer within
the bound, or the right answer after it) stays up when its engine's token counters on /metrics advanced while the
probe waited (busy generating for others); flat counters (a stopped or deadlocked engine core: the API server still
answers) or no page mean down. A wrong answer, an HTTP error or a refused connection is down whatever the load.
Other heads get `GET /health` only (a liveness hint: vLLM answers 200 while a wedged engine generates nothing).
Writes DEST with ` down` added to the server lines of heads that failed. An upstream never gets all its live servers
marked down (fail open: nginx's passive checks still apply); servers the source has `down` (drained) stay down.
When DEST changes: `nginx -t`, then reload.
One run at a time (an exclusive lock on SOURCE.lock from reading SOURCE to writing DEST): the drain's step over SSH
replaces SOURCE and runs this script, so a timer run that read the old SOURCE cannot write DEST after it.
Prints one JSON line: {"changed": bool, "down": ["addr:port", ...], "up": [...], "busy": [kept up, but slow],
"why": {"addr:port": why, for the down and busy ones}}.
Managed by provisioner (roles/serving_lb). Standard library only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import vllm_probe  # this script's directory: provisioner/probes/generate.py as the role installs it

SERVER = re.compile(r"^(?P<indent>\s*)server\s+(?P<addr>\S+)(?P<rest>[^;]*);(?P<tail>.*)$")
DOWN = re.compile(r"(^|\s)down(\s|$)")
UPSTREAM = re.compile(r"^\s*upstream\s+(?P<name>\S+)\s*\{")
METRICS_TIMEOUT_S = 5.0  # one read of a head's /metrics (its API server may be slow under load)


def probe(addr: str, timeout: float, spec: dict | None = None) -> tuple[str, str]:
    """("up" | "busy" | "down", why) for one head."""
    if spec is not None:
        base = f"http://{addr}"
        before = vllm_probe.engine_tokens_at(base, min(METRICS_TIMEOUT_S, timeout))
        v = vllm_probe.probe(base, str(spec.get("model", "")), key=str(spec.get("key") or ""),
                             prompt=str(spec.get("prompt", vllm_probe.PROMPT)),
                             max_tokens=int(spec.get("max_tokens", vllm_probe.MAX_TOKENS)),
                             expected=spec.get("expected"), bound_s=timeout)
        if v.ok:
            return "up", ""
        if v.slow:
            after = vllm_probe.engine_tokens_at(base, min(METRICS_TIMEOUT_S, timeout))
            if vllm_probe.busy(before, after):
                return "busy", f"{v.reason}; the engine processed {(after or 0) - (before or 0):g} tokens meanwhile"
            flat = "no token counters on /metrics" if before is None or after is None else "its token counters flat"
            return "down", f"{v.reason}; {flat}"
        return "down", v.reason[:200]
    try:
        with urllib.request.urlopen(f"http://{addr}/health", timeout=timeout) as resp:  # noqa: S310 (http only)
            return ("up", "") if resp.status == 200 else ("down", f"/health {resp.status}")
    except urllib.error.HTTPError as e:
        return "down", f"/health {e.code}"
    except (urllib.error.URLError, OSError, ValueError):
        return "down", "/health: no answer"


def rewrite(source: str, healthy: dict[str, bool]) -> str:
    """Mark unhealthy servers `down`, except where that would leave an upstream with no server."""
    lines = source.splitlines(keepends=True)
    groups: dict[int, list[int]] = {}  # upstream start line -> server line numbers
    current = None
    for i, line in enumerate(lines):
        if UPSTREAM.match(line):
            current = i
            groups[i] = []
        elif current is not None and line.strip() == "}":
            current = None
        elif current is not None and SERVER.match(line):
            groups[current].append(i)
    out = list(lines)
    for members in groups.values():
        # servers rendered `down` (drained by `provision drain`) stay so and never count as live
        live = [i for i in members if not DOWN.search(SERVER.match(lines[i])["rest"])]  # type: ignore[index]
        addrs = [SERVER.match(lines[i]).group("addr") for i in live]  # type: ignore[union-attr]
        if not any(healthy.get(a, True) for a in addrs):
            continue  # all down: fail open
        for i, addr in zip(live, addrs):
            if not healthy.get(addr, True):
                m = SERVER.match(lines[i])
                assert m
                end = "\n" if lines[i].endswith("\n") else ""
                tail = m["tail"].rstrip("\n")
                note = f"{tail} (active check failed)" if "#" in tail else f"{tail}  # active check failed"
                out[i] = f"{m['indent']}server {addr}{m['rest']} down;{note}{end}"
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, help="configuration as rendered, every head up")
    ap.add_argument("--dest", required=True, help="live configuration nginx includes")
    ap.add_argument("--timeout", type=float, default=3.0, help="seconds per probe (the generation's latency bound)")
    ap.add_argument("--probe", default="", help="JSON of the generation probe per addr:port (root-only file)")
    ap.add_argument("--check-cmd", default="/usr/local/sbin/vllm-lb-nginx-check", help="run with the new file")
    ap.add_argument("--reload-cmd", default="systemctl reload nginx", help="'' = do not reload")
    args = ap.parse_args(argv)

    with open(args.source + ".lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return run(args)


def run(args: argparse.Namespace) -> int:
    with open(args.source, encoding="utf-8") as f:
        source = f.read()
    addrs = sorted({m.group("addr") for m in map(SERVER.match, source.splitlines()) if m})
    specs: dict = {}
    if args.probe:
        with open(args.probe, encoding="utf-8") as f:
            specs = json.load(f).get("servers") or {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(addrs) or 1)) as pool:
        states = dict(zip(addrs, pool.map(lambda a: probe(a, args.timeout, specs.get(a)), addrs)))
    healthy = {a: state != "down" for a, (state, _) in states.items()}
    new = rewrite(source, healthy)
    try:
        with open(args.dest, encoding="utf-8") as f:
            old = f.read()
    except FileNotFoundError:
        old = None
    changed = new != old
    if changed:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(args.dest)), prefix=".vllm-lb.", suffix=".conf")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new)
        os.chmod(tmp, 0o644)
        if args.check_cmd:
            r = subprocess.run([*args.check_cmd.split(), tmp], capture_output=True, text=True, check=False)
            if r.returncode != 0:
                os.unlink(tmp)
                print(json.dumps({"error": "nginx -t failed", "output": r.stderr.strip()}), file=sys.stderr)
                return 1
        os.replace(tmp, args.dest)
        if args.reload_cmd:
            subprocess.run(args.reload_cmd.split(), check=False)
    print(json.dumps({"changed": changed, "down": [a for a, ok in healthy.items() if not ok],
                      "up": [a for a, ok in healthy.items() if ok],
                      "busy": [a for a, (state, _) in states.items() if state == "busy"],
                      "why": {a: why for a, (_, why) in states.items() if why}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
