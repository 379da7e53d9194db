"""A site for `provision remediate` as a real process without a rack: four nodes in two 2-node clusters at a closed
port of 127.0.0.1 (every SSH step fails at once, as an unreachable node would), all in service in a real SQLite
ledger, and health passes (and burn-ins) recorded the way `provision health` (`provision burn-in`) records them. Used by
tests/integration/test_remediate_process.py and test_day2_rails_process.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from provisioner.ledger import Ledger
from provisioner.ledger.site import path_site

HOSTS = ("n1", "n2", "n3", "n4")
INI = """\
[gpu_nodes]
n1 ansible_host=127.0.0.1 ansible_port=1
n2 ansible_host=127.0.0.1 ansible_port=1
n3 ansible_host=127.0.0.1 ansible_port=1
n4 ansible_host=127.0.0.1 ansible_port=1

[c1]
n1 node_rank=0
n2 node_rank=1

[c2]
n3 node_rank=0
n4 node_rank=1
"""
Site = dict[str, Path]


def make(tmp: Path, *, policy: dict[str, Any], cluster: dict[str, Any], rails: dict[str, Any] | None,
         host_vars: dict[str, dict[str, Any]] | None = None, in_service_for: float = 3600.0) -> Site:
    """The inventory under tmp/inv (`remediation_rails` in group_vars/all.yml unless None) and the ledger with every
    node in service since `in_service_for` seconds ago."""
    inv = tmp / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    (inv / "hosts.ini").write_text(INI)
    (inv / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump({
        "gpu_model": "H100-SXM5-80GB", "gpu_count": 8, "fabric": "ethernet", "bootstrap_interface": "eth0",
        "ansible_ssh_common_args": "-o ConnectTimeout=3", "lifecycle_policy": policy}))
    for c in ("c1", "c2"):
        (inv / "group_vars" / f"{c}.yml").write_text(yaml.safe_dump({"vllm_cluster": cluster}))
    if rails is not None:
        (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump({"remediation_rails": rails}))
    for h, v in (host_vars or {}).items():
        (inv / "host_vars" / f"{h}.yml").write_text(yaml.safe_dump(v))
    site = {"inv": inv / "hosts.ini", "tmp": tmp, "db": tmp / "ledger.sqlite3"}
    with ledger(site) as lg:
        for h in HOSTS:
            for a, b in (("new", "provisioning"), ("provisioning", "burn-in"), ("burn-in", "in-service")):
                lg.record_transition(h, a, b, reason="setup", actor="test", at=time.time() - in_service_for)
    return site


def ledger(site: Site) -> Ledger:
    """The ledger of the site's inventory (its resolved path)."""
    return Ledger.open(site["db"], site=path_site(site["inv"]))


def health(site: Site, **fails: tuple[str, str]) -> None:
    """A `provision health` pass as record_health writes it: every host, each failing one's (check, detail)."""
    with ledger(site) as lg:
        run = lg.run_started("health", "inv")
        rows, checks = [], []
        for h in HOSTS:
            bad = fails.get(h)
            rows.append({"host": h, "status": "failed" if bad else "ok", "failed": int(bool(bad))})
            checks.append((h, bad[0], "fail", bad[1]) if bad else (h, "ecc", "pass", "no uncorrectable ECC errors"))
        lg.run_finished(run, "failed" if fails else "ok", hosts=rows, health=checks)


def provision(site: Site, *args: str) -> subprocess.CompletedProcess[str]:
    """`provision ARGS` as a process, on the site's ledger, its runs under tmp/runs."""
    env = dict(os.environ, PROVISION_RUNS_DIR=str(site["tmp"] / "runs"), PROVISION_LEDGER=str(site["db"]),
               COLUMNS="300")
    return subprocess.run([sys.executable, "-m", "provisioner.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def burnin(site: Site, *hosts: str, failed: str | None = None) -> None:
    """A `provision burn-in --tier quick` pass as record_burnin writes it, for `hosts` (the nodes here cannot run one:
    they are unreachable); `failed`: the host whose GEMM check failed on GPU 3."""
    from provisioner.ledger.record import record_burnin
    from provisioner.probes.burnin import HostBurnin

    res = {}
    for h in hosts:
        bad = h == failed
        row = {"check": "gemm_bf16", "gpu": 3, "status": "fail" if bad else "pass", "metric": "gemm_bf16_tflops",
               "value": 600.0 if bad else 689.0, "message": "GPU 3", **({"code": "BRN001"} if bad else {})}
        res[h] = HostBurnin(h, reachable=True, tier="quick", rc=1 if bad else 0, results=[row],
                            summary={"check": "summary"})
    record_burnin(res, "quick", site["inv"], time.time(), 0.0, site["db"])
