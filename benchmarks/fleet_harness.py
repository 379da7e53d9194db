"""A fleet of real SSH endpoints on loopback, for fleet-scale benchmarks (issue 47).

    .venv/bin/python benchmarks/fleet_harness.py up DIR -n 1000 [--exec-nodes 2]   # prints the inventory path
    .venv/bin/python benchmarks/fleet_harness.py down DIR
    PV_HARNESS_EXEC_LOG=1 ...: the execution nodes' sshd logs at VERBOSE to DIR/ep/I/upper/sshd.log

Endpoint i has its own loopback address (127.77.i//250.i%250+1, port 22), its own ed25519 host key (its own line
in DIR/known_hosts, checked strictly), its own root (an overlayfs of the testbed's Debian 12 base root with a
private upper dir: its own /etc/provisioner/harness.json and /etc/nccl.conf, its own dpkg database copy-on-write),
and a real `python3` there that answers the tier-1 drift probe. One listener process binds every address and hands
each accepted connection to a fresh OpenSSH `sshd -i` (inetd mode, the sshd(8) way to serve from a super-server)
with that endpoint's host key and `ChrootDirectory` its root: key exchange, public-key authentication, the session
and the command are OpenSSH's. The listener and every mount live in a private mount namespace (`unshare --mount`),
so nothing is mounted on the machine and the mounts vanish with the process group; `down` (also on Ctrl-C or
SIGTERM of `bench`) kills the group and removes DIR.

What is not a rack host: no systemd inside (the endpoint's /etc/systemd/system is empty, so the probe's
`systemctl show` step does not run; on a rack host it runs on the node, not on the controller) and no /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PORT = 22
#: addresses: 127.77.0.1 .. (250 per third octet): loopback only
NET = (127, 77)


def address(i: int) -> str:
    return f"{NET[0]}.{NET[1]}.{i // 250}.{i % 250 + 1}"


def base_root() -> Path:
    sys.path.insert(0, str(ROOT))
    from provisioner_testbed import rootfs

    return rootfs.ensure_base()


SSHD_CONFIG = """\
# the fleet harness's sshd (inetd mode: one `sshd -i` per connection; HostKey and ChrootDirectory on its argv)
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile /etc/ssh/fleet_authorized_keys
AllowTcpForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTTY no
PrintMotd no
UseDNS no
LogLevel QUIET
"""


def _keys(n: int) -> tuple[list[bytes], list[str], bytes, str]:
    """(host private keys in OpenSSH format, their public lines, client private key, client public line)."""
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    def one() -> tuple[bytes, str]:
        k = Ed25519PrivateKey.generate()
        priv = k.private_bytes(s.Encoding.PEM, s.PrivateFormat.OpenSSH, s.NoEncryption())
        pub = k.public_key().public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH).decode()
        return priv, pub

    hosts = [one() for _ in range(n)]
    cpriv, cpub = one()
    return [h[0] for h in hosts], [h[1] for h in hosts], cpriv, cpub


def _private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def inventory(d: Path, n: int, exec_nodes: int = 0) -> Path:
    """The harness's inventory: every endpoint in gpu_nodes (the execution nodes, when asked for, in execution_nodes),
    host keys checked against DIR/known_hosts."""
    inv = d / "inventory"
    (inv / "group_vars").mkdir(parents=True, exist_ok=True)
    (inv / "group_vars" / "all.yml").write_text(
        "ansible_user: root\n"
        f"ansible_ssh_private_key_file: {d / 'client_key'}\n"
        f"ansible_ssh_common_args: -o UserKnownHostsFile={d / 'known_hosts'} -o StrictHostKeyChecking=yes\n"
        "provision_site: fleet-harness\n")
    (inv / "group_vars" / "gpu_nodes.yml").write_text(
        "gpu_model: H100-SXM5-80GB\ngpu_count: 8\nfabric: infiniband\n"
        "ib_hcas: [mlx5_0:1, mlx5_1:1, mlx5_2:1, mlx5_3:1, mlx5_4:1, mlx5_5:1, mlx5_6:1, mlx5_7:1]\n"
        "bootstrap_interface: ens10f0np0\n")
    lines = ["[gpu_nodes]"] + [f"f{i:05d} ansible_host={address(i)}" for i in range(exec_nodes, n)]
    if exec_nodes:
        lines += ["", "[execution_nodes]"] + [f"f{i:05d} ansible_host={address(i)}" for i in range(exec_nodes)]
    (inv / "hosts.ini").write_text("\n".join(lines) + "\n")
    return inv / "hosts.ini"


def up(d: Path, n: int, exec_nodes: int = 0, timeout: float = 120.0) -> dict:
    """Build DIR (keys, layer, endpoints' upper dirs, inventory) and start the listener; returns the harness info."""
    if d.exists():
        down(d)
    base = base_root()
    d.mkdir(parents=True, mode=0o755)
    privs, pubs, cpriv, cpub = _keys(n)
    _private(d / "client_key", cpriv)
    (d / "client_key.pub").write_text(cpub + "\n")
    (d / "known_hosts").write_text("".join(f"{address(i)} {pubs[i]}\n" for i in range(n)))
    # the shared layer over the base root: the sshd config, keys, mount points, an empty /etc/systemd/system
    layer = d / "layer"
    for sub in ("etc/ssh/fleet_keys", "etc/systemd/system", "run/sshd", "fleet"):
        (layer / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(layer / "etc/ssh/fleet_keys", 0o700)
    os.setxattr(layer / "etc/systemd/system", "trusted.overlay.opaque", b"y")
    (layer / "etc/ssh/fleet_sshd_config").write_text(SSHD_CONFIG)
    (layer / "etc/ssh/fleet_authorized_keys").write_text(cpub + "\n")
    for i in range(n):
        _private(layer / "etc/ssh/fleet_keys" / str(i), privs[i])
        (layer / "fleet" / str(i)).mkdir()
        up_ = d / "ep" / str(i) / "upper"
        (up_ / "etc/provisioner").mkdir(parents=True)
        os.chmod(up_, 0o755)
        (up_ / "etc/provisioner/harness.json").write_text(json.dumps({"index": i, "address": address(i)}) + "\n")
        (up_ / "etc/nccl.conf").write_text(f"# fleet harness endpoint {i}\nNCCL_IB_TIMEOUT=22\n")
        (d / "ep" / str(i) / "work").mkdir()
    for p in (d, layer, layer / "fleet", d / "ep"):
        os.chmod(p, 0o755)
    inv = inventory(d, n, exec_nodes)
    info = {"dir": str(d), "hosts": n, "exec_nodes": exec_nodes, "base": str(base), "inventory": str(inv),
            "port": PORT, "first": address(0), "last": address(n - 1)}
    (d / "harness.json").write_text(json.dumps(info, indent=1) + "\n")
    with open(d / "listener.log", "wb") as log:
        p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", sys.executable, __file__,
                              "serve", str(d)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    (d / "pid").write_text(f"{p.pid}\n")
    t0 = time.monotonic()
    while not (d / "ready").exists():
        if p.poll() is not None or time.monotonic() - t0 > timeout:
            tail = (d / "listener.log").read_text(errors="replace")[-2000:]
            down(d)
            raise RuntimeError(f"fleet harness did not start: {tail}")
        time.sleep(0.1)
    info["listener_pid"] = p.pid
    return info


def down(d: Path) -> None:
    """Kill the listener's process group (its mount namespace goes with it) and remove DIR."""
    pidf = d / "pid"
    if pidf.is_file():
        pid = int(pidf.read_text().split()[0])
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            for _ in range(50):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                time.sleep(0.1)
    shutil.rmtree(d, ignore_errors=True)


def listener_cpu(pid: int) -> float:
    """CPU seconds of the endpoints' side: the listener and every reaped sshd tree under it (cutime + cstime)."""
    clk = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in rest[11:15]) / clk


# ---- the listener (runs inside `unshare --mount`) ----

def _mount(src: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(src.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {target}: {os.strerror(e)}")


def serve(d: Path) -> None:
    import selectors
    import socket

    info = json.loads((d / "harness.json").read_text())
    n, base, exec_nodes = info["hosts"], info["base"], info["exec_nodes"]
    log_exec = os.environ.get("PV_HARNESS_EXEC_LOG") == "1"
    ms_rdonly, ms_bind = 1, 4096
    root = d / "mnt"
    root.mkdir(exist_ok=True)
    lower = f"{d / 'layer'}:{base}"
    _mount("overlay", str(root), "overlay", ms_rdonly, f"lowerdir={lower}")
    _mount("/dev", str(root / "dev"), None, ms_bind, None)
    for i in range(n):
        ep = d / "ep" / str(i)
        _mount("overlay", str(root / "fleet" / str(i)), "overlay", 0,
               f"lowerdir={lower},upperdir={ep / 'upper'},workdir={ep / 'work'}")
    socks = {}
    sel = selectors.DefaultSelector()
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((address(i), info["port"]))
        s.listen(128)
        s.setblocking(False)
        socks[s.fileno()] = (s, i)
        sel.register(s, selectors.EVENT_READ, i)
    (d / "ready").write_text("ready\n")  # every address bound
    os.chroot(root)
    os.chdir("/")
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    while not stop:
        for key, _ in sel.select(timeout=0.5):
            s, i = socks[key.fd]
            try:
                conn, _peer = s.accept()
            except (BlockingIOError, InterruptedError):
                continue
            conn.setblocking(True)
            argv = ["/usr/sbin/sshd", "-i", "-f", "/etc/ssh/fleet_sshd_config", "-h", f"/etc/ssh/fleet_keys/{i}",
                    "-o", f"ChrootDirectory=/fleet/{i}"]
            if i < exec_nodes:
                argv += ["-o", "AllowTcpForwarding=yes"]
                if log_exec:  # the execution node's sshd says why it ends a connection: DIR/ep/I/upper/sshd.log
                    argv += ["-E", f"/fleet/{i}/sshd.log", "-o", "LogLevel=VERBOSE"]
            try:
                subprocess.Popen(argv, stdin=conn.fileno(), stdout=conn.fileno(), stderr=subprocess.DEVNULL,
                                 close_fds=True)
            except OSError as exc:
                sys.stdout.write(f"spawn failed for endpoint {i}: {exc}\n")
            conn.close()
        while True:
            try:
                pid, _st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    u.add_argument("dir", type=Path)
    u.add_argument("-n", type=int, default=1000)
    u.add_argument("--exec-nodes", type=int, default=0)
    sub.add_parser("down").add_argument("dir", type=Path)
    sub.add_parser("serve").add_argument("dir", type=Path)
    a = ap.parse_args()
    if a.cmd == "up":
        print(json.dumps(up(a.dir.resolve(), a.n, a.exec_nodes), indent=1))
    elif a.cmd == "down":
        down(a.dir.resolve())
    else:
        serve(a.dir.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
