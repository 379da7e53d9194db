"""All-reduce bus bandwidth: the suite's rendered /etc/nccl.conf (through NCCL_CONF_FILE) vs NCCL's defaults.

Runs on a GPU host (issue 10 item 5, issue 9). One process per GPU, torch.distributed over NCCL, bf16 sum,
message sizes 1 MiB doubling to --max-size (4G; 8G on 8-GPU hosts), busbw = algbw * 2(n-1)/n (nccl-tests'
definition). Each configuration is a fresh set of processes (NCCL reads its environment and NCCL_CONF_FILE once
per process), the configurations alternate order round by round, and the report gives per-size medians over rounds.

Configurations (--configs, comma list):
  default       no NCCL_* variable but NCCL_NVLS_ENABLE=0 (NVLink multicast stays off on the lent machines)
  suite         + NCCL_CONF_FILE=<--conf> (the file `provision render` writes, see --fix-ifname)
  suite-noalgo  the same file without its NCCL_ALGO line (attributes a difference to NCCL_ALGO or the rest)
  algo-X        no conf file, NCCL_ALGO=X in the environment (e.g. algo-Tree, algo-Ring)

--fix-ifname: when the conf's NCCL_SOCKET_IFNAME names no interface of this host (a rack's interface on a test
machine), NCCL's bootstrap has no socket interface and the communicator fails; the launcher then rewrites only that
line to the interface of this host's default route (else its first non-loopback interface, else lo) and records
the substitution in the JSON. Every other line is used as rendered.

  python3 benchmarks/nccl_bench.py run --conf nccl.conf --fix-ifname --rounds 5 --json out.json
  python3 benchmarks/nccl_bench.py report out.json            # the table again, from saved raw rounds
  python3 benchmarks/nccl_bench.py debug --conf nccl.conf ... # one NCCL_DEBUG=INFO run per config, small sizes

Standard library + torch only (torch is what the GPU hosts here carry; nccl-tests' all_reduce_perf is used by
node_health.py when present, this benchmark needs per-process NCCL_CONF_FILE control so it drives torch itself).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

NVLINK_LINE_GBPS = 450.0  # H100/H200 NVLink 4: 18 links x 25 GB/s per direction (nominal)
KEEP_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B").rstrip("I")
    if s and s[-1] in UNITS:
        return int(float(s[:-1]) * UNITS[s[-1]])
    return int(s)


def fmt_size(n: int) -> str:
    for u, v in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v and n % v == 0:
            return f"{n // v} {u}"
    return f"{n} B"


def sizes_between(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


# ----------------------------------------------------------------------------------------------- worker side
def worker(args) -> int:
    import torch
    import torch.distributed as dist

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    t0 = time.time()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank,
                            world_size=n, device_id=dev)
    # first collective creates the NCCL communicator (eager with device_id on recent torch; harmless otherwise)
    x = torch.ones(1024, dtype=torch.bfloat16, device=dev)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    init_s = time.time() - t0
    rows = []
    for nbytes in [int(v) for v in args.sizes.split(",")]:
        x = torch.full((nbytes // 2,), float(rank + 1), dtype=torch.bfloat16, device=dev)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        want = n * (n + 1) / 2
        ok = bool(torch.all(x == want).item())
        x.zero_()
        iters = args.iters_large if nbytes >= parse_size(args.large_from) else args.iters_small
        for _ in range(args.warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        loops = []
        for _ in range(args.loops):
            dist.barrier(device_ids=[rank])
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                dist.all_reduce(x)
            e.record()
            torch.cuda.synchronize()
            loops.append(s.elapsed_time(e) / 1000 / iters)
        sec = statistics.median(loops)
        alg = nbytes / sec / 1e9
        rows.append({"bytes": nbytes, "iters": iters, "loops": args.loops,
                     "loop_time_us": [round(v * 1e6, 2) for v in loops], "time_us": round(sec * 1e6, 2),
                     "algbw_gbps": round(alg, 2), "busbw_gbps": round(alg * 2 * (n - 1) / n, 2), "correct": ok})
        del x
        torch.cuda.empty_cache()
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump({"world_size": n, "init_s": round(init_s, 2), "torch": torch.__version__,
                       "nccl": ".".join(map(str, torch.cuda.nccl.version())), "rows": rows}, f)
    dist.destroy_process_group()
    return 0


# ----------------------------------------------------------------------------------------------- launcher side
def host_ifaces() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError:
        return []


def default_route_iface() -> str | None:
    try:
        with open("/proc/net/route") as f:
            for line in f.readlines()[1:]:
                p = line.split()
                if len(p) > 2 and p[1] == "00000000":
                    return p[0]
    except OSError:
        pass
    return None


def ifname_matches(spec: str, ifaces: list[str]) -> list[str]:
    """Interfaces NCCL_SOCKET_IFNAME=spec selects (prefix unless '=', '^' excludes), per NCCL's rules."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    names = [t.split(":")[0] for t in spec.split(",") if t]
    hit = [i for i in ifaces if any((i == nm) if exact else i.startswith(nm) for nm in names)]
    return [i for i in ifaces if i not in hit] if exclude else hit


def effective_conf(conf_text: str, fix_ifname: bool) -> tuple[str, dict]:
    """The conf as used on this host, and a record of any substitution."""
    ifaces = host_ifaces()
    note: dict = {"host_interfaces": ifaces, "default_route_interface": default_route_iface(), "substituted": None}
    out = []
    for line in conf_text.splitlines():
        key, _, val = line.partition("=")
        if fix_ifname and key.strip() == "NCCL_SOCKET_IFNAME" and not line.lstrip().startswith("#"):
            if not ifname_matches(val, ifaces):
                pick = note["default_route_interface"] or next((i for i in ifaces if i != "lo"), "lo")
                new = f"NCCL_SOCKET_IFNAME=={pick}"
                note["substituted"] = {"from": line, "to": new}
                line = new
        out.append(line)
    return "\n".join(out) + "\n", note


def config_env(name: str, conf_path: str | None, noalgo_path: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(KEEP_ENV)
    if name == "default":
        pass
    elif name == "suite":
        env["NCCL_CONF_FILE"] = conf_path
    elif name == "suite-noalgo":
        env["NCCL_CONF_FILE"] = noalgo_path
    elif name.startswith("algo-"):
        env["NCCL_ALGO"] = name[5:]
    else:
        raise SystemExit(f"unknown config {name!r}")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(name: str, env: dict, nranks: int, sizes: list[int], a, log_path: str | None = None,
           extra_env: dict | None = None, timeout: int = 300) -> dict:
    fd, result = tempfile.mkstemp(prefix="nccl_bench_", suffix=".json")
    os.close(fd)
    port = str(free_port())
    procs = []
    log = open(log_path, "a") if log_path else None
    t0 = time.time()
    for r in range(nranks):
        e = dict(env, RANK=str(r), WORLD_SIZE=str(nranks), MASTER_PORT=port, **(extra_env or {}))
        cmd = [sys.executable, os.path.abspath(__file__), "worker", "--result", result,
               "--sizes", ",".join(map(str, sizes)), "--warmup", str(a.warmup), "--loops", str(a.loops),
               "--iters-small", str(a.iters_small), "--iters-large", str(a.iters_large), "--large-from", a.large_from]
        procs.append(subprocess.Popen(cmd, env=e, stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    rcs, outs = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(5, timeout - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
        rcs.append(p.returncode)
        outs.append((out or "")[-3000:])
    if log:
        log.close()
    rec = {"config": name, "rcs": rcs, "wall_s": round(time.time() - t0, 2),
           "env": {k: v for k, v in env.items() if k.startswith("NCCL_")}}
    try:
        with open(result) as f:
            rec.update(json.load(f))
    except (OSError, ValueError):
        rec["error"] = [o for o in outs if o] or ["no result (see log)"]
    os.unlink(result)
    return rec


def prepare(a) -> tuple[str | None, str | None, dict]:
    meta: dict = {}
    conf_path = noalgo_path = None
    if a.conf:
        text = open(a.conf).read()
        eff, note = effective_conf(text, a.fix_ifname)
        meta["conf_rendered"] = text
        meta["conf_effective"] = eff
        meta["ifname"] = note
        d = a.workdir or tempfile.mkdtemp(prefix="nccl_bench_conf_")
        os.makedirs(d, exist_ok=True)
        conf_path = os.path.join(d, "nccl.conf")
        noalgo_path = os.path.join(d, "nccl-noalgo.conf")
        open(conf_path, "w").write(eff)
        open(noalgo_path, "w").write("".join(l + "\n" for l in eff.splitlines()
                                             if l.partition("=")[0].strip() != "NCCL_ALGO"))
    meta["etc_nccl_conf_exists"] = os.path.exists("/etc/nccl.conf")
    meta["home_nccl_conf_exists"] = os.path.exists(os.path.expanduser("~/.nccl.conf"))
    meta["hostname"] = socket.gethostname()
    return conf_path, noalgo_path, meta


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return sum(1 for l in out.splitlines() if l.startswith("GPU "))


def cmd_run(a) -> int:
    conf_path, noalgo_path, meta = prepare(a)
    configs = a.configs.split(",")
    if any(c.startswith("suite") for c in configs) and not conf_path:
        raise SystemExit("--conf is needed for the suite configurations")
    n = a.nranks or gpu_count()
    sizes = sizes_between(parse_size(a.min_size), parse_size(a.max_size))
    doc = {"meta": meta, "nranks": n, "sizes": sizes, "configs": configs, "rounds": [],
           "params": {k: getattr(a, k) for k in ("warmup", "loops", "iters_small", "iters_large", "large_from")},
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.time()
    for r in range(a.rounds):
        if r >= a.min_rounds and time.time() - t0 > a.time_budget:
            print(f"time budget reached after {r} rounds", flush=True)
            break
        order = configs if r % 2 == 0 else configs[::-1]
        for c in order:
            rec = launch(c, config_env(c, conf_path, noalgo_path), n, sizes, a, a.log)
            rec["round"] = r
            doc["rounds"].append(rec)
            big = [x for x in rec.get("rows", []) if x["bytes"] == sizes[-1]]
            print(f"round {r} {c:13s} rc={rec['rcs']} wall {rec['wall_s']} s init {rec.get('init_s')} s "
                  f"busbw@{fmt_size(sizes[-1])} {big[0]['busbw_gbps'] if big else rec.get('error')}", flush=True)
            if a.json:
                json.dump(doc, open(a.json, "w"), indent=1)
    doc["elapsed_s"] = round(time.time() - t0, 1)
    if a.json:
        json.dump(doc, open(a.json, "w"), indent=1)
    text = report(doc)
    print(text)
    if a.report:
        open(a.report, "w").write(text)
    return 0 if all(not rec.get("error") and all(x["correct"] for x in rec["rows"]) for rec in doc["rounds"]) else 1


def cmd_debug(a) -> int:
    """One NCCL_DEBUG=INFO run per config (small set of sizes): proves what NCCL took from NCCL_CONF_FILE."""
    conf_path, noalgo_path, meta = prepare(a)
    n = a.nranks or gpu_count()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    dbg = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": a.subsys}
    res = []
    for c in a.configs.split(","):
        with open(a.log, "a") as f:
            f.write(f"\n===== config {c} =====\n")
        env = config_env(c, conf_path, noalgo_path)
        if c.startswith("suite"):
            with open(a.log, "a") as f:
                f.write(f"NCCL_CONF_FILE={env['NCCL_CONF_FILE']}:\n{open(env['NCCL_CONF_FILE']).read()}\n")
        rec = launch(c, env, n, sizes, a, a.log, extra_env=dbg, timeout=a.timeout)
        res.append(rec)
        print(json.dumps({k: rec.get(k) for k in ("config", "rcs", "wall_s", "error")}), flush=True)
    if a.json:
        json.dump({"meta": meta, "runs": res}, open(a.json, "w"), indent=1)
    return 0


def med(vals):
    return statistics.median(vals) if vals else None


def report(doc: dict) -> str:
    configs, sizes, n = doc["configs"], doc["sizes"], doc["nranks"]
    per: dict = {c: {s: [] for s in sizes} for c in configs}
    for rec in doc["rounds"]:
        for row in rec.get("rows", []):
            per[rec["config"]][row["bytes"]].append(row["busbw_gbps"])
    nrounds = {c: sum(1 for r in doc["rounds"] if r["config"] == c and r.get("rows")) for c in configs}
    lines = [f"all-reduce bf16, {n} ranks, busbw GB/s (median over rounds: "
             + ", ".join(f"{c} {nrounds[c]}" for c in configs) + "); ratio = x / default; line = / "
             f"{NVLINK_LINE_GBPS:.0f} GB/s", ""]
    head = "| size | " + " | ".join(configs) + " | " + " | ".join(f"{c}/default" for c in configs if c != "default") \
        + " | " + " | ".join(f"{c}/line" for c in configs) + " | spread (min-max of rounds) |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    worst = None
    for s in sizes:
        m = {c: med(per[c][s]) for c in configs}
        cells = [f"{m[c]:.1f}" if m[c] is not None else "-" for c in configs]
        rat = []
        for c in configs:
            if c == "default":
                continue
            if m[c] is not None and m.get("default"):
                r = m[c] / m["default"]
                rat.append(f"{r:.3f}")
                if c == "suite" and s >= 128 << 20 and (worst is None or r < worst[0]):
                    worst = (r, s)
            else:
                rat.append("-")
        line = [f"{m[c] / NVLINK_LINE_GBPS:.3f}" if m[c] is not None else "-" for c in configs]
        spread = "; ".join(f"{c} {min(per[c][s]):.1f}-{max(per[c][s]):.1f}" for c in configs if per[c][s])
        lines.append(f"| {fmt_size(s)} | " + " | ".join(cells) + " | " + " | ".join(rat) + " | "
                     + " | ".join(line) + f" | {spread} |")
    if worst:
        ok = worst[0] >= 0.98
        lines += ["", f"goal (suite >= 0.98 x default at every size >= 128 MiB): {'MET' if ok else 'MISSED'}; "
                  f"worst suite/default {worst[0]:.3f} at {fmt_size(worst[1])}"]
    sub = (doc.get("meta", {}).get("ifname") or {}).get("substituted")
    if sub:
        lines.append(f"conf substitution on this host: {sub['from']!r} -> {sub['to']!r}")
    return "\n".join(lines) + "\n"


def cmd_report(a) -> int:
    print(report(json.load(open(a.json_in))), end="")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(q):
        q.add_argument("--conf", help="rendered nccl.conf (provision render ... --out DIR: DIR/etc/nccl.conf)")
        q.add_argument("--fix-ifname", action="store_true",
                       help="rewrite only NCCL_SOCKET_IFNAME when it names no interface of this host")
        q.add_argument("--workdir", help="where the effective conf files are written (default: a temp dir)")
        q.add_argument("--nranks", type=int, default=0, help="processes = GPUs (default: nvidia-smi -L count)")
        q.add_argument("--warmup", type=int, default=10)
        q.add_argument("--loops", type=int, default=3, help="timed loops per size (median taken)")
        q.add_argument("--iters-small", type=int, default=100)
        q.add_argument("--iters-large", type=int, default=20)
        q.add_argument("--large-from", default="256M")
        q.add_argument("--json")
        q.add_argument("--log", help="append the workers' stdout/stderr here")

    r = sub.add_parser("run")
    common(r)
    r.add_argument("--configs", default="default,suite")
    r.add_argument("--min-size", default="1M")
    r.add_argument("--max-size", default="4G")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--min-rounds", type=int, default=3)
    r.add_argument("--time-budget", type=float, default=1e9, help="start no round after this many seconds")
    r.add_argument("--report", help="write the markdown table here too")
    d = sub.add_parser("debug")
    common(d)
    d.add_argument("--configs", default="default,suite")
    d.add_argument("--sizes", default="1M,256M")
    d.add_argument("--subsys", default="INIT,ENV,TUNING,GRAPH")
    d.add_argument("--timeout", type=int, default=120)
    rp = sub.add_parser("report")
    rp.add_argument("json_in")
    w = sub.add_parser("worker")
    w.add_argument("--result", required=True)
    w.add_argument("--sizes", required=True)
    w.add_argument("--warmup", type=int, default=10)
    w.add_argument("--loops", type=int, default=3)
    w.add_argument("--iters-small", type=int, default=100)
    w.add_argument("--iters-large", type=int, default=20)
    w.add_argument("--large-from", default="256M")
    a = p.parse_args(argv)
    if a.cmd == "debug" and not a.log:
        raise SystemExit("debug needs --log")
    return {"run": cmd_run, "debug": cmd_debug, "report": cmd_report, "worker": worker}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
