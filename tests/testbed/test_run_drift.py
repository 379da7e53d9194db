"""`provision run` and `provision drift` on the simulated rack, end to end through the CLI.

site.yml runs without the vLLM area (`--skip-tags vllm`): this rack has no vLLM layer; tests/vllm covers it.
Debugging: PROVISIONER_RUNNER_NO_RESET=1 keeps the rack's disks (run a later test alone with -k),
PROVISIONER_RUNNER_INVENTORY / PROVISIONER_RUNNER_PLAYBOOK point the commands at another inventory / playbook.

One rack of its own (PROVISIONER_RUNNER_RACK, default `runner`, 4 hosts), reset to fresh disks at the start. The
tests run in file order and build on each other, as an operator would:

1. node01+node02 provisioned; node03+node04 onboarded with --serial 1: a failure in batch one (node03's apt broken)
   stops the rollout at --max-fail-percent 0 (node04 untouched, both in the retry file); fixed, the retry converges
   with one batch per host in the progress output.
2. drift on the converged rack: exit 0, empty report.
3. tamper node02 (edit /etc/nccl.conf, stop nvidia-persistenced, another build of the held cuda-cudart-12-8, alter
   a unit file): drift reports exactly those four resources on node02 and nothing else, in all four formats, exit 3; node02
   is byte-for-byte unchanged by the check (file tree hashes, dpkg state, unit states).
4. `provision run --limit node02` heals it; drift on node02 is clean again. Left on an older loaded kernel module
   than the installed one (a run killed before its reboot), the next run reboots it into the installed one, once.
5. node04 stopped: drift reports it unreachable while the others are checked (exit 1); run reports it unreachable
   while the others complete; started again, `--limit @retry` converges.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testbed_rigs import HOST_SNAPSHOT  # noqa: E402  (same directory)

from provisioner import PLAYBOOKS, PROJECT_ROOT

pytestmark = pytest.mark.testbed

PROVISION = [sys.executable, "-m", "provisioner.cli"]
HELD_PKG = "cuda-cudart-12-8"  # a held package of the cuda_nccl role
HELD_PIN = "12.8.90-1"  # its pinned version (docs/development.md), as the stand-in repo serves it
HELD_OLD = "12.8.61-1"  # "another build installed by hand": the stand-in .deb repacked with this version
FW_UNIT = "/etc/systemd/system/provisioner-firewall.service"



def _norm(s: str) -> str:
    return " ".join(s.split())


class Rig:
    def __init__(self, handle: Any, runs: Path) -> None:
        self.h = handle
        # debugging hooks: another inventory/playbook for the same rack (e.g. an overlay with extra vars)
        self.inv = os.environ.get("PROVISIONER_RUNNER_INVENTORY") or str(handle.inventory)
        self.playbook = os.environ.get("PROVISIONER_RUNNER_PLAYBOOK")
        self.runs = runs

    def cli(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PROVISION_RUNS_DIR=str(self.runs))
        if args and args[0] in ("run", "drift"):
            # this rack has no vLLM layer (tests/vllm has its own rack): site.yml without the vLLM area
            args = (*args, "--skip-tags", "vllm")
            if self.playbook:
                args = (*args, "--playbook", self.playbook)
        p = subprocess.run([*PROVISION, *args], capture_output=True, text=True, env=env, timeout=timeout,
                           cwd=PROJECT_ROOT)
        assert "Traceback" not in p.stderr, p.stderr
        return p

    def run(self, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        p = self.cli("run", self.inv, "--json", *args)
        try:
            data = json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"no JSON from provision run (rc {p.returncode}): {p.stdout}\n{p.stderr}") from None
        return p, data

    def drift(self, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
        p = self.cli("drift", self.inv, *args)
        m = re.search(r"run dir: (\S+)", p.stderr)
        assert m, f"no run dir printed (rc {p.returncode}): {p.stdout}\n{p.stderr}"
        return p, Path(m.group(1))

    def ssh(self, host: str, cmd: str, timeout: float = 600) -> str:
        r = self.h.ssh(host, cmd, timeout=timeout)
        assert r.returncode == 0, f"{host}: {cmd}: {r.stdout}{r.stderr}"
        return r.stdout


def _site_complete() -> str | None:
    site = (PLAYBOOKS / "site.yml").read_text()
    missing = [m for m in re.findall(r"import_playbook:\s*(\S+)", site) if not (PLAYBOOKS / m).is_file()]
    return f"playbooks/site.yml imports missing playbooks: {missing}" if missing else None


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root")
    if (why := _site_complete()) is not None:
        pytest.skip(why)
    from provisioner_testbed import rack

    name = os.environ.get("PROVISIONER_RUNNER_RACK", "runner")
    existed = rack.RackState.load(name) is not None
    rack.ensure(name, 4, log=lambda m: print(f"testbed: {m}"))
    if os.environ.get("PROVISIONER_RUNNER_NO_RESET") != "1":  # debugging: keep an already provisioned rack
        rack.reset(name, log=lambda m: print(f"testbed: {m}"))  # fresh disks: node03/node04 are new hosts
    h = rack.ensure(name, 4, log=lambda m: print(f"testbed: {m}"))
    r = Rig(h, tmp_path_factory.mktemp("runs"))
    v = r.cli("validate", r.inv)
    if v.returncode != 0:
        pytest.fail(f"the rack's generated inventory does not validate; provision run refuses it:\n{v.stdout}{v.stderr}")
    yield r
    try:
        rack.start_host_cmd(name, "node04")
    finally:
        if not existed and os.environ.get("PROVISIONER_TESTBED_TEARDOWN") == "1":
            rack.down(name)


def test_the_racks_secret_is_vaulted_and_a_command_without_the_password_says_so(rig: Rig) -> None:
    """The generated inventory vaults its API key (every run and drift below goes through the vault path); without
    the vault password a command that needs it stops in one line, exit 2, before it touches a host."""
    from provisioner_testbed import vault

    text = (Path(rig.inv).parent / "group_vars" / "all.yml").read_text()
    assert "vllm_api_key: !vault |" in text and "testbed-vllm-key" not in text
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")}
    env["PROVISION_RUNS_DIR"] = str(rig.runs)
    for cmd in (["drift", rig.inv], ["run", rig.inv, "--limit", "node01"]):
        p = subprocess.run([*PROVISION, *cmd], capture_output=True, text=True, env=env, timeout=300,
                           cwd=PROJECT_ROOT)
        assert p.returncode == 2, p.stdout + p.stderr
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
        assert "vllm_api_key on host node01 is vaulted and no vault password given: provision " in p.stderr, p.stderr
    # validate checks the vaulted value without decrypting it
    p = subprocess.run([*PROVISION, "validate", rig.inv], capture_output=True, text=True, env=env, timeout=300,
                       cwd=PROJECT_ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert os.environ.get(vault.ENV) == str(vault.password_file())


def test_onboarding_serial_batches_stop_on_failure_then_converge(rig: Rig) -> None:
    p, first = rig.run("--limit", "node01,node02")
    assert p.returncode == 0, p.stderr + json.dumps(first["failures"], indent=1)
    assert "not recorded" not in p.stderr, p.stderr  # the hosts' states are recorded with a vaulted inventory
    assert first["succeeded"] and sorted(first["hosts"]) == ["node01", "node02"]
    assert all(h["changed"] > 0 for h in first["hosts"].values())
    assert Path(first["artifact_dir"], "job_events").is_dir()

    # batch one fails: node03's apt cannot update (a broken source), --max-fail-percent 0 stops the rollout
    rig.ssh("node03", "echo 'deb [trusted=yes] http://127.0.0.1:9/broken ./' > /etc/apt/sources.list.d/broken.list")
    p = rig.cli("run", rig.inv, "--limit", "node03,node04", "--serial", "1", "--max-fail-percent", "0")
    assert p.returncode == 1, p.stdout + p.stderr
    assert re.search(r"PLAY \[[^\]]+\] batch 1", p.stderr), p.stderr
    assert " batch 2" not in p.stderr
    assert re.search(r"FAILED node03: TASK \[", p.stdout), p.stdout
    assert "NOT RUN (the rollout stopped before reaching them): node04" in p.stdout
    m = re.search(r"--limit @(\S+/retry)", p.stdout)
    assert m, p.stdout
    retry = m.group(1)
    assert Path(retry).read_text().split() == ["node03", "node04"]
    assert rig.h.ssh("node04", "test -e /etc/nccl.conf || dpkg -s nvidia-persistenced").returncode != 0, \
        "node04 was touched after batch one failed"

    # fixed: the retry file onboards both, one batch per host, progress names the batches
    rig.ssh("node03", "rm /etc/apt/sources.list.d/broken.list")
    p = rig.cli("run", rig.inv, "--limit", f"@{retry}", "--serial", "1", "--max-fail-percent", "0")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "not recorded" not in p.stderr, p.stderr
    assert re.search(r"PLAY \[[^\]]+\] batch 1", p.stderr) and re.search(r"PLAY \[[^\]]+\] batch 2", p.stderr)
    rows = {ln.split()[0]: ln.split() for ln in p.stdout.splitlines() if ln.startswith("node0")}
    assert rows["node03"][-1] == "1" and rows["node04"][-1] == "2", p.stdout  # BATCH column


def test_drift_clean_after_run(rig: Rig) -> None:
    p, run_dir = rig.drift("--report", "json")
    data = json.loads(p.stdout)
    assert p.returncode == 0, json.dumps(data["hosts"], indent=1) + p.stderr
    assert data["drift_found"] is False and data["complete"] is True
    assert sorted(data["hosts"]) == ["node01", "node02", "node03", "node04"]
    assert all(h["drift"] == [] and h["state"] == "clean" for h in data["hosts"].values())
    # the runs recorded every host's state (their input digests include the decrypted, keyed secret): no host goes
    # to Ansible for want of a record or for changed inputs; the digest key is the ledger's own (no key file beside
    # it) and the API key is in no file of the runs
    reasons = {n: (h["tier"], h["tier_reason"]) for n, h in data["hosts"].items()}
    assert all(t == 1 or (r or "").startswith("probe") for t, r in reasons.values()), reasons
    ledger = os.environ.get("PROVISION_LEDGER")
    assert not ((Path(ledger).parent if ledger and "://" not in ledger else rig.runs) / "digest.key").exists()
    leaked = [str(f) for f in rig.runs.rglob("*") if f.is_file() and f.stat().st_size < 50_000_000
              and b"testbed-vllm-key" in f.read_bytes()]
    assert leaked == []
    prom = (run_dir / "drift.prom").read_text()
    assert re.search(r'provisioner_drift_resources\{host="node02",role="nccl_tuning"\} 0', prom)


def _install_other_version(rig: Rig, host: str, tmp: Path) -> None:
    """Replace the held HELD_PKG on `host` by the same package under another version (dpkg -i of a repacked .deb),
    keeping the hold: what a hand-installed build looks like."""
    import urllib.request

    url = f"{rig.h.repo_url.rstrip('/')}/{HELD_PKG}_{HELD_PIN}_amd64.deb"
    deb = tmp / "orig.deb"
    deb.write_bytes(urllib.request.urlopen(url, timeout=30).read())
    tree = tmp / "pkg"
    subprocess.run(["dpkg-deb", "-R", str(deb), str(tree)], check=True)
    control = tree / "DEBIAN" / "control"
    control.write_text(re.sub(r"^Version: .*$", f"Version: {HELD_OLD}", control.read_text(), flags=re.M))
    other = tmp / "other.deb"
    subprocess.run(["dpkg-deb", "-b", "--root-owner-group", str(tree), str(other)], check=True, capture_output=True)
    up = subprocess.run(rig.h.ssh_argv(host, "cat > /root/other.deb"), input=other.read_bytes(), timeout=60)
    assert up.returncode == 0
    rig.ssh(host, f"set -e; apt-mark unhold {HELD_PKG} >/dev/null; dpkg -i /root/other.deb >/dev/null 2>&1; "
                  f"apt-mark hold {HELD_PKG} >/dev/null; rm /root/other.deb")
    assert rig.ssh(host, f"dpkg-query -W -f='${{Version}}' {HELD_PKG}").strip() == HELD_OLD
    assert "hold" in rig.ssh(host, f"dpkg --get-selections {HELD_PKG}")


def _snapshot(rig: Rig, host: str) -> str:
    return rig.ssh(host, HOST_SNAPSHOT)


def test_tamper_reported_exactly_in_all_formats_and_host_unchanged(rig: Rig, tmp_path: Path) -> None:
    rig.ssh("node02", "echo 'NCCL_DEBUG=TRACE' >> /etc/nccl.conf")
    rig.ssh("node02", "systemctl stop nvidia-persistenced")
    _install_other_version(rig, "node02", tmp_path)
    rig.ssh("node02", f"sed -i 's/^Description=.*/Description=edited by hand/' {FW_UNIT}; systemctl daemon-reload")
    before = _snapshot(rig, "node02")
    others = {h: _snapshot(rig, h) for h in ("node01", "node03")}

    out = tmp_path / "drift.prom"
    p, run_dir = rig.drift("--report", "prometheus", "--output", str(out))
    assert p.returncode == 3, p.stdout + p.stderr

    after = _snapshot(rig, "node02")
    assert after == before, "the drift check changed node02:\n" + "".join(
        list(difflib.unified_diff(before.splitlines(True), after.splitlines(True)))[:80])
    for h, snap in others.items():
        assert _snapshot(rig, h) == snap, f"the drift check changed {h}"
    assert "inactive" in rig.ssh("node02", "systemctl is-active nvidia-persistenced || true")

    expected = {("file", "/etc/nccl.conf"), ("service", "nvidia-persistenced"), ("package", HELD_PKG),
                ("file", FW_UNIT)}
    # JSON
    d = json.loads((run_dir / "drift.json").read_text())
    assert d["summary"]["drifted_hosts"] == ["node02"], json.dumps(d["hosts"], indent=1)
    got = {(i["kind"], i["resource"]) for i in d["hosts"]["node02"]["drift"]}
    assert got == expected, json.dumps(d["hosts"]["node02"]["drift"], indent=1)
    items = {i["resource"]: i for i in d["hosts"]["node02"]["drift"]}
    assert "-NCCL_DEBUG=TRACE" in items["/etc/nccl.conf"]["diff"]
    assert "-Description=edited by hand" in items[FW_UNIT]["diff"]
    assert items["/etc/nccl.conf"]["role"] == "nccl_tuning"
    assert items["nvidia-persistenced"]["role"] == "nvidia_persistenced"
    assert items[HELD_PKG]["role"] == "cuda_nccl"
    # JUnit
    root = ET.parse(run_dir / "drift.xml").getroot()
    failed = {(s.get("name"), c.get("name")) for s in root.iter("testsuite") for c in s.iter("testcase")
              if c.find("failure") is not None}
    assert failed == {("node02", f"{k}:{r}") for k, r in expected}
    assert root.get("failures") == "4" and root.get("errors") == "0"
    # Prometheus (the --output file and the run dir's copy are the same)
    prom = out.read_text()
    assert prom == (run_dir / "drift.prom").read_text()
    series = dict(re.findall(r'^provisioner_drift_resources\{host="([^"]+",role="[^"]+)"\} (\d+)$', prom, re.M))
    assert series['node02",role="nccl_tuning'] == "1"
    assert series['node02",role="nvidia_persistenced'] == "1"
    assert series['node02",role="cuda_nccl'] == "1"
    assert series['node02",role="cluster_firewall'] == "1"
    assert all(v == "0" for k, v in series.items() if not k.startswith("node02"))
    assert "provisioner_drift_last_run_timestamp_seconds " in prom
    assert re.findall(r'^provisioner_host_unreachable\{host="[^"]+"\} (\d)$', prom, re.M) == ["0"] * 4
    # text
    text = (run_dir / "drift.txt").read_text()
    assert "node02: 4 resources drifted" in text and "drift: 4 resources on 1 host of 4" in text
    for h in ("node01", "node03", "node04"):
        assert f"{h}: no drift" in text


def test_run_limit_heals_and_drift_is_clean_again(rig: Rig) -> None:
    p, data = rig.run("--limit", "node02")
    assert p.returncode == 0, p.stderr + json.dumps(data["failures"], indent=1)
    assert list(data["hosts"]) == ["node02"] and data["hosts"]["node02"]["changed"] >= 4
    assert rig.ssh("node02", "systemctl is-active nvidia-persistenced").strip() == "active"
    assert HELD_OLD not in rig.ssh("node02", f"dpkg-query -W {HELD_PKG}")
    p, run_dir = rig.drift("--report", "json", "--limit", "node02")
    assert p.returncode == 0, p.stdout
    assert json.loads(p.stdout)["hosts"]["node02"]["drift"] == []


def test_a_repository_key_with_another_fingerprint_is_refused_then_the_pinned_one_converges(rig: Rig) -> None:
    """The NVIDIA repository key is pinned by fingerprint (nvidia_repo_key_fingerprints; the rack's inventory pins
    the stand-in repo's key): pinned to another key, the run refuses the served key naming the variable and removes
    the node's copy (apt trusts it no more); with the inventory's pin the next run installs it again and converges."""
    keyring = "/etc/apt/keyrings/nvidia-cuda.gpg"
    if rig.h.ssh("node02", f"test -s {keyring}").returncode != 0:  # run on its own (-k): a fresh node converges
        p, data = rig.run("--limit", "node02")
        assert p.returncode == 0, p.stderr + json.dumps(data["failures"], indent=1)
    before = rig.ssh("node02", f"sha256sum {keyring}")
    wrong = json.dumps({"nvidia_repo_key_fingerprints": ["EB693B3035CD5710E231E123A4B469963BF863CC"]})  # NVIDIA's
    p, data = rig.run("--limit", "node02", "-e", wrong)
    assert p.returncode == 1, p.stdout + p.stderr
    msgs = json.dumps(data["failures"])
    assert "nvidia_repo_key_fingerprints" in msgs and "refusing the repository key" in msgs, msgs
    assert "was removed" in msgs and rig.h.ssh("node02", f"test -e {keyring}").returncode != 0
    p, data = rig.run("--limit", "node02")
    assert p.returncode == 0, p.stderr + json.dumps(data["failures"], indent=1)
    assert rig.ssh("node02", f"sha256sum {keyring}") == before
    p, _ = rig.drift("--report", "json", "--limit", "node02")
    assert p.returncode == 0 and json.loads(p.stdout)["hosts"]["node02"]["drift"] == [], p.stdout


def test_a_host_left_on_its_old_module_is_rebooted_into_the_installed_one(rig: Rig) -> None:
    """A run killed between the driver install and its reboot leaves the new package installed and the old kernel
    module loaded. With `provision_allow_reboot` (the rack's inventory) the next run reboots that host into the
    installed module, and the run after it does not reboot again."""
    from provisioner_testbed import hosts as hostmod
    from provisioner_testbed import rack
    from provisioner_testbed.onboot import LOADED

    loaded = "cat /var/lib/hwsim/sys/module/nvidia/version"
    boot_id = "cat /proc/sys/kernel/random/boot_id"
    installed = rig.ssh("node02", loaded).strip()
    st = rack.load(rig.h.name)
    hp = hostmod.paths(st, rack.get_host(st, "node02"))
    (hp.root / LOADED).write_text("580.82.07\n")  # the host booted an older module; the package came after
    rack.clear(rig.h.name, "node02")
    assert rig.ssh("node02", loaded).strip() == "580.82.07"
    boot = rig.ssh("node02", boot_id).strip()

    p, data = rig.run("--limit", "node02")
    assert p.returncode == 0, p.stderr + json.dumps(data["failures"], indent=1)
    assert rig.ssh("node02", loaded).strip() == installed
    rebooted = rig.ssh("node02", boot_id).strip()
    assert rebooted not in ("", boot), "node02 was not rebooted into its installed module"

    p, data = rig.run("--limit", "node02")
    assert p.returncode == 0, p.stderr + json.dumps(data["failures"], indent=1)
    assert rig.ssh("node02", boot_id).strip() == rebooted, "a host on its installed module was rebooted again"


def test_unreachable_host_reported_while_others_complete_then_rerun_converges(rig: Rig) -> None:
    from provisioner_testbed import rack

    rack.stop_host(rig.h.name, "node04")
    p, run_dir = rig.drift("--report", "junit")
    assert p.returncode == 1, p.stdout + p.stderr
    d = json.loads((run_dir / "drift.json").read_text())
    assert d["summary"]["unreachable_hosts"] == ["node04"]
    assert {n: h["state"] for n, h in d["hosts"].items()} == {
        "node01": "clean", "node02": "clean", "node03": "clean", "node04": "unreachable"}
    root = ET.fromstring(p.stdout)
    assert root.get("errors") == "1" and root.get("failures") == "0"
    assert 'provisioner_host_unreachable{host="node04"} 1' in (run_dir / "drift.prom").read_text()

    # preflight refuses a run with an unreachable host unless told to skip it
    refused = rig.cli("run", rig.inv)
    assert refused.returncode == 1 and "node04" in _norm(refused.stderr) and "preflight" in refused.stderr

    p, data = rig.run("--skip-preflight")
    assert p.returncode == 1
    assert data["unreachable_hosts"] == ["node04"] and data["failed_hosts"] == []
    assert all(data["hosts"][h]["state"] == "ok" for h in ("node01", "node02", "node03")), data["hosts"]
    assert Path(data["retry_file"]).read_text().split() == ["node04"]

    assert rack.start_host_cmd(rig.h.name, "node04")
    p, again = rig.run("--limit", f"@{data['retry_file']}")
    assert p.returncode == 0, p.stderr + json.dumps(again["failures"], indent=1)
    assert list(again["hosts"]) == ["node04"] and again["hosts"]["node04"]["state"] in ("ok", "changed")
