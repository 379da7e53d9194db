"""One simulated host: its overlayfs root, identity (hostname, machine-id, SSH host key, authorized key, static
address), hardware directory, and the `systemd-nspawn -b` process that boots it.

The host's disk is `upper/` over the shared read-only base (and, with `--with-vllm`, the vLLM golden layer); a
host that is stopped and started again keeps its disk, like a rebooted server.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from provisioner_testbed.state import HostState, Proc, RackState, children, terminate

HWSIM_MOUNT = "/var/lib/hwsim"


def controller_python() -> Path | None:
    """The controller's own Python installation when it is self-contained (pyenv, a python.org build; not /usr):
    bound read-only into every host at the same path, so a host can stand in for a site's execution node, which needs
    Python 3.12+ (the rack's Debian 12 has 3.11; `execution_node_python` points at it). None for a system Python."""
    base = Path(sys.base_prefix).resolve()
    if base in (Path("/usr"), Path("/")) or not (base / "bin").is_dir():
        return None
    return base
IDENTITY_MARK = "var/lib/provisioner-testbed/identity"

#: Inside each host: lays the simulated HCAs' sysfs-shaped tree (`/var/lib/hwsim/sys/class/*`) over `/sys/class`
#: with a read-only overlayfs, so the real `ibstat`/libibumad see them. nspawn cannot do this itself: it mounts
#: sysfs's /class over any bind below /sys/class (checked with systemd 252). Re-run it (restart the unit) after the
#: tree gained or lost a directory; file contents written in place are seen live.
HWSIM_SYSFS_SCRIPT = """#!/bin/sh
# provisioner testbed: expose the simulated hardware's sysfs-shaped files under /sys/class (generated)
set -e
src=/var/lib/hwsim/sys/class
# the top-most mount on /sys/class (findmnt lists the whole stack: sysfs below, our overlay above)
top() { awk '$5 == "/sys/class" { t = $0 } END { print t }' /proc/self/mountinfo; }
while top | grep -q ' - overlay hwsim-sysfs '; do umount /sys/class; done
[ "$1" = stop ] && exit 0
[ -d "$src" ] || exit 0
mount -t overlay hwsim-sysfs -o ro,lowerdir="$src":/sys/class /sys/class
"""

HWSIM_SYSFS_UNIT = """[Unit]
Description=Simulated hardware: sysfs-shaped HCA files under /sys/class (provisioner testbed)
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/hwsim-sysfs
ExecStop=/usr/local/sbin/hwsim-sysfs stop

[Install]
WantedBy=sysinit.target
"""


@dataclass(frozen=True)
class HostPaths:
    root: Path  # hosts/HOST

    @property
    def upper(self) -> Path:
        return self.root / "upper"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def merged(self) -> Path:
        return self.root / "root"

    @property
    def hwsim(self) -> Path:
        return self.root / "hwsim"

    @property
    def spec(self) -> Path:
        """The host's hardware spec as given (before resolve): `fault`/`clear` rewrite it."""
        return self.root / "spec.json"

    @property
    def log(self) -> Path:
        return self.root / "boot.log"


def paths(rack: RackState, host: HostState) -> HostPaths:
    return HostPaths(rack.dir / "hosts" / host.name)


def mounted_under(prefix: Path) -> list[str]:
    """Mount points at or below `prefix`, deepest first (from /proc/self/mountinfo)."""
    out = []
    p = str(prefix).rstrip("/")
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            mp = fields[4].encode().decode("unicode_escape")
            if mp == p or mp.startswith(p + "/"):
                out.append(mp)
    return sorted(set(out), key=lambda m: m.count("/"), reverse=True)


def is_mounted(path: Path) -> bool:
    return str(path) in mounted_under(path)


def umount_all(prefix: Path) -> list[str]:
    """Unmount everything at or below `prefix` (lazily when busy); return what is still mounted."""
    for mp in mounted_under(prefix):
        if subprocess.run(["umount", mp], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mp], capture_output=True)
    return mounted_under(prefix)


def mount_root(hp: HostPaths, lowers: list[str]) -> None:
    """Mount the host's overlayfs (idempotent)."""
    for d in (hp.upper, hp.work, hp.merged, hp.hwsim):
        d.mkdir(parents=True, exist_ok=True)
    os.chmod(hp.upper, 0o755)
    if is_mounted(hp.merged):
        return
    opts = f"lowerdir={':'.join(lowers)},upperdir={hp.upper},workdir={hp.work}"
    proc = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(hp.merged)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"overlayfs mount for {hp.root.name} failed: {proc.stderr.strip()}")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_text(text)
    os.chmod(path, mode)


def host_key(rack: RackState, host: HostState) -> tuple[str, str]:
    """(private, public) ed25519 host key, generated once per host and kept with the rack (survives `reset`)."""
    kd = rack.dir / "ssh" / "hostkeys"
    kd.mkdir(parents=True, exist_ok=True)
    key = kd / f"{host.name}_ed25519"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host.name}", "-f", str(key)],
                       check=True, capture_output=True)
    return key.read_text(), Path(f"{key}.pub").read_text()


def write_identity(rack: RackState, host: HostState, authorized_key: str, *, proxy_url: str) -> None:
    """First boot only: everything that makes this host itself (written through the overlay into upper/)."""
    m = paths(rack, host).merged
    if (m / IDENTITY_MARK).exists():
        return
    priv, pub = host_key(rack, host)
    _write(m / "etc/hostname", host.name + "\n")
    others = "".join(f"{h.address}\t{h.name}\n" for h in rack.hosts)
    _write(m / "etc/hosts", f"127.0.0.1\tlocalhost\n127.0.1.1\t{host.name}\n::1\tlocalhost ip6-localhost\n"
                            f"{rack.gateway}\tcontroller\n{others}")
    _write(m / "etc/machine-id", secrets.token_hex(16) + "\n", 0o444)
    _write(m / "etc/resolv.conf", "# provisioner testbed: no DNS (hosts reach Debian's mirror through the proxy)\n")
    _write(m / "etc/ssh/ssh_host_ed25519_key", priv, 0o600)
    _write(m / "etc/ssh/ssh_host_ed25519_key.pub", pub)
    _write(m / "etc/ssh/sshd_config.d/20-testbed-hostkey.conf", "HostKey /etc/ssh/ssh_host_ed25519_key\n")
    (m / "root/.ssh").mkdir(parents=True, exist_ok=True)
    os.chmod(m / "root/.ssh", 0o700)
    _write(m / "root/.ssh/authorized_keys", authorized_key.strip() + "\n", 0o600)
    _write(m / "etc/systemd/network/10-host0.network",
           "[Match]\nName=host0\n\n[Network]\n"
           f"Address={host.address}/{rack.prefix}\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n")
    # apt reaches Debian's mirror through the rack's proxy; the controller itself (stand-in repo) directly.
    _write(m / "etc/apt/apt.conf.d/80testbed-proxy",
           f'Acquire::http::Proxy "{proxy_url}";\nAcquire::http::Proxy::{rack.gateway} "DIRECT";\n')
    _write(m / "usr/local/sbin/hwsim-sysfs", HWSIM_SYSFS_SCRIPT, 0o755)
    _write(m / "etc/systemd/system/hwsim-sysfs.service", HWSIM_SYSFS_UNIT)
    wants = m / "etc/systemd/system/sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "hwsim-sysfs.service"
    if not link.is_symlink():
        link.symlink_to("/etc/systemd/system/hwsim-sysfs.service")
    _write(m / IDENTITY_MARK, f"{host.name} {host.address} {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")


#: Supervises one host's nspawn like systemd-nspawn@.service does: a reboot inside the host makes nspawn exit
#: with 133, and the host boots again (same disk); SIGTERM powers it off cleanly; any other exit ends the loop.
#: First it moves itself into the host's own cgroups ($PV_CGROUPS, see `host_cgroups`); before each boot it runs
#: $PV_ONBOOT (`onboot`: the kernel module the boot loads is the one installed).
SUPERVISOR = """\
for cg in $PV_CGROUPS; do echo $$ > "$cg/cgroup.procs" || exit 97; done
trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 0' TERM INT
while :; do
  [ -z "$PV_ONBOOT" ] || timeout 60 $PV_ONBOOT || echo "provisioner-testbed: on-boot hook failed" >&2
  "$@" &
  child=$!
  wait "$child"
  rc=$?
  [ "$rc" -eq 133 ] || exit "$rc"
  echo "provisioner-testbed: $(date -u +%FT%TZ) host rebooted" >&2
done
"""


#: Parent of every simulated host's own cgroup, below the controller's cgroup in each hierarchy systemd uses.
CGROUP_PARENT = "provisioner-testbed"


def _systemd_hierarchies() -> list[Path]:
    """Mount points of the cgroup hierarchies systemd manages: the named `systemd` one (v1/hybrid) and cgroup2,
    each joined with this process's own cgroup in it (from /proc/self/cgroup)."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, ctrl, path = line.split(":", 2)
        own["name=systemd" if ctrl == "name=systemd" else ("" if hid == "0" else ctrl)] = path
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype, _src, opts = (right.split() + ["", "", ""])[:3]
        mnt = Path(left.split()[4])
        if fstype == "cgroup" and "name=systemd" in opts.split(",") and "name=systemd" in own:
            out.append(mnt / own["name=systemd"].lstrip("/"))
        elif fstype == "cgroup2" and "" in own:
            out.append(mnt / own[""].lstrip("/"))
    return out


def host_cgroups(host: HostState) -> list[Path]:
    """Create (if missing) and return the host's own cgroup in each systemd hierarchy.

    nspawn with `--keep-unit --register=no` runs the container in the caller's cgroup. Without a cgroup of its own
    per host, every host's systemd manages the same subtree (`payload/system.slice/...`): one host stopping or
    restarting a unit removes or kills the cgroup another host's same-named unit is using (219/CGROUP, EIO on kill).
    A real node owns its whole tree; so does each simulated host with this."""
    out = []
    for base in _systemd_hierarchies():
        cg = base / CGROUP_PARENT / host.machine
        cg.mkdir(parents=True, exist_ok=True)
        out.append(cg)
    return out


def remove_cgroups(host: HostState) -> None:
    """Remove the host's cgroups (deepest first; a cgroup with a live process in it stays)."""
    for base in _systemd_hierarchies():
        top = base / CGROUP_PARENT / host.machine
        if not top.is_dir():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            try:
                d.rmdir()
            except OSError:
                pass
        try:
            top.rmdir()
        except OSError:
            pass


def boot(rack: RackState, host: HostState) -> Proc:
    """Start the host (`systemd-nspawn -b` under a small reboot-aware supervisor) as our own detached process in
    its own session; return the supervisor."""
    hp = paths(rack, host)
    nspawn = [
        "systemd-nspawn",
        "--boot",
        f"--directory={hp.merged}",
        f"--machine={host.machine}",
        f"--hostname={host.name}",
        "--register=no",
        "--keep-unit",
        f"--network-bridge={rack.bridge}",
        f"--bind-ro={hp.hwsim}:{HWSIM_MOUNT}",
        *([f"--bind-ro={py}"] if (py := controller_python()) else []),
        "--resolv-conf=off",
        "--link-journal=no",
        "--timezone=off",
        "--console=read-only",
    ]
    cmd = ["/bin/sh", "-c", SUPERVISOR, f"pvhost-{host.machine}", *nspawn]
    env = {**os.environ, "PV_CGROUPS": " ".join(str(c) for c in host_cgroups(host)),
           "PV_ONBOOT": f"{sys.executable} -m provisioner_testbed.onboot {hp.root}"}
    with open(hp.log, "ab") as log:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env)
    proc = Proc.of(p.pid)
    if proc is None:
        raise RuntimeError(f"{host.name}: systemd-nspawn exited at once (see {hp.log})")
    return proc


def stop(host: HostState, grace: float = 10.0) -> None:
    """Power the host off (SIGTERM: the supervisor hands it to nspawn = clean shutdown), kill after `grace` s."""
    p = host.proc
    if p is None or not p.alive():
        remove_cgroups(host)  # a crashed host leaves its (empty) tree
        return
    nspawns = [q for q in (Proc.of(c) for c in children(p.pid)) if q is not None]
    inits = [q for n in nspawns for q in (Proc.of(c) for c in children(n.pid)) if q is not None]
    terminate([p], grace)
    for q in nspawns:
        if q.alive():
            terminate([q], 2.0)
    # If nspawn had to be killed, its container init may survive it: end that process namespace too.
    for q in inits:
        if q.alive():
            terminate([q], 2.0)
    remove_cgroups(host)


def init_pid(host: HostState) -> int | None:
    """PID (in our namespace) of the host's init (systemd inside the container): the process `nsenter -t` needs to
    run a command inside the running host without SSH. None when the host is not running."""
    p = host.proc
    if p is None or not p.alive():
        return None
    nspawns = [q for q in (Proc.of(c) for c in children(p.pid)) if q is not None]
    inits = [q for n in nspawns for q in (Proc.of(c) for c in children(n.pid)) if q is not None and q.alive()]
    return inits[0].pid if inits else None


def kill(host: HostState) -> None:
    """Pull the plug (for `down`: the disk is thrown away, so no clean shutdown is needed): SIGKILL the
    container's init, which ends its whole pid namespace at once; nspawn then exits and removes its veth."""
    p = host.proc
    if p is None or not p.alive():
        remove_cgroups(host)  # a crashed host leaves its (empty) tree
        return
    nspawns = [q for q in (Proc.of(c) for c in children(p.pid)) if q is not None]
    inits = [q for n in nspawns for q in (Proc.of(c) for c in children(n.pid)) if q is not None]
    for q in inits:
        q.signal(signal.SIGKILL)
    terminate([*nspawns, p], 5.0)
    remove_cgroups(host)


def ssh_banner(address: str, timeout: float = 1.0) -> bool:
    """True when sshd answers on port 22 with its SSH banner."""
    try:
        with socket.create_connection((address, 22), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def wait_ssh(addresses: list[str], timeout: float) -> list[str]:
    """Wait until every address answers with an SSH banner; return those that did not in time."""
    deadline = time.monotonic() + timeout
    left = list(addresses)
    while left and time.monotonic() < deadline:
        left = [a for a in left if not ssh_banner(a, 0.5)]
        if left:
            time.sleep(0.2)
    return left


def ssh_argv(rack: RackState, address: str, *command: str) -> list[str]:
    """An `ssh` command with the rack's key and known_hosts, host key checking ON."""
    sshd = rack.dir / "ssh"
    return ["ssh", "-i", str(sshd / "id_ed25519"), "-o", f"UserKnownHostsFile={sshd / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", f"root@{address}", *command]


def remove_dir(hp: HostPaths) -> None:
    umount_all(hp.root)
    shutil.rmtree(hp.root, ignore_errors=True)
