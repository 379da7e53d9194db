"""Host key checking of the paramiko probes, as ssh(1) does it: a real paramiko SSH server in this process (over a
socketpair; only the socket paramiko's client opens is swapped for one end of the pair) presents a host key, and
`run_one` with the inventory's ssh options connects or refuses. `UserKnownHostsFile=/dev/null` empties only the
user's files: the global files still count, and nothing but `StrictHostKeyChecking=no|accept-new` relaxes the check."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import paramiko
import pytest

from provisioner.model import Host
from provisioner.probes import ssh

ADDR = "198.18.250.7"  # never dialled: the socket is a socketpair


class _Server(paramiko.ServerInterface):
    def check_auth_publickey(self, username: str, key: Any) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: Any, command: bytes) -> bool:
        def reply() -> None:  # after paramiko has answered the exec request (it does once this returns)
            time.sleep(0.2)
            channel.sendall(b"ran " + command)
            channel.send_exit_status(0)
            channel.close()
        threading.Thread(target=reply, daemon=True).start()
        return True


class Rack:
    """What the fake network serves: every connection gets a server thread presenting `host_key`."""

    def __init__(self, host_key: Any) -> None:
        self.host_key = host_key
        self.connections = 0
        self.transports: list[Any] = []
        self.client_key = Path()

    def serve(self, sock: socket.socket) -> None:
        tr = paramiko.Transport(sock)
        tr.add_server_key(self.host_key)
        self.transports.append(tr)
        try:
            tr.start_server(server=_Server())
        except Exception:  # noqa: BLE001 (the client hung up: a refused key)
            pass


@pytest.fixture()
def rack(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # ~/.ssh/known_hosts: the test's own
    r = Rack(paramiko.ECDSAKey.generate())

    class _Pair(socket.socket):
        def connect(self, address: Any) -> None:  # already connected: the other end is the server
            return None

    def fake_socket(family: int = -1, type: int = -1, *a: Any, **kw: Any) -> socket.socket:
        a_end, b_end = socket.socketpair()
        r.connections += 1
        threading.Thread(target=r.serve, args=(b_end,), daemon=True).start()
        return _Pair(socket.AF_UNIX, socket.SOCK_STREAM, 0, a_end.detach())

    class _Net:
        def __getattr__(self, name: str) -> Any:
            return getattr(socket, name)

        @staticmethod
        def getaddrinfo(host: str, port: int, *a: Any, **kw: Any) -> list[Any]:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (host, port))]

        socket = staticmethod(fake_socket)

    monkeypatch.setattr(paramiko.client, "socket", _Net())
    client_key = tmp_path / "id_ecdsa"
    paramiko.ECDSAKey.generate().write_private_key_file(str(client_key))
    r.client_key = client_key
    yield r
    for tr in r.transports:
        tr.close()


def _host(rack: Rack, args: str, **more: Any) -> Host:
    return Host("node01", ADDR, ("gpu_nodes",), {"ansible_host": ADDR, "ansible_user": "root", **more,
                "ansible_ssh_private_key_file": str(rack.client_key), "ansible_ssh_common_args": args})


def _line(key: Any, name: str = ADDR) -> str:
    return f"{name} {key.get_name()} {key.get_base64()}\n"


def _run(rack: Rack, args: str) -> ssh.ExecResult:
    return ssh.run_one(ssh.target_for(_host(rack, args)), "true", timeout=10)


@pytest.mark.parametrize("order", ["strict first", "strict last"])
def test_dev_null_user_file_with_strict_yes_refuses_an_unknown_key(rack: Rack, tmp_path: Path, order: str) -> None:
    # before issue 43 a later UserKnownHostsFile=/dev/null turned checking off (AutoAddPolicy) and connected
    empty = tmp_path / "global"
    empty.write_text("")
    opts = [f"-o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile={empty}", "-o StrictHostKeyChecking=yes"]
    r = _run(rack, " ".join(opts[::-1] if order == "strict first" else opts))
    assert not r.ok and r.rc is None
    assert "not in known_hosts" in (r.error or "") and "refused" in (r.error or "")


def test_dev_null_user_file_still_reads_the_global_file(rack: Rack, tmp_path: Path) -> None:
    glob = tmp_path / "global"
    other = paramiko.ECDSAKey.generate()
    glob.write_text(_line(other))  # the global file knows ANOTHER key: changed
    r = _run(rack, f"-o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile={glob} -o StrictHostKeyChecking=yes")
    assert not r.ok and "CHANGED" in (r.error or "") and f"{glob}:1" in (r.error or "")
    glob.write_text(_line(rack.host_key))  # ... and the right key: connects, quietly
    r = _run(rack, f"-o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile={glob} -o StrictHostKeyChecking=yes")
    assert r.ok and r.rc == 0 and r.stdout == "ran true" and r.warnings == []


def test_no_option_is_ask_which_a_probe_cannot_ask_refused(rack: Rack, tmp_path: Path) -> None:
    glob = tmp_path / "global"
    glob.write_text("")
    r = _run(rack, f"-o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile={glob}")
    assert not r.ok and "StrictHostKeyChecking=ask" in (r.error or "")


def test_accept_new_takes_an_unknown_key_with_a_warning_and_saves_it(rack: Rack, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    user, glob = tmp_path / "user_kh", tmp_path / "global"
    glob.write_text("")
    args = f"-o UserKnownHostsFile={user} -o GlobalKnownHostsFile={glob} -o StrictHostKeyChecking=accept-new"
    r = _run(rack, args)
    assert r.ok and r.rc == 0
    err = capsys.readouterr().err
    assert "warning: node01: host key for 198.18.250.7 not in known_hosts" in err and "accept-new" in err
    assert r.warnings and user.read_text() == _line(rack.host_key)  # as ssh(1): added to the user's file
    r = _run(rack, args)  # known now: quiet
    assert r.ok and r.warnings == []
    rack.host_key = paramiko.ECDSAKey.generate()  # the host's key changes: refused
    r = _run(rack, args)
    assert not r.ok and "CHANGED" in (r.error or "")


def test_accept_new_refuses_a_changed_key(rack: Rack, tmp_path: Path) -> None:
    user = tmp_path / "user_kh"
    user.write_text(_line(paramiko.ECDSAKey.generate()))
    r = _run(rack, f"-o UserKnownHostsFile={user} -o StrictHostKeyChecking=accept-new")
    assert not r.ok and "CHANGED" in (r.error or "") and "refused" in (r.error or "")


def test_strict_no_lets_a_changed_key_through_with_a_warning(rack: Rack, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    user = tmp_path / "user_kh"
    user.write_text(_line(paramiko.ECDSAKey.generate()))
    r = _run(rack, f"-o UserKnownHostsFile={user} -o StrictHostKeyChecking=no")
    assert r.ok and r.rc == 0
    assert "warning: node01: host key for 198.18.250.7 CHANGED" in capsys.readouterr().err
    assert len(user.read_text().splitlines()) == 1  # a changed key is never written over the known one


def test_revoked_key_is_refused_even_with_strict_no(rack: Rack, tmp_path: Path) -> None:
    user = tmp_path / "user_kh"
    user.write_text(_line(rack.host_key) + "@revoked * " + _line(rack.host_key, name="").lstrip())
    r = _run(rack, f"-o UserKnownHostsFile={user} -o StrictHostKeyChecking=no")
    assert not r.ok and "REVOKED" in (r.error or "")


def test_first_value_of_an_option_wins_as_in_ssh(rack: Rack, tmp_path: Path) -> None:
    glob = tmp_path / "global"
    glob.write_text("")
    r = _run(rack, f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile={glob} "
                   "-o StrictHostKeyChecking=no")
    assert not r.ok and "refused" in (r.error or "")


def test_cert_authority_and_malformed_lines_do_not_hide_the_good_ones(rack: Rack, tmp_path: Path) -> None:
    # paramiko's own loader stops at a marker line (InvalidHostKey): every host of that file was unreachable
    user = tmp_path / "user_kh"
    user.write_text(f"@cert-authority *.example ssh-ed25519 AAAA\ngarbage line here\n{ADDR} ssh-ed25519 !!!\n"
                    + _line(rack.host_key))
    r = _run(rack, f"-o UserKnownHostsFile={user} -o StrictHostKeyChecking=yes")
    assert r.ok and r.rc == 0, r.error


def test_non_default_port_is_looked_up_as_bracketed_name(rack: Rack, tmp_path: Path) -> None:
    user = tmp_path / "user_kh"
    user.write_text(_line(rack.host_key))  # known for port 22 only
    h = _host(rack, f"-o UserKnownHostsFile={user} -o StrictHostKeyChecking=yes", ansible_port=2222)
    r = ssh.run_one(ssh.target_for(h), "true", timeout=10)
    assert not r.ok and f"[{ADDR}]:2222 not in known_hosts" in (r.error or "")
    user.write_text(_line(rack.host_key, name=f"[{ADDR}]:2222"))
    assert ssh.run_one(ssh.target_for(h), "true", timeout=10).ok


def test_verdict_table() -> None:
    from provisioner.probes.hostkeys import verdict

    assert [verdict(m, "unknown")[0] for m in ("yes", "ask", "accept-new", "no")] == [False, False, True, True]
    assert [verdict(m, "changed")[0] for m in ("yes", "ask", "accept-new", "no")] == [False, False, False, True]
    assert [verdict(m, "revoked")[0] for m in ("yes", "ask", "accept-new", "no")] == [False] * 4
    assert all(verdict(m, "ok") == (True, False) for m in ("yes", "ask", "accept-new", "no"))


def test_host_patterns() -> None:
    from provisioner.probes.hostkeys import host_matches

    assert host_matches("node01.rack", ["*.rack"]) and not host_matches("node01.rack", ["*.rack", "!node01.*"])
    assert host_matches("[10.0.0.1]:2222", ["[10.0.0.1]:2222"]) and not host_matches("10.0.0.1", ["[10.0.0.1]:22"])
    hashed = paramiko.HostKeys.hash_host("node07")
    assert host_matches("NODE07", [hashed]) and not host_matches("node08", [hashed])


def test_known_hosts_lookup_reads_plain_pattern_and_hashed_lines(tmp_path: Path) -> None:
    from provisioner.probes.hostkeys import KnownHosts

    a, b, c = (paramiko.ECDSAKey.generate() for _ in range(3))
    f = tmp_path / "kh"
    f.write_text(_line(a, "node01,10.0.0.1") + _line(b, "*.rack,!bad.rack") + _line(c, paramiko.HostKeys.hash_host("n9"))
                 + "@revoked * " + _line(c, "").lstrip())
    kh = KnownHosts()
    assert kh.lookup("10.0.0.1", a, [str(f)]).status == "ok"
    assert kh.lookup("NODE01", b, [str(f)]).status == "changed"
    assert kh.lookup("x.rack", b, [str(f)]).status == "ok" and kh.lookup("bad.rack", b, [str(f)]).status == "unknown"
    assert kh.lookup("n9", c, [str(f)]).status == "revoked"  # @revoked wins over the hashed line with that key
    assert kh.known_types("x.rack", [str(f)]) == [b.get_name()]
