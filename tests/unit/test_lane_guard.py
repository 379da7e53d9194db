"""The unit lane's guard (tests/unit/conftest.py) really refuses a process and a network connection."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
from conftest import UnitLaneViolation


def test_a_subprocess_is_refused() -> None:
    with pytest.raises(UnitLaneViolation, match="started a process: true"):
        subprocess.run(["true"], check=False)


def test_os_system_and_fork_are_refused() -> None:
    with pytest.raises(UnitLaneViolation, match="os.system"):
        os.system("true")
    with pytest.raises(UnitLaneViolation, match="os.fork"):
        os.fork()


def test_a_tcp_connection_is_refused_even_to_loopback() -> None:
    with socket.socket() as s, pytest.raises(UnitLaneViolation, match="connect"):
        s.connect(("127.0.0.1", 9))
