"""A node that is rebooting makes paramiko's transport thread fail its handshake (reset, no banner): the probes
report that as one line (ExecResult.error) and paramiko's own traceback never reaches stderr (it used to, through
Python's last-resort log handler, once per attempt while `provision remediate` waited for a reboot)."""

from __future__ import annotations

import logging
import socket
import threading

import pytest

from provisioner.probes.ssh import _import_paramiko


def test_a_failed_handshake_prints_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    """Neither on stderr nor to any handler of the root logger (Python's last-resort handler prints on stderr what
    reaches no handler). The root handler is the test's own: pytest's caplog also attaches itself to every logger
    that does not propagate, paramiko's among them once an earlier test imported it through the probes."""
    seen: list[logging.LogRecord] = []
    mine = logging.Handler(logging.DEBUG)
    mine.emit = seen.append  # type: ignore[method-assign]
    root = logging.getLogger()
    root.addHandler(mine)
    level = root.level
    root.setLevel(logging.DEBUG)
    paramiko = _import_paramiko()
    ours, theirs = socket.socketpair()  # a Unix socket pair: the "node" closes at once, as sshd does while stopping

    def node() -> None:
        theirs.recv(64)
        theirs.close()

    t = threading.Thread(target=node)
    t.start()
    transport = paramiko.Transport(ours)
    with pytest.raises(paramiko.SSHException):
        transport.start_client(timeout=5)
    transport.close()
    t.join()
    root.removeHandler(mine)
    root.setLevel(level)
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "Error reading SSH protocol banner" not in err, err
    assert out == ""
    assert not [r for r in seen if r.name.startswith("paramiko")], [r.getMessage() for r in seen]
