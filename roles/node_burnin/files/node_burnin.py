#!/usr/bin/env python3
"""node_burnin: does every GPU of this node perform as its model should? One JSON result per check per GPU;
exit 0 every check passed or skipped, 1 a check failed, 2 usage.

Python 3.9+ standard library, plus burninjudge.py and nodeparse.py next to this file (shared with the provisioner
CLI) and burnin_torch.py, which runs under a python that has torch with CUDA (the vLLM venv): the GPU work itself.
Where no such python exists the checks that need it skip, or `--measure-cmd` names a program that prints the same
lines (the simulated rack's hardware stand-in, hwsim-burnin). Runnable by hand:

    python3 node_burnin.py --tier quick --json [--thresholds '{"metrics": {"gemm_bf16_tflops": {"min": 600}}}']

Tiers (docs/burn-in.md):
  quick     GEMM bf16/fp8, HBM copy, host<->device pinned copy, SDC (known answer, repeat bit-exact, GPUs agree),
            a short load with clocks/throttle reasons/PCIe link watched, single-node NCCL all-reduce, ECC/row-remap/XID
            deltas across the run, `dcgmi diag -r 2` where dcgmi exists
  standard  quick + a sustained stress with the thermal/power watch, GPU-to-GPU (P2P) copy bandwidth,
            `dcgmi diag -r 3`; cross-node NCCL and pairwise IB (perftest) run from the controller across the
            cluster's members (skip here, saying so)
  soak      standard repeated --soak-rounds times, `dcgmi diag -r 4`
A result: {"check", "gpu" (index or null), "status": pass|fail|warn|skip, "code" (BRNnnn when failed), "metric",
"value", "unit", "expected", "message"}; the last line {"check": "summary", "status", "failed", "host", "tier",
"seconds"}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from burninjudge import (  # noqa: E402
    METRICS,
    decode_reasons,
    judge_load,
    judge_metric,
    judge_pcie,
    judge_sustained,
    summarize,
)
from nodeparse import parse_ib_sysfs, parse_query_csv, parse_xids  # noqa: E402

TIERS = ("quick", "standard", "soak")
WATCH_FIELDS = ["index", "clocks.sm", "clocks.max.sm", "temperature.gpu", "power.draw", "pcie.link.gen.current",
                "pcie.link.width.current"]
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
ECC_FIELDS = ["index", "ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.volatile.total",
              "remapped_rows.pending", "remapped_rows.failure", "remapped_rows.uncorrectable"]


def result(check, status, message, gpu=None, code=None, metric=None, value=None, unit=None, expected=None,
           **extra):
    r = {"check": check, "gpu": gpu, "status": status, "message": message}
    if code:
        r["code"] = code
    if metric:
        r.update(metric=metric, value=value, unit=unit)
    if expected is not None:
        r["expected"] = expected
    r.update(extra)
    return r


def run(argv, timeout=60):
    """(rc, stdout, stderr); 127 missing, 124 timed out."""
    if os.sep not in argv[0] and shutil.which(argv[0]) is None:
        return 127, "", "%s: not found" % argv[0]
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                           universal_newlines=True, errors="replace")
        return p.returncode, p.stdout, p.stderr
    except FileNotFoundError:
        return 127, "", "%s: not found" % argv[0]
    except subprocess.TimeoutExpired:
        return 124, "", "%s: timed out after %ss" % (argv[0], timeout)
    except OSError as exc:
        return 126, "", "%s: %s" % (argv[0], exc)


def first_line(text):
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def num(v):
    try:
        return float(str(v).strip().split()[0])
    except (ValueError, IndexError, AttributeError):
        return None


class Node:
    def __init__(self, a):
        self.a = a
        self.reason_field = None

    def smi_query(self, fields, timeout=30):
        rc, out, err = run([self.a.nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
                           timeout)
        if rc != 0:
            return None, first_line(out or err) or "rc %d" % rc
        return parse_query_csv(out, fields), None

    def reasons_field(self):
        if self.reason_field is None:
            self.reason_field = ""
            for f in REASON_FIELDS:
                rows, _ = self.smi_query(["index", f])
                if rows is not None:
                    self.reason_field = f
                    break
        return self.reason_field

    def ecc(self):
        rows, err = self.smi_query(ECC_FIELDS)
        if rows is None:
            return None, err
        return {int(r["index"]): r for r in rows if str(r.get("index", "")).isdigit()}, None

    def kmsg_xids(self):
        """(XIDs in the kernel log, source) or (None, why)."""
        paths = [self.a.kmsg] if self.a.kmsg else ["/dev/kmsg"]
        for p in paths:
            try:
                fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                continue
            chunks = []
            try:
                while True:
                    try:
                        b = os.read(fd, 65536)
                    except BlockingIOError:
                        break
                    except OSError:
                        break
                    if not b:
                        break
                    chunks.append(b.decode("utf-8", "replace") + ("" if os.path.isfile(p) else "\n"))
            finally:
                os.close(fd)
            return parse_xids("".join(chunks)), p
        if not self.a.kmsg:
            for argv in (["journalctl", "-k", "-b", "--no-pager"], ["dmesg"]):
                rc, out, _ = run(argv)
                if rc == 0:
                    return parse_xids(out), argv[0]
        return None, "kernel log unreadable (/dev/kmsg, journalctl -k, dmesg)"


class Watch(threading.Thread):
    """Samples clocks, temperature, power, throttle reasons and the PCIe link every second while a load runs."""

    def __init__(self, node, interval=1.0):
        super().__init__(daemon=True)
        self.node, self.interval = node, interval
        self.samples = []  # (t, row)
        self.stop = threading.Event()
        self.fields = WATCH_FIELDS + ([node.reasons_field()] if node.reasons_field() else [])

    def run(self):
        while not self.stop.is_set():
            rows, _ = self.node.smi_query(self.fields, timeout=10)
            t = time.time()
            for r in rows or []:
                self.samples.append((t, r))
            self.stop.wait(self.interval)

    def summary(self, t0, t1):
        """{gpu: figures} over samples in [t0, t1] (the load window the worker reported)."""
        by = {}
        for t, r in self.samples:
            if t0 <= t <= t1 and str(r.get("index", "")).isdigit():
                by.setdefault(int(r["index"]), []).append(r)
        out = {}
        rf = self.node.reasons_field()
        for g, rows in by.items():
            clocks = [c for c in (num(r.get("clocks.sm")) for r in rows) if c is not None]
            maxc = [c for c in (num(r.get("clocks.max.sm")) for r in rows) if c is not None]
            temps = [c for c in (num(r.get("temperature.gpu")) for r in rows) if c is not None]
            power = [c for c in (num(r.get("power.draw")) for r in rows) if c is not None]
            gens = [c for c in (num(r.get("pcie.link.gen.current")) for r in rows) if c is not None]
            widths = [c for c in (num(r.get("pcie.link.width.current")) for r in rows) if c is not None]
            reasons = set()
            for r in rows:
                reasons.update(decode_reasons(r.get(rf)) if rf else [])
            out[g] = {"samples": len(rows),
                      "sm_clock_median_mhz": int(statistics.median(clocks)) if clocks else None,
                      "sm_clock_min_mhz": int(min(clocks)) if clocks else None,
                      "sm_clock_max_mhz": int(max(maxc)) if maxc else None,
                      "temp_max_c": int(max(temps)) if temps else None,
                      "power_max_w": round(max(power), 1) if power else None,
                      "pcie_gen": int(max(gens)) if gens else None,
                      "pcie_width": int(max(widths)) if widths else None,
                      "reasons": sorted(reasons)}
        return out


def find_torch_python(a):
    cands = [a.torch_python] if a.torch_python else [sys.executable, "/opt/vllm/venv/bin/python", "python3"]
    for c in cands:
        exe = c if os.sep in c else shutil.which(c)
        if not exe or not os.access(exe, os.X_OK):
            continue
        rc, _, _ = run([exe, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 3)"], 180)
        if rc == 0:
            return exe
    return None


class Worker:
    """Runs burnin_torch.py (or the --measure-cmd stand-in) and parses its lines."""

    def __init__(self, a):
        self.a = a
        self.cmd = None
        self.why = None
        if a.measure_cmd:
            self.cmd = [a.measure_cmd]
        else:
            py = find_torch_python(a)
            if py:
                self.cmd = [py, os.path.join(HERE, "burnin_torch.py")]
            else:
                self.why = "no python with torch and CUDA here (--torch-python, /opt/vllm/venv/bin/python)"
        self.info = {}

    def __call__(self, phase, *args, timeout=600):
        rc, out, err = run(self.cmd + [phase] + list(args), timeout)
        lines = []
        for line in out.splitlines():
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    if obj.get("kind") == "info":
                        self.info.update({k: v for k, v in obj.items() if k != "kind"})
                    lines.append(obj)
        if rc != 0 and not any(x.get("kind") == "measure" for x in lines):
            lines.append({"kind": "error", "gpu": None, "metric": phase,
                          "message": "%s phase failed (rc %d): %s" % (phase, rc, first_line(err[-3000:]) or
                                                                      first_line(out))})
        return lines


def measures(lines):
    return [x for x in lines if x.get("kind") == "measure"]


def measure_results(lines, thr, skip_metrics=()):
    out = []
    for m in measures(lines):
        if m["metric"] in skip_metrics:
            continue
        st, code, exp, msg = judge_metric(m["metric"], m.get("value"), thr)
        check = METRICS.get(m["metric"], (m["metric"],))[0]
        where = "GPU %s" % m["gpu"] if m.get("gpu") is not None else ""
        extra = {}
        if isinstance(m.get("peer"), int):
            where, extra = "%s -> GPU %d" % (where, m["peer"]), {"peer": m["peer"]}
        out.append(result(check, st, (where + ": " if where else "") + msg, gpu=m.get("gpu"), code=code,
                          metric=m["metric"], value=m.get("value"), unit=m.get("unit"), expected=exp, **extra))
    for x in lines:
        if x.get("kind") == "skip":
            out.append(result(x.get("metric", "measure").replace("_tflops", "").replace("_gbps", ""), "skip",
                              x.get("message", ""), gpu=x.get("gpu"), metric=x.get("metric")))
        elif x.get("kind") == "error":
            out.append(result("measure", "fail", "GPU %s: %s: %s" % (x.get("gpu"), x.get("metric"), x.get("message")),
                              gpu=x.get("gpu"), code="BRN014", metric=x.get("metric")))
    return out


def sdc_results(lines):
    out = []
    digests = {}
    for x in lines:
        if x.get("kind") != "sdc":
            continue
        g = x.get("gpu")
        if x.get("test") == "known_answer":
            out.append(result("sdc_known", "pass" if x.get("ok") else "fail",
                              "GPU %s: known-answer GEMMs %s" % (g, "exact" if x.get("ok") else "WRONG in %s elements"
                                                                 % x.get("mismatches")),
                              gpu=g, code=None if x.get("ok") else "BRN009"))
        elif x.get("test") == "repeat":
            digests[g] = x.get("digest")
            out.append(result("sdc_repeat", "pass" if x.get("ok") else "fail",
                              "GPU %s: %s repeated GEMMs %s" % (g, x.get("repeats"), "bit-identical" if x.get("ok")
                                                                else "differ (%s of them)" % x.get("mismatches")),
                              gpu=g, code=None if x.get("ok") else "BRN010", digest=x.get("digest")))
    if len(digests) >= 2:
        values = [d for d in digests.values() if d]
        common = max(set(values), key=values.count) if values else None
        odd = sorted(g for g, d in digests.items() if d != common)
        if odd:
            for g in odd:
                out.append(result("sdc_agree", "fail", "GPU %s: the same GEMM gave digest %s, the other GPUs %s"
                                  % (g, digests[g], common), gpu=g, code="BRN011"))
        else:
            out.append(result("sdc_agree", "pass", "%d GPUs gave the same GEMM bit for bit" % len(digests)))
    return out


def load_phase(a, node, worker, seconds, thr, burst, check="load"):
    """Run GEMMs on every GPU for `seconds` with the watch on; results: sustained GEMM, clocks/throttle, PCIe."""
    w = Watch(node)
    w.start()
    try:
        lines = worker("load", "--seconds", str(seconds), "--gemm-n", str(a.gemm_n), timeout=seconds + 300)
    finally:
        w.stop.set()
        w.join(15)
    ev = {x.get("event"): x.get("t") for x in lines if x.get("kind") == "event"}
    t0, t1 = ev.get("load_start"), ev.get("load_end")
    out = [r for r in measure_results(lines, thr) if r["status"] == "fail" and r.get("code") == "BRN014"]
    if t0 is None or t1 is None:
        return out or [result(check, "fail", "the load did not run", code="BRN014")], {}
    watch = w.summary(t0 + min(3.0, (t1 - t0) / 4), t1)  # the first seconds ramp clocks up
    for m in measures(lines):
        if m["metric"] != "sustained_bf16_tflops":
            continue
        g = m.get("gpu")
        st, code, exp, msg = judge_sustained(m.get("value"), burst.get(g), thr)
        out.append(result("stress" if check == "stress" else "sustained", st, "GPU %s: %s" % (g, msg), gpu=g,
                          code=code, metric="sustained_bf16_tflops", value=m.get("value"), unit="TFLOP/s",
                          expected=exp, seconds=m.get("seconds")))
    for g, wv in sorted(watch.items()):
        st, code, exp, msg = judge_load(wv, thr)
        out.append(result("clocks" if check == "load" else "thermal", st, "GPU %d: %s" % (g, msg), gpu=g, code=code,
                          expected=exp, found=wv))
    if check == "load":
        for g, wv in sorted(watch.items()):
            st, code, exp, msg = judge_pcie(wv.get("pcie_gen"), wv.get("pcie_width"), thr)
            out.append(result("pcie", st, "GPU %d: %s (seen under load)" % (g, msg), gpu=g, code=code, expected=exp))
    if not watch:
        out.append(result("clocks", "skip", "nvidia-smi gave no samples during the load"))
    return out, watch


def dcgm_result(a, level):
    exe = a.dcgmi or shutil.which("dcgmi")
    if not exe:
        return result("dcgm", "skip", "dcgmi not installed (datacenter-gpu-manager): DCGM diag -r %d not run" % level)
    rc, out, err = run([exe, "diag", "-r", str(level), "-j"], timeout={2: 600, 3: 2400, 4: 14400}.get(level, 600))
    if "host engine" in (out + err).lower() and ("unable to connect" in (out + err).lower()
                                                  or "connection invalid" in (out + err).lower()):
        return result("dcgm", "skip", "dcgmi is installed but its host engine (nv-hostengine, nvidia-dcgm.service) "
                      "is not running: DCGM diag -r %d not run" % level)
    failed = []
    try:
        doc = json.loads(out)
        for cat in (doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic") or {}).get("test_categories", []):
            for t in cat.get("tests", []):
                for r in t.get("results", []):
                    if str(r.get("status", "")).lower() == "fail":
                        failed.append("%s%s" % (t.get("name"), " GPU %s" % r.get("gpu_id")
                                                if r.get("gpu_id") is not None else ""))
    except ValueError:
        doc = None
    if rc != 0 or failed:
        why = ", ".join(failed[:6]) or first_line(err or out) or "rc %d" % rc
        return result("dcgm", "fail", "dcgmi diag -r %d failed: %s" % (level, why), code="BRN013")
    return result("dcgm", "pass", "dcgmi diag -r %d passed" % level)


def delta_results(node, before_ecc, before_xids, gpus):
    out = []
    after, err = node.ecc()
    if before_ecc is None or after is None:
        out.append(result("ecc_delta", "skip", "ECC/row-remap counters not readable: %s" % err))
    else:
        for g in sorted(after):
            b, x = before_ecc.get(g, {}), after[g]
            grew = []
            for f in ("ecc.errors.uncorrected.volatile.total", "remapped_rows.uncorrectable"):
                if num(x.get(f)) is not None and num(b.get(f)) is not None and num(x.get(f)) > num(b.get(f)):
                    grew.append("%s %d -> %d" % (f, num(b.get(f)), num(x.get(f))))
            for f in ("remapped_rows.pending", "remapped_rows.failure"):
                if str(x.get(f, "")).lower() == "yes" and str(b.get(f, "")).lower() != "yes":
                    grew.append("%s now Yes" % f)
            corr = (num(x.get("ecc.errors.corrected.volatile.total")) or 0) - \
                (num(b.get("ecc.errors.corrected.volatile.total")) or 0)
            if grew:
                out.append(result("ecc_delta", "fail", "GPU %d: %s during the test" % (g, "; ".join(grew)), gpu=g,
                                  code="BRN007"))
            else:
                out.append(result("ecc_delta", "warn" if corr > 0 else "pass",
                                  "GPU %d: no new uncorrectable ECC or row remap%s" % (
                                      g, " (%d corrected)" % corr if corr > 0 else ""), gpu=g))
    xids, src = node.kmsg_xids()
    if before_xids is None or xids is None:
        out.append(result("xid_delta", "skip", "kernel log not readable: %s" % (src if xids is None else
                                                                               "not before the test")))
    else:
        seen = {(x.pci, x.code, x.detail) for x in before_xids}
        new = [x for x in xids if (x.pci, x.code, x.detail) not in seen]
        bus = {str(r.get("pci.bus_id", "")).lower()[-12:-2]: int(r["index"]) for r in gpus if r.get("index")}
        for x in new:
            g = bus.get(x.pci.lower()[-10:]) if x.pci else None
            out.append(result("xid_delta", "fail", "XID %d on %s%s during the test" % (
                x.code, x.pci, " (GPU %s)" % g if g is not None else ""), gpu=g, code="BRN008", xid=x.code))
        if not new:
            out.append(result("xid_delta", "pass", "no new XID during the test [%s]" % src))
    return out


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def ib_link_results(a, thr):
    """Every HCA port burn-in is told about (--ib-hca): Active, LinkUp, and trained at the rate and width the model's
    catalog expects (sysfs `rate`: '400 Gb/sec (4X NDR)'); one result per port, the port named."""
    want = (thr or {}).get("ib") or {}
    hcas = [x for x in (a.ib_hca or "").lstrip("=^").split(",") if x.strip()]
    if not hcas:
        return [result("ib_link", "skip", "no InfiniBand HCA named (--ib-hca; inventory ib_hcas): nothing to check")]
    rate, width = want.get("rate_gbps"), want.get("width")
    exp = {k: v for k, v in (("rate_gbps", rate), ("width", width), ("state", "ACTIVE")) if v is not None}
    ibdir = os.path.join(a.sysfs_root, "sys/class/infiniband")
    out = []
    for item in hcas:
        hca, _, port = item.strip().partition(":")
        port = int(port) if port.isdigit() else 1
        link = "%s:%d" % (hca, port)
        base = os.path.join(ibdir, hca, "ports", str(port))
        raw = {n: _read(os.path.join(base, n)) for n in ("state", "phys_state", "rate")}
        if raw["state"] is None:
            out.append(result("ib_link", "fail", "%s: no such HCA port under %s" % (link, ibdir), code="BRN019",
                              expected=exp, link=link))
            continue
        ib = parse_ib_sysfs({os.path.join(base, n): v for n, v in raw.items() if v is not None})[hca][port]
        m = re.search(r"\((\d+)X", raw.get("rate") or "")
        w = int(m.group(1)) if m else None
        low = []
        if not ib.active or (ib.phys_state is not None and not ib.link_up):
            low.append("state %s/%s" % (ib.state, ib.phys_state))
        if rate and ib.rate_gbps is not None and ib.rate_gbps < float(rate):
            low.append("rate %g Gb/s < %g" % (ib.rate_gbps, float(rate)))
        if width and w is not None and w < int(width):
            low.append("width %dX < %dX" % (w, int(width)))
        found = "%s (%s)" % (raw.get("rate"), ib.state)
        if low:
            out.append(result("ib_link", "fail", "%s: link %s [%s]" % (link, ", ".join(low), found), code="BRN019",
                              metric="ib_link_rate_gbps", value=ib.rate_gbps, unit="Gb/s", expected=exp, link=link))
        else:
            out.append(result("ib_link", "pass", "%s: %s" % (link, found), metric="ib_link_rate_gbps",
                              value=ib.rate_gbps, unit="Gb/s", expected=exp or None, link=link))
    return out


def run_tier(a):
    node = Node(a)
    thr = json.loads(a.thresholds) if a.thresholds else {}
    results = []
    gpus, err = node.smi_query(["index", "name", "pci.bus_id"])
    if not gpus:
        results.append(result("gpu", "fail", "no GPU listed by nvidia-smi: %s" % (err or "none"), code="BRN014"))
        return results, {}
    ids = [int(r["index"]) for r in gpus]
    results.append(result("gpu", "pass", "%d GPUs: %s" % (len(ids), ", ".join(sorted({r["name"] for r in gpus})))))
    before_ecc, _ = node.ecc()
    before_xids, _ = node.kmsg_xids()
    worker = Worker(a)
    skip = set(a.skip or [])
    if worker.cmd is None:
        results.append(result("torch", "skip", "GPU workload checks skipped: %s" % worker.why))
    else:
        lines = worker("micro", "--gemm-n", str(a.gemm_n), "--seconds", str(a.measure_seconds),
                       "--sdc-repeats", str(a.sdc_repeats), timeout=900)
        results += measure_results(lines, thr)
        results += sdc_results(lines)
        burst = {m["gpu"]: m["value"] for m in measures(lines) if m["metric"] == "gemm_bf16_tflops"}
        if "load" not in skip:
            results += load_phase(a, node, worker, a.load_seconds, thr, burst)[0]
        if "nccl" in skip:
            pass
        elif len(ids) < 2:
            results.append(result("nccl", "skip", "1 GPU: a single-node all-reduce needs >= 2 GPUs",
                                  metric="nccl_allreduce_busbw_gbps"))
        else:
            ar = worker("allreduce", "--bytes", str(a.allreduce_bytes), timeout=600)
            for m in measures(ar):
                if m.get("correct") is False:
                    results.append(result("nccl", "fail", "all-reduce returned a wrong sum", code="BRN012",
                                          metric=m["metric"], value=m.get("value"), unit=m.get("unit")))
            results += measure_results(ar, thr)
        if a.tier in ("standard", "soak"):
            rounds = a.soak_rounds if a.tier == "soak" else 1
            for _ in range(rounds):
                if len(ids) >= 2:
                    results += measure_results(worker("p2p"), thr)
                else:
                    results.append(result("p2p", "skip", "1 GPU: no GPU-to-GPU link to measure", metric="p2p_gbps"))
                results += load_phase(a, node, worker, a.stress_seconds, thr, burst, check="stress")[0]
    results += ib_link_results(a, thr)
    if a.tier in ("standard", "soak"):
        for check, metric in (("nccl_cluster", "nccl_cluster_busbw_gbps"), ("ib_pair", "ib_pair_gbps")):
            results.append(result(check, "skip", "runs from the controller across the cluster's members "
                                  "(provision burn-in --tier %s), not on one node" % a.tier, metric=metric))
    if "dcgm" not in skip:
        results.append(dcgm_result(a, {"quick": 2, "standard": 3, "soak": 4}[a.tier]))
    results += delta_results(node, before_ecc, before_xids, gpus)
    return results, worker.info


def build_parser():
    p = argparse.ArgumentParser(prog="node_burnin.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Exit status: 0 every check passed or skipped, 1 a check failed, 2 usage.")
    p.add_argument("--tier", choices=TIERS, default="quick")
    p.add_argument("--json", action="store_true", help="JSON lines (the default; kept for symmetry with --text)")
    p.add_argument("--text", action="store_true", help="one line per result instead of JSON")
    p.add_argument("--thresholds", help="JSON threshold document (burninjudge.py); without it figures are reported")
    p.add_argument("--torch-python", help="python with torch+CUDA (default: this one, /opt/vllm/venv/bin/python)")
    p.add_argument("--measure-cmd", help="a program printing burnin_torch.py's lines (the simulated rack's stand-in)")
    p.add_argument("--nvidia-smi", default="nvidia-smi")
    p.add_argument("--dcgmi", help="dcgmi path (default: from PATH; absent: the DCGM check skips)")
    p.add_argument("--kmsg", help="kernel log: a kmsg device or kmsg-shaped file (default /dev/kmsg, journalctl -k)")
    p.add_argument("--sysfs-root", default="/", help="where sys/class/infiniband is read (the simulated rack: "
                   "/var/lib/hwsim)")
    p.add_argument("--ib-hca", help="HCA ports to check, NCCL_IB_HCA style: mlx5_0,mlx5_1:1 (none: ib_link skips)")
    p.add_argument("--gemm-n", type=int, default=8192)
    p.add_argument("--measure-seconds", type=float, default=1.0, help="timed seconds per micro measurement")
    p.add_argument("--sdc-repeats", type=int, default=20)
    p.add_argument("--load-seconds", type=int, default=20, help="quick tier's load under watch")
    p.add_argument("--stress-seconds", type=int, default=600, help="standard tier's sustained stress")
    p.add_argument("--soak-rounds", type=int, default=6)
    p.add_argument("--allreduce-bytes", type=int, default=1 << 30)
    p.add_argument("--skip", action="append", choices=("load", "nccl", "dcgm"), help="leave a part out")
    p.add_argument("--output", help="also write the results as one JSON document here")
    return p


def main(argv=None):
    a = build_parser().parse_args(argv)
    if a.thresholds:
        try:
            if not isinstance(json.loads(a.thresholds), dict):
                raise ValueError("not an object")
        except ValueError as exc:
            sys.stderr.write("node_burnin.py: --thresholds: not a JSON object (%s)\n" % exc)
            return 2
    t0 = time.time()
    results, info = run_tier(a)
    summary = summarize(results)
    summary.update(host=socket.gethostname(), tier=a.tier, seconds=round(time.time() - t0, 1), info=info)
    for r in results + [summary]:
        if a.text:
            sys.stdout.write("%-5s %-12s %s%s\n" % (r["status"].upper(), r["check"], r.get("message", ""),
                                                    " [%s]" % r["code"] if r.get("code") else ""))
        else:
            sys.stdout.write(json.dumps(r, sort_keys=True) + "\n")
    if a.output:
        tmp = a.output + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"results": results, "summary": summary}, f, indent=1, sort_keys=True)
        os.replace(tmp, a.output)
    return 1 if summary["status"] == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
