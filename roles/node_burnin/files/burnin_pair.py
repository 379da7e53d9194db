#!/usr/bin/env python3
"""burnin_pair: one side of a cross-node burn-in measurement between two members of a vLLM cluster; the controller
starts the `serve` side on one member and the `connect` side on the other at once (provision burn-in --tier standard).

    burnin_pair.py ib serve   --name node02 --hcas mlx5_0,mlx5_1 --port 38515 [--cmd ib_write_bw] [--seconds 5]
    burnin_pair.py ib connect --name node01 --peer 198.18.0.12 --peer-name node02 --hcas mlx5_0,mlx5_1 ...
    burnin_pair.py nccl serve|connect ... --port 38600 --cmd CMD

ib: perftest's `ib_write_bw` per rail (HCA i here to HCA i there, one rail after another, port + i), `-F
--report_gbits -D SECONDS`; the connect side reports each rail's average as one result `ib_pair` (Gb/s), the rail and
both hosts named. nccl: CMD runs on both members with MASTER_ADDR, MASTER_PORT, WORLD_SIZE=2, RANK / NODE_RANK set
(torchrun's environment); its nccl-tests output (`# Avg bus bandwidth : N`) is the result `nccl_cluster` (GB/s). The
ports are in the cluster firewall's member-only range. Python 3.9+ standard library; JSON lines like node_burnin.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

_BW = re.compile(r"^\s*\d+\s+\d+\s+([0-9.]+)\s+([0-9.]+)\s+[0-9.]+\s*$")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)")


def emit(**kv):
    sys.stdout.write(json.dumps(kv, sort_keys=True) + "\n")
    sys.stdout.flush()


def run(argv, timeout, env=None):
    if os.sep not in argv[0] and shutil.which(argv[0]) is None:
        return 127, "", "%s: not found" % argv[0]
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, env=env,
                           universal_newlines=True, errors="replace")
        return p.returncode, p.stdout, p.stderr
    except FileNotFoundError:
        return 127, "", "%s: not found" % argv[0]
    except subprocess.TimeoutExpired:
        return 124, "", "%s: timed out after %ss" % (argv[0], timeout)
    except OSError as exc:
        return 126, "", "%s: %s" % (argv[0], exc)


def last_line(text):
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return lines[-1][:300] if lines else ""


def parse_write_bw(text):
    """perftest's result line `#bytes #iterations BW peak BW average MsgRate` -> the average (Gb/s with
    --report_gbits), or None."""
    for line in (text or "").splitlines():
        m = _BW.match(line)
        if m:
            return float(m.group(2))
    return None


def ib(a):
    hcas = [h for h in a.hcas.split(",") if h]
    rc_all = 0
    for i, hca in enumerate(hcas):
        dev, _, port = hca.partition(":")
        port = port or "1"
        argv = [a.cmd, "-d", dev, "-i", port, "-p", str(a.port + i), "-F", "--report_gbits", "-D", str(a.seconds)]
        link = "-".join("%s/%s:%s" % (h, dev, port) for h in sorted([a.name, a.peer_name]))  # as both sides name it
        if a.side == "serve":
            rc, out, err = run(argv, a.timeout)
            if rc != 0:
                emit(check="ib_pair_serve", status="fail", link=link, message="%s: %s (rc %d)" % (
                    link, last_line(err or out), rc))
                rc_all = 1
            continue
        deadline = time.time() + min(a.timeout, 60)
        while True:  # the server of this rail may not be listening yet (it starts within seconds, or never)
            rc, out, err = run(argv + [a.peer], min(a.timeout, a.seconds + 60))
            if rc == 0 or time.time() > deadline or "connect" not in (err + out).lower():
                break
            time.sleep(0.3)
        bw = parse_write_bw(out) if rc == 0 else None
        if rc == 127:  # as DCGM's check does where dcgmi is absent: said, not failed
            emit(check="ib_pair", status="skip", link=link, metric="ib_pair_gbps",
                 message="%s: %s not installed (perftest): pairwise InfiniBand bandwidth not measured" % (link, a.cmd))
            return 0
        if bw is None:
            emit(check="ib_pair", status="fail", code="BRN014", link=link, metric="ib_pair_gbps",
                 message="%s: ib_write_bw gave no figure (rc %d): %s" % (link, rc, last_line(err or out)))
            rc_all = 1
        else:
            emit(check="ib_pair", status="pass", link=link, metric="ib_pair_gbps", value=bw, unit="Gb/s",
                 message="%s: ib_write_bw %.1f Gb/s" % (link, bw))
    return rc_all


def nccl(a):
    env = dict(os.environ, MASTER_ADDR=a.peer or "0.0.0.0", MASTER_PORT=str(a.port),
               WORLD_SIZE="2", RANK="0" if a.side == "serve" else "1", NODE_RANK="0" if a.side == "serve" else "1")
    link = "%s-%s" % tuple(sorted([a.name, a.peer_name]))
    rc, out, err = run(a.cmd.split(), a.timeout, env=env)
    m = _AVG.search(out or "")
    if a.side == "serve":
        return 0 if rc == 0 else 1
    if rc == 127:
        emit(check="nccl_cluster", status="skip", link=link, metric="nccl_cluster_busbw_gbps",
             message="%s: %s not installed: the two-node all-reduce not measured" % (link, a.cmd.split()[0]))
        return 0
    if rc != 0 or not m:
        emit(check="nccl_cluster", status="fail", code="BRN014", link=link, metric="nccl_cluster_busbw_gbps",
             message="%s: all-reduce gave no figure (rc %d): %s" % (link, rc, last_line(err or out)))
        return 1
    bw = float(m.group(1))
    wrong = re.search(r"#\s*Out of bounds values\s*:\s*(\d+)", out or "")
    emit(check="nccl_cluster", status="pass", link=link, metric="nccl_cluster_busbw_gbps", value=bw, unit="GB/s",
         message="%s: all-reduce bus bandwidth %.1f GB/s across 2 nodes%s" % (
             link, bw, "" if not wrong or wrong.group(1) == "0" else ", %s wrong values" % wrong.group(1)))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="burnin_pair.py", description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=("ib", "nccl"))
    p.add_argument("side", choices=("serve", "connect"))
    p.add_argument("--name", required=True, help="this host's inventory name (labels the link)")
    p.add_argument("--peer", default="", help="the serving member's address (connect; nccl: both sides, MASTER_ADDR)")
    p.add_argument("--peer-name", default="", help="the other member's inventory name")
    p.add_argument("--hcas", default="", help="ib: HCA[:port] list, rail by rail")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cmd", default="ib_write_bw")
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--timeout", type=float, default=120)
    a = p.parse_args(argv)
    if a.side == "connect" and not a.peer:
        p.error("connect needs --peer")
    return ib(a) if a.kind == "ib" else nccl(a)


if __name__ == "__main__":
    sys.exit(main())
