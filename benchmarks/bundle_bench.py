"""The air-gapped bundle's size and build time for an inventory (docs/airgap.md), and a rebuild's cost.

    .venv/bin/python benchmarks/bundle_bench.py INVENTORY --out DIR [--label NAME] [--json FILE] [--summary]
        [-- BUILD-ARGS...]

Runs `provision bundle build INVENTORY --out DIR BUILD-ARGS` twice as the user runs it (a fresh process each): the
first into an empty DIR (every artifact fetched), the second unchanged (nothing fetched: the cost of checking), and
records wall time, the process tree's CPU, the artifact count and bytes by kind, the 1-minute load at start and end,
and the commit. `--summary` writes the record `bundle_build_<label>` into benchmarks/summary.json.

    flock /tmp/provisioner-rack.lock .venv/bin/python benchmarks/bundle_bench.py --rack NAME [--hosts N]
        [--label NAME] [--json FILE] [--summary]

Provisioning from the bundle vs online, on a simulated rack (root; created when missing, its hosts reset): the
same host(s), from fresh disks, converged by `provision run` (site.yml, the inventory `make demo` provisions: the
GPU nodes, no vLLM cluster) once online (the rack's own route: its apt proxy to Debian's mirror and the controller's
stand-in NVIDIA repo) and once from a bundle (built first into the testbed cache, not timed with the run; the hosts
made an isolated site's image, every way out of the rack dropped and counted; the first host serves the bundle:
playbooks/bundle_mirror.yml, timed on its own). `--summary` writes `bundle_vs_online_<label>` (default: N hosts).

    flock /tmp/provisioner-rack.lock .venv/bin/python benchmarks/bundle_bench.py --rack NAME --like INVENTORY
        [--online] [--down] [--label NAME] [--json FILE] [--summary]

The whole rack from the bundle: a rack with the hosts INVENTORY's [gpu_nodes] describes (e.g. inventories/rack-a.ini;
rewritten to the rack, provisioner_testbed.airgap.shaped_like: its group_vars/gpu_nodes.yml, the rack's connection,
no vLLM cluster) and one more host, lb01, the mirror. Times the bundle build (a first build into an empty directory),
the mirror (playbooks/bundle_mirror.yml), `provision run --bundle` of every GPU node with no way out of the rack
(drop counters must read 0), `provision drift` and `drift --full` (both must be clean); `--online` then resets the
nodes and times the same run online; `--down` takes the rack down at the end. The work directory (the bundle, its
key, the runs) is removed at the end, kept when a step failed. `--summary` writes `bundle_rack_<label>`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _summary import commit, loadavg, record  # noqa: E402

PROVISION = str(Path(sys.executable).with_name("provision"))


def _build(inv: str, out: Path, extra: list[str]) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([PROVISION, "bundle", "build", inv, "--out", str(out), *extra], capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"bundle build failed (exit {r.returncode}): {r.stderr[-2000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "summary": r.stderr.strip().splitlines()[-1]}


def _timed(args: list[str], env: dict[str, str], what: str, tail: int = 0) -> dict:
    """`provision ARGS` timed; `tail`: keep the last lines of its output (a drift's summary)."""
    load0, t0 = loadavg(), time.monotonic()
    r = subprocess.run([PROVISION, *args], capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{what} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
    out = {"wall_s": round(wall, 1), "load": {"start": load0, "end": loadavg()}}
    if tail:
        out["said"] = (r.stdout + r.stderr).strip().splitlines()[-tail:]
    return out


def rack_compare(name: str, hosts: int, label: str, json_out: Path | None, summary: bool) -> int:
    """Online vs bundle provisioning of the same fresh host(s) of rack `name` (module docstring)."""
    import tempfile

    from provisioner_testbed import airgap, rack, vault
    from provisioner_testbed.rootfs import cache_dir

    env = dict(os.environ, NO_COLOR="1", COLUMNS="200", **vault.env())
    h = rack.ensure(name, hosts, log=lambda m: print(f"testbed: {m}", file=sys.stderr))
    names = h.names
    mirror, addr = names[0], h.hosts[names[0]]
    work = Path(tempfile.mkdtemp(prefix="bundle-bench-"))
    env["PROVISION_RUNS_DIR"] = str(work / "runs")
    res: dict = {"rack": name, "hosts": names, "commit": commit(), "cpus": os.cpu_count()}
    # 1. online: fresh disks, the rack's own route out
    rack.reset(name)
    inv = airgap.plain_inventory(Path(h.inventory), work / "online", None)
    res["online"] = _timed(["run", str(inv)], env, "online run")
    print(f"online: {res['online']}", file=sys.stderr)
    # 2. from the bundle: built first (the cache keeps it: a later bench fetches only what changed)
    rack.reset(name)
    inv = airgap.plain_inventory(Path(h.inventory), work / "bundle", mirror)
    bundle = cache_dir() / f"airgap-bundle-bench-{name}"
    res["build"] = _timed(["bundle", "build", str(inv), "--out", str(bundle), "--no-suite", "--key-home",
                           str(cache_dir() / "airgap-bundle-key"), "--mirror-url", f"https://{addr}:8091/"],
                          env, "bundle build")
    # the mirror's certificate from the rack's CA (the nodes trust it: site_ca_certificates), the key vaulted
    airgap.mirror_tls(inv.parent, *rack.issue_certificate(name, addr), vault.password_file())
    airgap.point_at_bundle(inv.parent, bundle)
    airgap.isolate(h.ssh, names)
    table = airgap.table_name(name)
    airgap.drop_out_of(re.sub(r"\.\d+$", ".0/24", addr), table)
    try:
        res["mirror"] = _timed(["run", str(inv), "--playbook", "playbooks/bundle_mirror.yml", "--skip-preflight"],
                               env, "bundle mirror")
        res["bundle"] = _timed(["run", str(inv), "--bundle", str(bundle)], env, "run from the bundle")
        res["drops"] = airgap.counters(table)
    finally:
        airgap.remove(table)
    res["bundle_bytes"] = sum(a["size"] for a in json.loads((bundle / "manifest.json").read_text())["artifacts"])
    res["ratio_bundle_over_online"] = round(res["bundle"]["wall_s"] / res["online"]["wall_s"], 2)
    print(json.dumps(res, indent=1))
    if json_out:
        json_out.write_text(json.dumps(res, indent=1) + "\n")
    if summary:
        loads = [v for k in ("online", "mirror", "bundle") for v in res[k]["load"].values()]
        record(f"bundle_vs_online_{label or f'{len(names)}host'}",
               anchor="none (the note's figure: `provision run` from fresh disks online vs from the bundle)",
               ours={"online_run_s": res["online"]["wall_s"], "bundle_run_s": res["bundle"]["wall_s"],
                     "mirror_s": res["mirror"]["wall_s"], "drops": res["drops"]},
               ratio=res["ratio_bundle_over_online"], met=None, load={"min": min(loads), "max": max(loads)},
               source=f"benchmarks/bundle_bench.py --rack {name} --hosts {hosts}", detail=res)
    return 0


def rack_like(name: str, like: Path, label: str, online: bool, down: bool, json_out: Path | None,
              summary: bool) -> int:
    """A rack shaped like `like`'s GPU nodes provisioned from the bundle alone, then drift (module docstring)."""
    import tempfile

    from provisioner_testbed import airgap, rack, vault

    env = dict(os.environ, NO_COLOR="1", COLUMNS="200", **vault.env())
    want = [line.split()[0] for line in airgap.gpu_node_lines(like)]
    res: dict = {"rack": name, "like": str(like), "commit": commit(), "cpus": os.cpu_count()}
    t0, load0 = time.monotonic(), loadavg()
    h = rack.ensure(name, len(want), clusters=False, balancers=1, log=lambda m: print(f"testbed: {m}", file=sys.stderr))
    res["rack_up"] = {"wall_s": round(time.monotonic() - t0, 1), "load": {"start": load0, "end": loadavg()}}
    nodes = [n for n in h.names if n in want]
    if nodes != want:
        raise SystemExit(f"{like}: hosts {want}, rack {name} has {h.names}")
    mirror = next(n for n in h.names if n not in want)
    work = Path(tempfile.mkdtemp(prefix="bundle-rack-"))
    env["PROVISION_RUNS_DIR"] = str(work / "runs")
    inv = airgap.shaped_like(like, Path(h.inventory), h.hosts, work / "bundle", mirror)
    bundle = work / "bundle-dir"  # empty: a first build, every artifact fetched
    key_home = work / "key"
    res["hosts"] = {"nodes": nodes, "mirror": mirror}
    res["build"] = _timed(["bundle", "build", str(inv), "--out", str(bundle), "--no-suite", "--key-home",
                           str(key_home), "--mirror-url", f"https://{h.hosts[mirror]}:8091/"], env, "bundle build")
    arts = json.loads((bundle / "manifest.json").read_text())["artifacts"]
    res["bundle_bytes"] = sum(a["size"] for a in arts)
    res["bundle_artifacts"] = len(arts)
    print(f"build: {res['build']} {len(arts)} artifacts {res['bundle_bytes']} bytes", file=sys.stderr)
    airgap.mirror_tls(inv.parent, *rack.issue_certificate(name, h.hosts[mirror]), vault.password_file())
    airgap.point_at_bundle(inv.parent, bundle)
    airgap.isolate(h.ssh, h.names)
    table = airgap.table_name(name)
    airgap.drop_out_of(re.sub(r"\.\d+$", ".0/24", h.hosts[mirror]), table)
    try:
        res["mirror"] = _timed(["run", str(inv), "--playbook", "playbooks/bundle_mirror.yml", "--skip-preflight"],
                               env, "bundle mirror")
        print(f"mirror: {res['mirror']}", file=sys.stderr)
        res["bundle"] = _timed(["run", str(inv), "--bundle", str(bundle)], env, "run from the bundle")
        print(f"bundle run: {res['bundle']}", file=sys.stderr)
        res["drops_after_run"] = airgap.counters(table)
        # the probe tier (each node against the state its run recorded), then every host with the playbooks
        res["drift"] = _timed(["drift", str(inv)], env, "drift (exit 0: clean)", tail=3)
        res["drift_full"] = _timed(["drift", str(inv), "--full"], env, "drift --full (exit 0: clean)", tail=3)
        res["drops"] = airgap.counters(table)
    finally:
        airgap.remove(table)
    print(f"drift: {res['drift']} {res['drift_full']} drops {res['drops']}", file=sys.stderr)
    if any(res["drops"].values()) or any(res["drops_after_run"].values()):
        raise SystemExit(f"packets tried to leave the rack: {res['drops']}")
    if online:  # the same nodes from fresh disks, the rack's own route (proxy, stand-in repo)
        rack.reset(name)
        h = rack.ensure(name, len(want), clusters=False, balancers=1)
        oinv = airgap.shaped_like(like, Path(h.inventory), h.hosts, work / "online", mirror)
        oinv.write_text(oinv.read_text().split("\n[bundle_mirror]")[0] + "\n")
        res["online"] = _timed(["run", str(oinv)], env, "online run")
        res["ratio_bundle_over_online"] = round(res["bundle"]["wall_s"] / res["online"]["wall_s"], 2)
        print(f"online run: {res['online']}", file=sys.stderr)
    if down:
        rack.down(name)
    shutil.rmtree(work)  # the bundle, its signing key's secret half, the runs (kept when a step failed)
    print(json.dumps(res, indent=1))
    if json_out:
        json_out.write_text(json.dumps(res, indent=1) + "\n")
    if summary:
        loads = [v for k in ("build", "mirror", "bundle", "drift", "drift_full", "online") if k in res
                 for v in res[k]["load"].values()]
        record(f"bundle_rack_{label or like.stem}",
               anchor="none (the note's figure: a whole rack provisioned from the bundle with no way out)",
               ours={"bundle_bytes": res["bundle_bytes"], "build_s": res["build"]["wall_s"],
                     "mirror_s": res["mirror"]["wall_s"], "bundle_run_s": res["bundle"]["wall_s"],
                     "online_run_s": res.get("online", {}).get("wall_s"), "drift_s": res["drift"]["wall_s"],
                     "drift_full_s": res["drift_full"]["wall_s"],
                     "drops": res["drops"]},
               ratio=res.get("ratio_bundle_over_online"), met=None, load={"min": min(loads), "max": max(loads)},
               source=f"benchmarks/bundle_bench.py --rack {name} --like {like}{' --online' if online else ''}",
               detail=res)
    return 0


def main() -> int:
    if "--rack" in sys.argv[1:]:
        ap = argparse.ArgumentParser()
        ap.add_argument("--rack", required=True)
        ap.add_argument("--hosts", type=int, default=1)
        ap.add_argument("--like", type=Path)
        ap.add_argument("--online", action="store_true")
        ap.add_argument("--down", action="store_true")
        ap.add_argument("--label", default="")
        ap.add_argument("--json", type=Path)
        ap.add_argument("--summary", action="store_true")
        r = ap.parse_args()
        if r.like:
            return rack_like(r.rack, r.like, r.label, r.online, r.down, r.json, r.summary)
        return rack_compare(r.rack, r.hosts, r.label, r.json, r.summary)
    ap = argparse.ArgumentParser()
    ap.add_argument("inventory")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--summary", action="store_true")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    shutil.rmtree(a.out, ignore_errors=True)
    load0 = loadavg()
    first = _build(a.inventory, a.out, extra)
    second = _build(a.inventory, a.out, extra)
    load1 = loadavg()
    arts = json.loads((a.out / "manifest.json").read_text())["artifacts"]
    by_kind: dict[str, dict[str, int]] = {}
    for x in arts:
        k = by_kind.setdefault(x["kind"], {"count": 0, "bytes": 0})
        k["count"] += 1
        k["bytes"] += x["size"]
    res = {"inventory": a.inventory, "build_args": extra, "first": first, "unchanged_rebuild": second,
           "artifacts": len(arts), "bytes": sum(x["size"] for x in arts), "by_kind": by_kind,
           "load": {"start": load0, "end": load1}, "commit": commit(), "cpus": os.cpu_count()}
    print(json.dumps(res, indent=1))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    if a.summary:
        label = a.label or Path(a.inventory).stem
        record(f"bundle_build_{label}", anchor="none (a figure for the note: size and build time of the bundle)",
               ours={"bytes": res["bytes"], "artifacts": res["artifacts"], "first_wall_s": first["wall_s"],
                     "unchanged_rebuild_wall_s": second["wall_s"]}, ratio=None, met=None,
               load={"min": min(load0, load1), "max": max(load0, load1)},
               source=f"benchmarks/bundle_bench.py {a.inventory} --out {a.out} -- {' '.join(extra)}",
               detail={"by_kind": by_kind})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
