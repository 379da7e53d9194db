"""The simulated rack's lifecycle, on real hosts: up/down/reset/stop/start, SSH with host key checking, the
proxy, live hardware faults, crash cleanup, and the non-root message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner.inventory import load_fleet
from provisioner_testbed import network, rack
from provisioner_testbed.state import RackState, rack_dir

pytestmark = pytest.mark.testbed

PROVISION = str(Path(sys.executable).with_name("provision"))
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROVISION, "testbed", *args], capture_output=True, text=True, timeout=timeout)


def leftovers(name: str, index: int) -> list[str]:
    """Everything a rack could leave behind on this machine."""
    found = []
    d = str(rack_dir(name))
    mounts = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()]
    found += [f"mount {m}" for m in mounts if m.startswith(d)]
    if network.link_exists(network.bridge_name(index)):
        found.append(f"bridge {network.bridge_name(index)}")
    found += [f"veth {v}" for v in network.veths_of(index)]
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            if stat[stat.rfind(")") + 2] == "Z":
                continue
            cmd = (p / "cmdline").read_bytes().decode(errors="replace")
            status = (p / "status").read_text()
            nspid = next(ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:"))
            inside = len(nspid) > 1 and nspid[-1] == "1" and d + "/" in (p / "mountinfo").read_text()
        except (OSError, StopIteration):
            continue
        if d + "/" in cmd or inside:
            found.append(f"process {p.name} {cmd.replace(chr(0), ' ')[:80]}")
    if Path(d).exists():
        found.append(f"dir {d}")
    from provisioner_testbed.inventory_writer import inventory_dir

    if inventory_dir(name).exists():
        found.append(f"inventory {inventory_dir(name)}")
    return found


# --- the shared rack ----------------------------------------------------------------------------------------------


def test_second_up_is_a_noop(testbed: rack.Handle) -> None:
    before = RackState.load(testbed.name)
    t0 = time.monotonic()
    r = cli("up", "--name", testbed.name)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert "already up (no-op)" in r.stdout
    after = RackState.load(testbed.name)
    assert before and after
    assert [h.nspawn for h in before.hosts] == [h.nspawn for h in after.hosts]  # same processes: nothing rebooted
    assert took < 30  # mostly the CLI's Python start-up; the no-op itself is ~0.1 s


def test_hosts_answer_ssh_with_host_key_checking(testbed: rack.Handle) -> None:
    ids = {}
    for name in testbed.names:
        r = testbed.ssh(name, "hostname; cat /etc/machine-id; cat /etc/ssh/ssh_host_ed25519_key.pub; "
                              "systemctl is-system-running --wait")
        # is-system-running exits non-zero for "degraded": other suites on the shared rack may leave a failed unit
        hostname, machine_id, key, running = r.stdout.split("\n")[:4]
        assert hostname == name, r.stdout + r.stderr
        assert running in ("running", "degraded"), running  # booted: not starting/offline
        ids[name] = (machine_id, key.split()[1])
    assert len({m for m, _ in ids.values()}) == len(ids)  # unique machine-ids
    assert len({k for _, k in ids.values()}) == len(ids)  # unique host keys
    # With an empty known_hosts and checking ON the same login is refused: the inventory's known_hosts is what
    # makes it work.
    argv = testbed.ssh_argv(testbed.names[0], "true")
    argv[argv.index(f"UserKnownHostsFile={testbed.known_hosts}")] = "UserKnownHostsFile=/dev/null"
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == 255
    assert "Host key verification failed" in r.stderr
    # ... and the paramiko probes (preflight, health, status --nodes, drift's tier 1, onboard, remediate) judge the
    # same options the same way: /dev/null empties only the user's files, checking stays on (issue 43)
    from provisioner.model import Host
    from provisioner.probes import ssh as probe_ssh

    h = load_fleet(testbed.inventory).hosts[testbed.names[0]]
    assert probe_ssh.run_one(probe_ssh.target_for(h), "true", timeout=30).rc == 0
    args = h.vars["ansible_ssh_common_args"].replace(f"UserKnownHostsFile={testbed.known_hosts}",
                                                     "UserKnownHostsFile=/dev/null")
    blind = Host(h.name, h.address, h.groups, {**h.vars, "ansible_ssh_common_args": args})
    p = probe_ssh.run_one(probe_ssh.target_for(blind), "true", timeout=30)
    assert not p.ok and "not in known_hosts" in (p.error or "") and "refused" in (p.error or ""), p


def test_inventory_follows_the_contract(testbed: rack.Handle) -> None:
    fleet = load_fleet(testbed.inventory)
    assert list(fleet.hosts) == testbed.names
    for h in fleet.hosts.values():
        assert h.is_gpu_node
        assert (h.gpu_model, h.gpu_count, h.fabric, h.bootstrap_interface) == ("H100-SXM5-80GB", 8, "infiniband",
                                                                             "host0")
        assert h.ib_hcas == tuple(f"mlx5_{i}" for i in range(8))
        assert h.address == testbed.hosts[h.name]
        assert "StrictHostKeyChecking=yes" in h.vars["ansible_ssh_common_args"]
    # a plain rack cannot serve vLLM: `testbed up` declares no cluster (a plain run/drift of it is clean); the
    # cluster groups a rack test asks for (rack.ensure(clusters=True)): tests/unit/test_testbed_inventory.py
    assert fleet.clusters == {}
    anyhost = fleet.hosts[testbed.names[0]]
    assert anyhost.vars["apt_proxy"] == testbed.proxy_url
    # the repo over HTTPS, its certificate signed by the rack's CA (site_ca_certificates), its key pinned: the rack's
    # own inventory validates with no warning (SUP004 would flag a plain-HTTP repo)
    assert testbed.repo_tls_url.startswith("https://") and anyhost.vars["nvidia_repo_url"] == testbed.repo_tls_url
    v = subprocess.run([str(Path(sys.executable).with_name("provision")), "validate", str(testbed.inventory)],
                       capture_output=True, text=True, timeout=300)
    assert v.returncode == 0 and "(0 error(s), 0 warning(s))" in v.stdout + v.stderr, v.stdout + v.stderr
    # Ansible itself, through the generated inventory (real OpenSSH, host key checking on).
    env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True"}
    r = subprocess.run([str(Path(sys.executable).with_name("ansible")), "-i", str(testbed.inventory), "all",
                        "-m", "ping", "-o"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(testbed.names)


def test_hosts_reach_debian_only_through_the_proxy(testbed: rack.Handle) -> None:
    host = testbed.names[-1]
    r = testbed.ssh(host, "ip -4 route; ip -o -4 addr show dev host0")
    assert r.returncode == 0, r.stderr
    assert "default" not in r.stdout  # no route out: the proxy is the only way
    assert f"{testbed.hosts[host]}/24" in r.stdout
    r = testbed.ssh(host, "apt-get update -q -o Acquire::Retries=2 2>&1 | tail -20", timeout=300)
    assert r.returncode == 0 and "deb.debian.org" in r.stdout and "Err:" not in r.stdout, r.stdout
    # The proxy only forwards to Debian's archive (a `.invalid` name can never resolve anywhere either).
    probe = (
        "import urllib.request as u\n"
        f"o=u.build_opener(u.ProxyHandler({{'http':'{testbed.proxy_url}'}}))\n"
        "try:\n o.open('http://blocked.invalid/', timeout=10); print('open')\n"
        "except Exception as e: print(getattr(e,'code',e))\n"
    )
    r = testbed.ssh(host, f"python3 -c \"{probe}\"")
    assert r.stdout.strip() == "403", r.stdout + r.stderr


def test_hardware_dir_is_read_only_and_faults_are_live(testbed: rack.Handle) -> None:
    host = testbed.names[-1]  # the spare node (in no cluster)
    spec = json.loads(testbed.ssh(host, "cat /var/lib/hwsim/spec.json").stdout)
    assert spec["node"] == host and len(spec["gpus"]) == 8
    r = testbed.ssh(host, "touch /var/lib/hwsim/x")
    assert r.returncode != 0 and "Read-only" in r.stderr
    try:
        r = cli("fault", host, "hca_down=mlx5_3", "xid=2:79", "--name", testbed.name)
        assert r.returncode == 0, r.stderr
        spec = json.loads(testbed.ssh(host, "cat /var/lib/hwsim/spec.json").stdout)
        port = next(h for h in spec["hcas"] if h["name"] == "mlx5_3")["ports"][0]
        assert port["state"] == "DOWN"
        assert [x["code"] for x in spec["xids"]] == [79]
        sysfs = testbed.ssh(host, "cat /sys/class/infiniband/mlx5_3/ports/1/state 2>/dev/null || echo none").stdout
        assert sysfs.strip() in ("1: DOWN", "none")  # sysfs tree: only once the simulator writes one
        status = cli("status", "--name", testbed.name, "--json")
        row = next(x for x in json.loads(status.stdout) if x["name"] == host)
        assert row["faults"]["hca_down"] == ["mlx5_3"] and row["hcas"] == 7
        # Other hosts are untouched.
        other = json.loads(testbed.ssh(testbed.names[0], "cat /var/lib/hwsim/spec.json").stdout)
        assert other["xids"] == []
    finally:
        r = cli("clear", host, "--name", testbed.name)
    assert r.returncode == 0, r.stderr
    spec = json.loads(testbed.ssh(host, "cat /var/lib/hwsim/spec.json").stdout)
    assert spec["xids"] == [] and all(h["ports"][0]["state"] == "ACTIVE" for h in spec["hcas"])


def test_bad_fault_and_unknown_host_are_usage_errors(testbed: rack.Handle) -> None:
    r = cli("fault", testbed.names[0], "melted_gpu", "--name", testbed.name)
    assert r.returncode == 2 and "unknown fault 'melted_gpu'" in r.stderr and "Traceback" not in r.stderr
    r = cli("fault", "node99", "xid=79", "--name", testbed.name)
    assert r.returncode == 2 and "no host 'node99'" in r.stderr
    r = cli("fault", testbed.names[0], "hca_down=mlx5_42", "--name", testbed.name)
    assert r.returncode == 2 and "mlx5_42" in r.stderr and r.stderr.count("error:") == 1


def test_stopped_host_is_unreachable_and_up_restarts_it_with_its_disk(testbed: rack.Handle) -> None:
    host = testbed.names[-1]
    assert testbed.ssh(host, "echo kept > /root/marker").returncode == 0
    r = cli("stop", host, "--name", testbed.name)
    assert r.returncode == 0, r.stderr
    assert testbed.ssh(host, "true", timeout=30).returncode == 255
    row = next(x for x in json.loads(cli("status", "--name", testbed.name, "--json").stdout) if x["name"] == host)
    assert row["running"] is False and row["ssh"] is False
    r = cli("up", "--name", testbed.name)
    assert r.returncode == 0, r.stderr
    assert f"repaired: {host}" in r.stdout
    assert testbed.ssh(host, "cat /root/marker").stdout.strip() == "kept"


# --- racks of their own -------------------------------------------------------------------------------------------


@ROOT_ONLY
def test_up_reset_down_leaves_nothing() -> None:
    name = "tblife"
    cli("down", "--name", name)
    r = cli("up", "--name", name, "--nodes", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    st = RackState.load(name)
    assert st is not None and st.complete
    h = rack.handle(st)
    assert h.ssh("node02", "echo dirty > /root/dirt").returncode == 0
    # A reboot inside a host (Ansible's reboot module, a driver upgrade) brings it back with its disk.
    boot_id = h.ssh("node02", "cat /proc/sys/kernel/random/boot_id").stdout
    h.ssh("node02", "systemctl reboot", timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = h.ssh("node02", "cat /proc/sys/kernel/random/boot_id /root/dirt", timeout=10)
        if r.returncode == 0 and r.stdout.split()[0] != boot_id.strip():
            break
        time.sleep(0.5)
    assert r.returncode == 0, r.stderr
    new_boot, dirt = r.stdout.split()
    assert new_boot != boot_id.strip() and dirt == "dirty"
    r = cli("reset", "--name", name)
    assert r.returncode == 0, r.stderr
    r = h.ssh("node02", "ls /root/dirt; hostname")  # same host key: known_hosts still valid
    assert r.returncode != 0 or "No such file" in r.stderr
    assert h.ssh("node02", "hostname").stdout.strip() == "node02"
    assert leftovers(name, st.index) != []
    t0 = time.monotonic()
    r = cli("down", "--name", name)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 30
    assert leftovers(name, st.index) == []
    r = cli("down", "--name", name)
    assert r.returncode == 0 and "nothing to remove" in r.stdout


@ROOT_ONLY
def test_crash_mid_up_is_cleaned_by_down_and_by_the_next_up() -> None:
    name = "tbcrash"
    cli("down", "--name", name)
    # Kill `up` (SIGKILL) once the hosts are booting, and one host's nspawn too (its container is orphaned).
    p = subprocess.Popen([PROVISION, "testbed", "up", "--name", name, "--nodes", "2"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    st = None
    while time.monotonic() < deadline:
        st = RackState.load(name)
        if st and all(h.nspawn for h in st.hosts):
            break
        time.sleep(0.05)
    assert st is not None and all(h.nspawn for h in st.hosts), "up never booted the hosts"
    p.kill()
    p.wait()
    # SIGKILL the nspawn itself (the child of the host's supervisor): its container init is orphaned.
    from provisioner_testbed.state import children

    supervisor = st.hosts[0].nspawn[0]  # type: ignore[index]
    deadline = time.monotonic() + 10
    while not (kids := children(supervisor)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kids, "the host's supervisor never started nspawn"
    os.kill(kids[0], signal.SIGKILL)
    time.sleep(0.5)
    assert leftovers(name, st.index)
    # The next `up` notices the half-built rack, cleans it and builds a good one.
    r = cli("up", "--name", name, "--nodes", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "half-built" in r.stderr
    st2 = RackState.load(name)
    assert st2 and st2.complete
    assert rack.handle(st2).ssh("node01", "true").returncode == 0
    # Crash again (state file gone too), then `down` alone must find everything.
    for h in st2.hosts:
        os.kill(h.nspawn[0], signal.SIGKILL)  # type: ignore[index]
    os.kill(st2.proxy[0], signal.SIGKILL)  # type: ignore[index]
    (rack_dir(name) / "state.json").unlink()
    r = cli("down", "--name", name)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 10
    while leftovers(name, st2.index) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(name, st2.index) == []


@ROOT_ONLY
def test_spec_file_sets_per_host_hardware_and_bad_specs_are_usage_errors(tmp_path: Path) -> None:
    name = "tbspec"
    cli("down", "--name", name)
    spec = tmp_path / "rack.yaml"
    spec.write_text("defaults:\n  gpu_model: H200-SXM-141GB\nhosts:\n  node02:\n    gpu_count: 4\n"
                    "    faults:\n      hca_down: mlx5_1\n")
    try:
        r = cli("up", "--name", name, "--nodes", "2", "--spec", str(spec))
        assert r.returncode == 0, r.stdout + r.stderr
        st = RackState.load(name)
        assert st is not None
        fleet = load_fleet(st.inventory)
        assert fleet.hosts["node01"].gpu_model == "H200-SXM-141GB"
        assert (fleet.hosts["node01"].gpu_count, fleet.hosts["node02"].gpu_count) == (8, 4)
        hw = json.loads(rack.handle(st).ssh("node02", "cat /var/lib/hwsim/spec.json").stdout)
        assert len(hw["gpus"]) == 4
        assert next(h for h in hw["hcas"] if h["name"] == "mlx5_1")["ports"][0]["state"] == "DOWN"
        # Changing a running rack's shape is refused with a clear message.
        r = cli("up", "--name", name, "--nodes", "3")
        assert r.returncode == 2 and "already up with 2 nodes" in r.stderr
    finally:
        cli("down", "--name", name)
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults:\n  gpu_model: B300\n")
    r = cli("up", "--name", name, "--spec", str(bad))
    assert r.returncode == 2 and "B300" in r.stderr and "Traceback" not in r.stderr
    assert not rack_dir(name).exists()
    r = cli("up", "--name", name, "--spec", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "not found" in r.stderr


def test_non_root_gets_a_clear_message(tmp_path: Path) -> None:
    """The real CLI entry point, in a child process that dropped root. The interpreter's own library may be
    unreadable to `nobody` (a pyenv under /root), so the child first runs the CLI once as root (a usage error, no
    side effect) to load what it imports, then drops root and runs `provision testbed up`."""
    err_file = tmp_path / "stderr"
    pid = os.fork()
    if pid == 0:  # child
        code = 99
        try:
            from provisioner.cli import main

            sys.argv = ["provision", "testbed", "up", "--nodes", "0"]
            try:
                main()
            except SystemExit:
                pass
            fd = os.open(err_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            os.dup2(fd, 2)
            sys.stderr = open(2, "w", closefd=False)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            # (the CLI creates its stderr console inside main(), after this redirect)
            sys.argv = ["provision", "testbed", "up"]
            main()
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        except BaseException:
            import traceback

            os.write(2, traceback.format_exc().encode())
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    stderr = err_file.read_text()
    assert os.waitstatus_to_exitcode(status) == 2, stderr
    assert stderr.count("error:") == 1 and "needs root" in stderr and "Traceback" not in stderr, stderr
