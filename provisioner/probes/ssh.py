"""Run one command on many hosts over SSH (paramiko): bounded concurrency, a deadline per host, host keys checked.

One connection and ONE exec per host: callers batch everything they want to know into a single shell snippet
(`provisioner.probes.preflight.PROBE_SCRIPT`), so a probe costs one round of SSH handshakes, not one per fact.

Host keys: the user's ~/.ssh/known_hosts, /etc/ssh/ssh_known_hosts and every `UserKnownHostsFile` named in the
inventory's `ansible_ssh_common_args` are loaded (parsed once per `run_many`, shared read-only by its connections);
an unknown or changed key is refused (paramiko RejectPolicy), as Ansible does with host key checking on. Only an
explicit `-o StrictHostKeyChecking=no` in the inventory turns that off (the key is then accepted for this connection
and never saved), mirroring what ssh would do.

Start-up: paramiko is imported on first use and without `invoke` (`_import_paramiko`).
"""

from __future__ import annotations

import os
import select
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from provisioner.model import Host

DEFAULT_TIMEOUT = 30.0  # seconds per host: connect + auth + the command
DEFAULT_FORKS = 64  # concurrent connections (threads; the work is network wait, not CPU)


@dataclass(frozen=True)
class SshTarget:
    name: str  # inventory name (reports use it)
    address: str
    port: int = 22
    user: str | None = None
    key_files: tuple[str, ...] = ()
    known_hosts: tuple[str, ...] = ()
    strict_host_keys: bool = True
    connect_timeout: float | None = None
    via: SshTarget | None = None  # a jump host (an execution node): the connection is tunnelled through it


@dataclass
class ExecResult:
    host: str
    ok: bool  # connected and the command ran (whatever its exit status)
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # why the host is unreachable (auth, host key, timeout, refused)
    seconds: float = 0.0


@dataclass
class _SshOpts:
    known_hosts: list[str] = field(default_factory=list)
    identity: list[str] = field(default_factory=list)
    strict: bool = True
    port: int | None = None
    user: str | None = None
    connect_timeout: float | None = None


def as_root(script: str, user: str | None) -> str:
    """`script` as login `user` runs it as root: as it is for root, else through `sudo -n sh -c` (never a prompt)."""
    return script if (user or "root") == "root" else f"sudo -n sh -c {shlex.quote(script)}"


def parse_ssh_args(args: str | None) -> _SshOpts:
    """The parts of `ansible_ssh_common_args` (ssh command-line options) that matter for a paramiko connection:
    `-o UserKnownHostsFile=`, `-o IdentityFile=` / `-i`, `-o StrictHostKeyChecking=`, `-o ConnectTimeout=`,
    `-o Port=` / `-p`, `-o User=` / `-l`. Unknown options are ignored (ControlMaster etc. mean nothing here)."""
    o = _SshOpts()
    if not args:
        return o
    try:
        toks = shlex.split(str(args))
    except ValueError:
        return o
    i = 0
    while i < len(toks):
        t = toks[i]
        val: str | None = None
        if t in ("-o", "-i", "-p", "-l") and i + 1 < len(toks):
            val = toks[i + 1]
            i += 2
        elif t.startswith("-o") and len(t) > 2:
            t, val = "-o", t[2:]
            i += 1
        elif t.startswith("-i") and len(t) > 2:
            t, val = "-i", t[2:]
            i += 1
        else:
            i += 1
            continue
        if t == "-i":
            o.identity.append(os.path.expanduser(val))
        elif t == "-p" and val.isdigit():
            o.port = int(val)
        elif t == "-l":
            o.user = val
        elif t == "-o":
            k, _, v = val.partition("=")
            if not _:
                k, _, v = val.partition(" ")
            k, v = k.strip().lower(), v.strip()
            if k == "userknownhostsfile":
                o.known_hosts.extend(os.path.expanduser(x) for x in v.split() if x != "/dev/null")
                if v.strip() == "/dev/null":
                    o.strict = False
            elif k == "identityfile":
                o.identity.append(os.path.expanduser(v))
            elif k == "stricthostkeychecking":
                o.strict = v.lower() not in ("no", "off", "false", "accept-new")
            elif k == "connecttimeout" and v.isdigit():
                o.connect_timeout = float(v)
            elif k == "port" and v.isdigit():
                o.port = int(v)
            elif k == "user":
                o.user = v
    return o


def target_for(host: Host) -> SshTarget:
    """An SshTarget from an inventory host (ansible_host/port/user, ansible_ssh_common_args, private key file)."""
    opts = parse_ssh_args(host.get("ansible_ssh_common_args"))
    keys = list(opts.identity)
    pk = host.get("ansible_ssh_private_key_file") or host.get("ansible_private_key_file")
    if pk:
        keys.insert(0, os.path.expanduser(str(pk)))
    port = host.ssh_port if host.get("ansible_port") is not None else (opts.port or 22)
    return SshTarget(name=host.name, address=host.address, port=port, user=host.ssh_user or opts.user,
                     key_files=tuple(keys), known_hosts=tuple(opts.known_hosts), strict_host_keys=opts.strict,
                     connect_timeout=opts.connect_timeout)


def _default_user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:  # pragma: no cover - no passwd entry
        return "root"


def _import_paramiko() -> Any:
    """paramiko, without the `invoke` package: paramiko.config imports it (only for `Match exec` in ssh_config files,
    which these probes never read), and that import alone costs ~0.17 s of start-up when invoke is installed."""
    if "invoke" in sys.modules:
        import paramiko

        _quiet_paramiko()
        return paramiko
    sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` raises ImportError: paramiko copes
    try:
        import paramiko
    finally:
        del sys.modules["invoke"]
    _quiet_paramiko()
    return paramiko


def _quiet_paramiko() -> None:
    """paramiko's transport thread logs every failed handshake (a node rebooting: refused, reset, no banner) with a
    traceback, which Python's last-resort handler prints on stderr. The caller reports each failure as one line
    (ExecResult.error), so paramiko's own log goes nowhere."""
    import logging

    log = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())
    log.propagate = False


class KnownHosts:
    """known_hosts files parsed ONCE per fan-out and shared read-only by every connection (paramiko's SSHClient would
    re-read and re-parse every file for every host: O(hosts x lines) for a fleet)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parsed: dict[tuple[str, ...], Any] = {}

    def get(self, files: tuple[str, ...]) -> Any:
        paramiko = _import_paramiko()
        with self._lock:
            hk = self._parsed.get(files)
            if hk is None:
                hk = paramiko.HostKeys()
                _load_known_files(hk.load, files)
                self._parsed[files] = hk
            return hk


def _load_known_files(load: Callable[[str], Any], files: Iterable[str]) -> None:
    """`load(path)` for every known_hosts file of `files` that exists; unreadable or malformed files are skipped."""
    paramiko = _import_paramiko()
    for f in files:
        p = os.path.expanduser(f)
        if os.path.isfile(p):
            try:
                load(p)
            except (OSError, paramiko.SSHException):
                pass


def _known_files(t: SshTarget) -> tuple[str, ...]:
    return ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts", *t.known_hosts)


def _client(t: SshTarget, known: KnownHosts | None) -> Any:
    """An SSHClient whose read-only ("system") host keys are every known_hosts file of `t`; unknown keys refused."""
    paramiko = _import_paramiko()
    client = paramiko.SSHClient()
    shared = known.get(_known_files(t)) if known is not None else None
    if shared is not None and isinstance(getattr(client, "_system_host_keys", None), paramiko.HostKeys):
        client._system_host_keys = shared  # read only: SSHClient never writes system host keys
    else:  # another paramiko layout: load them the documented way (per connection)
        _load_known_files(client.load_system_host_keys, _known_files(t))
    client.set_missing_host_key_policy(paramiko.RejectPolicy() if t.strict_host_keys else paramiko.AutoAddPolicy())
    return client


def _collect(chan: Any, deadline: float, res: ExecResult) -> tuple[bytes, bytes]:
    """Read stdout and stderr until the command has exited and its streams are closed (or the deadline passes).
    Waits on the channel's file descriptor, which paramiko makes readable when either stream has data or reaches
    EOF, and on its status event for the exit status: no polling."""
    out, err = bytearray(), bytearray()
    fd = chan.fileno()

    def drain() -> None:
        while chan.recv_ready():
            out.extend(chan.recv(65536))
        while chan.recv_stderr_ready():
            err.extend(chan.recv_stderr(65536))

    while True:
        drain()
        eof = chan.eof_received or chan.closed
        if eof and chan.exit_status_ready():
            drain()
            res.rc = chan.recv_exit_status()
            res.ok = True
            return bytes(out), bytes(err)
        left = deadline - time.monotonic()
        if left <= 0:
            res.error = "timed out"
            chan.close()
            return bytes(out), bytes(err)
        if eof:  # streams done, exit status still on its way
            chan.status_event.wait(min(left, 1.0))
        else:
            select.select([fd], [], [], min(left, 1.0))


def _connect(client: Any, t: SshTarget, timeout: float, sock: Any = None) -> None:
    keys = [k for k in t.key_files if os.path.isfile(k)]
    ct = min(t.connect_timeout or timeout, timeout)
    client.connect(t.address, port=t.port, username=t.user or _default_user(),
                   key_filename=keys or None, look_for_keys=not keys, allow_agent=not keys,
                   timeout=ct, banner_timeout=ct, auth_timeout=ct, channel_timeout=ct, sock=sock)


class Jumps:
    """One connection per jump host (execution node), opened on first use and shared by the targets behind it
    (each target gets its own direct-tcpip channel); a jump host that cannot be reached fails its targets with why."""

    def __init__(self, known: KnownHosts, timeout: float) -> None:
        self._known, self._timeout = known, timeout
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}
        self._errors: dict[str, str] = {}

    def channel(self, t: SshTarget) -> Any:
        via = t.via
        assert via is not None
        with self._lock:
            if via.name not in self._clients and via.name not in self._errors:
                r = ExecResult(host=via.name, ok=False)
                client = None
                try:
                    client = _client(via, self._known)
                    _connect(client, via, self._timeout)
                    self._clients[via.name] = client
                except Exception as exc:  # noqa: BLE001 (reported for every target behind it)
                    r.error = _why(exc, via)
                    self._errors[via.name] = r.error or str(exc)
                    if client is not None:
                        client.close()
            if via.name in self._errors:
                raise _JumpError(f"execution node {via.name} not reachable: {self._errors[via.name]}")
            transport = self._clients[via.name].get_transport()
        return transport.open_channel("direct-tcpip", (t.address, t.port), ("127.0.0.1", 0),
                                      timeout=min(t.connect_timeout or self._timeout, self._timeout))

    def close(self) -> None:
        for c in self._clients.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass


class _JumpError(Exception):
    pass


def _why(exc: BaseException, t: SshTarget) -> str:
    """One line for a connection failure (never raised)."""
    paramiko = _import_paramiko()
    if isinstance(exc, _JumpError):
        return str(exc)
    if isinstance(exc, paramiko.BadHostKeyException):
        return f"host key for {exc.hostname} CHANGED (possible MITM): refused"
    if isinstance(exc, paramiko.AuthenticationException):
        return f"authentication failed as {t.user or _default_user()}: {exc}"
    if isinstance(exc, paramiko.SSHException):
        msg = str(exc)
        if "not found in known_hosts" in msg:
            return f"host key not in known_hosts ({', '.join(t.known_hosts) or '~/.ssh/known_hosts'}): refused"
        return f"ssh: {msg or type(exc).__name__}"
    if isinstance(exc, TimeoutError):
        return f"connect timed out after {t.connect_timeout or DEFAULT_TIMEOUT:g}s"
    if isinstance(exc, OSError):
        return f"cannot connect to {t.address}:{t.port}: {exc.strerror or exc}"
    return f"{type(exc).__name__}: {exc}"


def run_one(t: SshTarget, command: str, timeout: float = DEFAULT_TIMEOUT, *,
            known: KnownHosts | None = None, jumps: Jumps | None = None) -> ExecResult:
    """Connect (through `t.via` when set), run `command` once, collect stdout/stderr/exit status; every failure
    becomes `error`, never raised."""
    paramiko = _import_paramiko()

    t0 = time.monotonic()
    deadline = t0 + timeout
    res = ExecResult(host=t.name, ok=False)
    client = None
    own_jumps = None
    try:
        sock = None
        if t.via is not None:
            if jumps is None:
                jumps = own_jumps = Jumps(known or KnownHosts(), timeout)
            sock = jumps.channel(t)
        client = _client(t, known)
        _connect(client, t, timeout, sock)
        transport = client.get_transport()
        assert transport is not None
        chan = transport.open_session(timeout=max(1.0, deadline - time.monotonic()))
        chan.exec_command(command)
        out, err = _collect(chan, deadline, res)
        if res.error:
            res.error = f"timed out after {timeout:g}s (command still running)"
        res.stdout = out.decode("utf-8", "replace")
        res.stderr = err.decode("utf-8", "replace")
    except _JumpError as exc:
        res.error = str(exc)
    except TimeoutError:
        res.error = f"connect timed out after {min(t.connect_timeout or timeout, timeout):g}s"
    except paramiko.SSHException as exc:
        res.error = _why(exc, t)
    except Exception as exc:  # never let one host take the fan-out down
        res.error = _why(exc, t)
    finally:
        if client is not None:
            try:
                client.close()
            except Exception:
                pass
        if own_jumps is not None:
            own_jumps.close()
        res.seconds = round(time.monotonic() - t0, 3)
    return res


def workers(n_targets: int, forks: int) -> int:
    """Threads for a fan-out: the hosts' work is waited on, not computed, but each connection's key exchange and
    packet handling is Python under one GIL, so more threads than hosts (or than `forks`) only adds switching."""
    return max(1, min(forks, n_targets))


def run_many(targets: Iterable[SshTarget], command: str | Callable[[SshTarget], str], *,
             timeout: float = DEFAULT_TIMEOUT, forks: int = DEFAULT_FORKS,
             on_result: Callable[[ExecResult], None] | None = None) -> dict[str, ExecResult]:
    """Run `command` (or command(target)) on every target, at most `forks` at a time; results by host name."""
    targets = list(targets)
    out: dict[str, ExecResult] = {}
    lock = threading.Lock()
    known = KnownHosts()
    jumps = Jumps(known, timeout)

    def one(t: SshTarget) -> None:
        cmd = command(t) if callable(command) else command
        r = run_one(t, cmd, timeout=timeout, known=known, jumps=jumps)
        with lock:
            out[t.name] = r
            if on_result:
                on_result(r)

    if not targets:
        return out
    _import_paramiko()  # once, before the threads: module imports take the import lock anyway
    try:
        with ThreadPoolExecutor(max_workers=workers(len(targets), forks), thread_name_prefix="ssh") as pool:
            list(pool.map(one, targets))
    finally:
        jumps.close()
    return {t.name: out[t.name] for t in targets}
