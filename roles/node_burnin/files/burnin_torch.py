#!/usr/bin/env python3
"""burnin_torch: the GPU measurements of node_burnin.py, run under a python that has torch with CUDA (the vLLM venv).

    python burnin_torch.py micro --gpus 0,1 [--gemm-n 8192] [--seconds 1.0]
    python burnin_torch.py load --gpus 0,1 --seconds 30
    python burnin_torch.py allreduce --gpus 0,1 --bytes 1073741824
    python burnin_torch.py p2p --gpus 0,1

One JSON object per line on stdout:
  {"kind": "info", ...}                                   torch / CUDA / device names
  {"kind": "measure", "gpu": I, "metric": NAME, "value": V, "unit": U, ...}
  {"kind": "sdc", "gpu": I, "test": "known_answer"|"repeat", "ok": bool, "digest": HEX, "mismatches": N}
  {"kind": "event", "event": "load_start"|"load_end", "t": EPOCH}
  {"kind": "error", "gpu": I|null, "metric": NAME, "message": TEXT}
node_burnin.py reads these; the simulated rack's stand-in (hwsim-burnin) prints the same lines from its spec.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # run-to-run bit-exact cuBLAS (repeat check)

import torch  # noqa: E402

GIB = 1 << 30


def emit(**kv):
    sys.stdout.write(json.dumps(kv, sort_keys=True) + "\n")
    sys.stdout.flush()


def timed(fn, dev, min_seconds, warmup=2):
    """(seconds per call, calls) of fn() on device dev, timed with CUDA events for at least min_seconds."""
    with torch.cuda.device(dev):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(dev)
        calls, total = 0, 0.0
        n = 1
        while total < min_seconds:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(n):
                fn()
            e.record()
            e.synchronize()
            total += s.elapsed_time(e) / 1000.0
            calls += n
            n = min(n * 2, 256)
        return total / calls, calls


def fp8_supported(dev):
    return torch.cuda.get_device_capability(dev) >= (8, 9) and hasattr(torch, "_scaled_mm") \
        and hasattr(torch, "float8_e4m3fn")


def gemm_bf16(dev, n, secs):
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    t, calls = timed(lambda: torch.mm(a, b, out=c), dev, secs)
    return 2.0 * n ** 3 / t / 1e12, calls


def gemm_fp8(dev, n, secs):
    a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    one = torch.ones((), device=dev, dtype=torch.float32)
    t, calls = timed(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), dev, secs)
    return 2.0 * n ** 3 / t / 1e12, calls


def hbm_copy(dev, nbytes, secs):
    """Device-to-device copy: each byte read once and written once."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    t, calls = timed(lambda: dst.copy_(src), dev, secs)
    return 2.0 * nbytes / t / 1e9, calls


def host_copy(dev, nbytes, secs, to_device):
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    if to_device:
        t, calls = timed(lambda: gpu.copy_(host, non_blocking=True), dev, secs)
    else:
        t, calls = timed(lambda: host.copy_(gpu, non_blocking=True), dev, secs)
    return nbytes / t / 1e9, calls


def digest(t):
    """A position-weighted checksum of t's bits, computed on its GPU (no numpy needed): equal tensors give equal
    digests; GPUs of one model given the same inputs must agree."""
    bits = t.contiguous().view(-1).view(torch.int16).to(torch.int64) & 0xFFFF
    w = torch.arange(1, bits.numel() + 1, device=t.device, dtype=torch.int64) % 1000003
    h = hashlib.sha256(("%d:%d" % (int((bits * w).sum().item()), int(bits.sum().item()))).encode())
    return h.hexdigest()[:16]


def sdc_known_answer(dev):
    """Integer-valued GEMMs whose every product and partial sum is exact: bf16 (entries -1..1, K 256: |c| <= 256,
    exact in bf16) and fp32 without TF32 (entries -2..2, K 4096) against an int64 reference on the CPU."""
    g = torch.Generator().manual_seed(1234)
    bad = 0
    for dtype, lo, hi, k in ((torch.bfloat16, -1, 2, 256), (torch.float32, -2, 3, 4096)):
        a = torch.randint(lo, hi, (1024, k), generator=g, dtype=torch.int64)
        b = torch.randint(lo, hi, (k, 1024), generator=g, dtype=torch.int64)
        ref = a @ b
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            got = (a.to(dev, dtype) @ b.to(dev, dtype)).to(torch.float64).cpu()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        bad += int((got != ref.to(torch.float64)).sum().item())
    return bad


def sdc_repeat(dev, n, repeats):
    """The same bf16 GEMM (same inputs on every GPU) `repeats` times: every result bit-identical to the first.
    Returns (mismatching repeats, digest of the first result) - the digest compares GPUs of one model."""
    g = torch.Generator().manual_seed(4321)
    a = torch.randn(n, n, generator=g).to(dev, torch.bfloat16)
    b = torch.randn(n, n, generator=g).to(dev, torch.bfloat16)
    first = torch.mm(a, b)
    bad = 0
    for _ in range(repeats - 1):
        if not torch.equal(torch.mm(a, b), first):
            bad += 1
    torch.cuda.synchronize(dev)
    return bad, digest(first)


def run_micro(a):
    for i in a.gpus:
        dev = torch.device("cuda", i)
        torch.cuda.set_device(dev)
        steps = [("gemm_bf16_tflops", "TFLOP/s", lambda: gemm_bf16(dev, a.gemm_n, a.seconds))]
        if fp8_supported(dev):
            steps.append(("gemm_fp8_tflops", "TFLOP/s", lambda: gemm_fp8(dev, a.gemm_n, a.seconds)))
        steps += [("hbm_copy_gbps", "GB/s", lambda: hbm_copy(dev, a.copy_bytes, a.seconds)),
                  ("h2d_gbps", "GB/s", lambda: host_copy(dev, a.host_bytes, a.seconds, True)),
                  ("d2h_gbps", "GB/s", lambda: host_copy(dev, a.host_bytes, a.seconds, False))]
        for metric, unit, fn in steps:
            try:
                v, calls = fn()
                emit(kind="measure", gpu=i, metric=metric, value=round(v, 2), unit=unit, calls=calls)
            except Exception as exc:  # one failed measurement names its GPU; the others still run
                emit(kind="error", gpu=i, metric=metric, message="%s: %s" % (type(exc).__name__, str(exc)[:300]))
            torch.cuda.empty_cache()
        if not fp8_supported(dev):
            emit(kind="skip", gpu=i, metric="gemm_fp8_tflops",
                 message="fp8 GEMM needs compute capability >= 8.9 (this GPU: %d.%d)"
                 % torch.cuda.get_device_capability(dev))
        try:
            bad = sdc_known_answer(dev)
            emit(kind="sdc", gpu=i, test="known_answer", ok=bad == 0, mismatches=bad)
        except Exception as exc:
            emit(kind="error", gpu=i, metric="sdc_known_answer", message="%s: %s" % (type(exc).__name__, exc))
        try:
            bad, dg = sdc_repeat(dev, a.sdc_n, a.sdc_repeats)
            emit(kind="sdc", gpu=i, test="repeat", ok=bad == 0, mismatches=bad, repeats=a.sdc_repeats, digest=dg)
        except Exception as exc:
            emit(kind="error", gpu=i, metric="sdc_repeat", message="%s: %s" % (type(exc).__name__, exc))
        torch.cuda.empty_cache()


def run_load(a):
    """bf16 GEMMs on every GPU at once for a.seconds; the sustained TFLOP/s of each (the parent watches clocks,
    temperature, power and throttle reasons meanwhile)."""
    n = a.gemm_n
    bufs = {}
    for i in a.gpus:
        dev = torch.device("cuda", i)
        bufs[i] = (torch.randn(n, n, device=dev, dtype=torch.bfloat16),
                   torch.randn(n, n, device=dev, dtype=torch.bfloat16),
                   torch.empty(n, n, device=dev, dtype=torch.bfloat16))
    for i in a.gpus:
        torch.cuda.synchronize(i)
    emit(kind="event", event="load_start", t=time.time())
    start = time.time()
    calls = {i: 0 for i in a.gpus}
    ev = {}
    for i in a.gpus:
        with torch.cuda.device(i):
            ev[i] = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            ev[i][0].record()
    while time.time() - start < a.seconds:
        for i in a.gpus:
            x, y, z = bufs[i]
            with torch.cuda.device(i):
                for _ in range(8):
                    torch.mm(x, y, out=z)
            calls[i] += 8
        for i in a.gpus:
            torch.cuda.synchronize(i)
    for i in a.gpus:
        with torch.cuda.device(i):
            ev[i][1].record()
            ev[i][1].synchronize()
    emit(kind="event", event="load_end", t=time.time())
    for i in a.gpus:
        secs = ev[i][0].elapsed_time(ev[i][1]) / 1000.0
        emit(kind="measure", gpu=i, metric="sustained_bf16_tflops", value=round(2.0 * n ** 3 * calls[i] / secs / 1e12,
                                                                                2), unit="TFLOP/s", seconds=round(secs, 1))


def run_p2p(a):
    """Device-to-device copy between every ordered pair of GPUs (NVLink or PCIe P2P when enabled)."""
    for i in a.gpus:
        for j in a.gpus:
            if i == j:
                continue
            try:
                src = torch.empty(a.host_bytes, dtype=torch.uint8, device=i).fill_(1)
                dst = torch.empty(a.host_bytes, dtype=torch.uint8, device=j)
                t, calls = timed(lambda: dst.copy_(src, non_blocking=True), i, a.seconds)
                emit(kind="measure", gpu=i, peer=j, metric="p2p_gbps", value=round(a.host_bytes / t / 1e9, 2),
                     unit="GB/s", calls=calls, p2p=torch.cuda.can_device_access_peer(i, j))
                del src, dst
            except Exception as exc:
                emit(kind="error", gpu=i, metric="p2p_gbps", message="to GPU %d: %s: %s" % (j, type(exc).__name__,
                                                                                          exc))
        torch.cuda.empty_cache()


def _allreduce_worker(rank, gpus, port, nbytes, iters, q):
    import torch.distributed as dist
    torch.cuda.set_device(gpus[rank])
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=len(gpus))
    try:
        n = len(gpus)
        x = torch.full((nbytes // 2,), float(rank + 1), dtype=torch.bfloat16, device="cuda")
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        x.fill_(float(rank + 1))
        dist.all_reduce(x)
        ok = bool((x == float(n * (n + 1) // 2)).all().item())
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            dist.all_reduce(x)
        e.record()
        torch.cuda.synchronize()
        t = s.elapsed_time(e) / 1000.0 / iters
        algbw = nbytes / t / 1e9
        q.put((rank, ok, algbw, algbw * 2 * (n - 1) / n))
    finally:
        dist.destroy_process_group()


def run_allreduce(a):
    import torch.multiprocessing as mp
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=_allreduce_worker, args=(r, a.gpus, port, a.bytes, a.iters, q))
             for r in range(len(a.gpus))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(a.timeout)
    res = [q.get() for _ in range(sum(1 for p in procs if p.exitcode == 0))]
    if len(res) != len(procs):
        emit(kind="error", gpu=None, metric="nccl_allreduce_busbw_gbps",
             message="all-reduce ranks exited %s" % [p.exitcode for p in procs])
        return
    busbw = min(r[3] for r in res)
    emit(kind="measure", gpu=None, metric="nccl_allreduce_busbw_gbps", value=round(busbw, 2), unit="GB/s",
         gpus=len(procs), bytes=a.bytes, correct=all(r[1] for r in res),
         nccl=".".join(map(str, torch.cuda.nccl.version())))


def main(argv=None):
    p = argparse.ArgumentParser(prog="burnin_torch.py")
    p.add_argument("phase", choices=("micro", "load", "allreduce", "p2p"))
    p.add_argument("--gpus", default="", help="comma-separated CUDA indices (default: all)")
    p.add_argument("--seconds", type=float, default=1.0, help="micro: per measurement; load: the whole load")
    p.add_argument("--gemm-n", type=int, default=8192)
    p.add_argument("--copy-bytes", type=int, default=2 * GIB)
    p.add_argument("--host-bytes", type=int, default=GIB)
    p.add_argument("--sdc-n", type=int, default=4096)
    p.add_argument("--sdc-repeats", type=int, default=20)
    p.add_argument("--bytes", type=int, default=GIB, help="all-reduce message size")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--timeout", type=float, default=300)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        emit(kind="error", gpu=None, metric="torch", message="torch %s: CUDA not available" % torch.__version__)
        return 3
    a.gpus = [int(x) for x in a.gpus.split(",") if x.strip()] or list(range(torch.cuda.device_count()))
    emit(kind="info", torch=torch.__version__, cuda=torch.version.cuda,
         devices={str(i): torch.cuda.get_device_name(i) for i in a.gpus},
         capability={str(i): "%d.%d" % torch.cuda.get_device_capability(i) for i in a.gpus})
    {"micro": run_micro, "load": run_load, "allreduce": run_allreduce, "p2p": run_p2p}[a.phase](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
