"""`provision status --html` as a browser renders it: a ledger with hosts in several states (transitions, a failed
health check, a remediation step, recorded states), the page written by the CLI in a real process, then a headless
Chromium screenshot of it (a PNG of the size asked for, not blank) and its DOM (every host named).

Needs Debian's chromium-headless-shell (.ci/install-deps.sh); without it the test fails. PROVISIONER_STATUS_SCREENSHOT=
PATH also copies the screenshot there (docs/img/status-html.png is made that way)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from html.parser import HTMLParser
from pathlib import Path

from inventory_factory import write_inventory

from provisioner.ledger import Ledger
from provisioner.ledger.site import path_site

SIZE = (1400, 1000)
HOSTS = ("gpu-a01", "gpu-a02", "gpu-b01", "gpu-b02", "gpu-c01")
INI = """\
[gpu_nodes]
gpu-a01 ansible_host=10.0.0.1
gpu-a02 ansible_host=10.0.0.2
gpu-b01 ansible_host=10.0.0.3
gpu-b02 ansible_host=10.0.0.4
gpu-c01 ansible_host=10.0.0.5

[qwen_a]
gpu-a01 node_rank=0
gpu-a02 node_rank=1
"""
CLUSTER = {"vllm_cluster": {"model": "/models/Qwen2-72B", "model_arch": "Qwen2-72B", "tensor_parallel_size": 8,
                            "pipeline_parallel_size": 2, "max_model_len": 4096, "max_num_seqs": 64}}
T0 = 1_767_225_600.0  # 2026-01-01 00:00:00Z


def chromium() -> str:
    for name in ("chromium-headless-shell", "chromium", "chromium-browser"):
        found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
        if found:
            return found
    raise AssertionError("no headless Chromium (chromium-headless-shell): run .ci/install-deps.sh")


def ledger(db: Path, inv: Path) -> None:
    """Five hosts: two in service (one cluster), one quarantined after a failed health check and a failed GPU reset,
    one in burn-in, one never seen (new)."""
    with Ledger.open(db, site=path_site(inv)) as lg:
        t = T0
        for host in HOSTS[:4]:
            for a, b in (("new", "provisioning"), ("provisioning", "burn-in")):
                t += 60
                lg.record_transition(host, a, b, reason="racked" if b == "provisioning" else "provisioned",
                                     actor="user:ops", at=t)
        run = lg.run_started("run", "inventory", hosts=HOSTS[:4], started=T0 + 600)
        lg.run_finished(run, "ok", hosts=[{"host": h, "status": "ok", "changed": 3} for h in HOSTS[:4]],
                        ended=T0 + 900)
        state = {"other:fact /var/lib/hwsim/sys/module/nvidia/version": "580.95.05",
                 "package:nvidia-kernel-open-580": "580.95.05-1 install ok installed"}
        lg.put_states([(h, run, "inputs", {**state, "file:/etc/provisioner/in-service": "0" * 64 + " 644 0 0"})
                       for h in HOSTS[:2]] + [(HOSTS[3], run, "inputs", state)])
        health = lg.run_started("health", "inventory", started=T0 + 1200)
        lg.run_finished(health, "failed", ended=T0 + 1260,
                        hosts=[{"host": h, "status": "failed" if h == "gpu-b01" else "ok"} for h in HOSTS[:4]],
                        health=[(h, "driver", "pass", "driver 580.95.05 == pinned") for h in HOSTS[:4]]
                        + [("gpu-b01", "ecc", "fail", "GPU 3: 2 uncorrectable ECC errors"),
                           ("gpu-b01", "xid", "fail", "Xid 79 on GPU 3 (fallen off the bus)")])
        for host in HOSTS[:2]:
            lg.record_transition(host, "burn-in", "in-service", reason="health gate passed", actor="policy:onboard",
                                 run=health, at=T0 + 1300)
        lg.record_transition("gpu-b01", "burn-in", "quarantined", reason="ecc: 2 uncorrectable ECC errors",
                             actor="policy:remediate", run=health, at=T0 + 1320)
        lg.record_step("gpu-b01", "gpu_reset", "failed", actor="policy:remediate", detail="GPU 3 busy (pid 4242)",
                       at=T0 + 1400)
        drift = lg.run_started("drift", "inventory", started=T0 + 2000)
        lg.run_finished(drift, "drift", hosts=[{"host": "gpu-a02", "status": "changed", "changed": 1}],
                        drift=[("gpu-a02", "file:/etc/nccl.conf")], ended=T0 + 2030)


def png(path: Path) -> tuple[int, int, bytes]:
    """(width, height, the decompressed image data) of a PNG; AssertionError when it is not one."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, size = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + length
    assert size is not None and idat, f"{path}: no IHDR or no IDAT chunk"
    return size[0], size[1], zlib.decompress(idat)


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_status_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser = chromium()
    inv = write_inventory(tmp_path / "inventory", ini=INI, group_vars={"qwen_a": CLUSTER})
    db = tmp_path / "ledger.sqlite3"
    ledger(db, inv)
    env = dict(os.environ, PROVISION_LEDGER=str(db), PROVISION_RUNS_DIR=str(tmp_path / "runs"), COLUMNS="300")
    page = tmp_path / "page.html"
    p = subprocess.run([sys.executable, "-m", "provisioner.cli", "status", str(inv.relative_to(tmp_path)), "--html",
                        str(page)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert all(h in p.stdout for h in HOSTS) and "recorded" in p.stdout and "580.95.05" in p.stdout

    text = _Text()
    text.feed(page.read_text())
    shown = " ".join(text.text)
    assert all(h in shown for h in HOSTS), shown
    assert "quarantined" in shown and "failed (ecc, xid)" in shown and "580.95.05" in shown

    shot = tmp_path / "shot.png"
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
              f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={SIZE[0]},{SIZE[1]}"]
    c = subprocess.run([*common, f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True,
                       timeout=180, env=dict(os.environ, HOME=str(tmp_path)))
    assert c.returncode == 0 and shot.exists(), f"{browser} exited {c.returncode}: {c.stderr[-2000:]}"
    width, height, pixels = png(shot)
    assert (width, height) == SIZE
    assert len(set(pixels)) > 16, "the screenshot is (nearly) one colour: the page did not render"

    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, HOME=str(tmp_path)))
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert all(f'data-host="{h}"' in dom.stdout for h in HOSTS), dom.stdout[:2000]

    if os.environ.get("PROVISIONER_STATUS_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["PROVISIONER_STATUS_SCREENSHOT"])
