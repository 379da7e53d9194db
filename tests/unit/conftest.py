"""The unit lane's contract, enforced: a test here runs in-process. Starting a process (subprocess, fork, exec,
posix_spawn) or opening a network connection (anything but a Unix socket) fails the test, naming what it tried;
such a test belongs in tests/integration (real ansible-playbook, ansible-runner, wheels, lint) or a rack lane.

PROVISIONER_UNIT_GUARD=off lifts the guard (to list offenders while moving tests: the failures name them).
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

# ansible.utils.display runs `ldconfig -p` (ctypes.util.find_library) when first imported: import it before the guard
# (so does ansible.utils.encrypt, which the core filters import: the bundle tests template with Ansible's filters)
import ansible.inventory.manager  # noqa: F401
import ansible.plugins.filter.core  # noqa: F401
import ansible.utils.display  # noqa: F401
import pytest


class UnitLaneViolation(BaseException):
    """Raised where a unit test reaches outside its process; BaseException so no `except Exception` hides it."""


def _refuse(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        shown = " ".join(map(str, args[0])) if args and isinstance(args[0], list | tuple) else (args[:1] or "")
        raise UnitLaneViolation(f"unit tests run in-process: {what} {shown!s:.200} "
                                "(move the test to tests/integration)")
    return refuse


def _refuse_child(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
    shown = " ".join(map(str, args)) if isinstance(args, list | tuple) else str(args)
    raise UnitLaneViolation(f"unit tests run in-process: started a process: {shown:.200} "
                            "(move the test to tests/integration)")


def _connect_guard(real: Any) -> Any:
    def connect(self: socket.socket, address: Any) -> Any:
        if self.family == getattr(socket, "AF_UNIX", None):
            return real(self, address)
        raise UnitLaneViolation(f"unit tests open no network connection: connect {address!r} "
                                "(move the test to tests/integration)")
    return connect


def _guard() -> pytest.MonkeyPatch:
    mp = pytest.MonkeyPatch()
    mp.setattr(subprocess.Popen, "_execute_child", _refuse_child)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve", "execvp", "execvpe"):
        if hasattr(os, name):
            mp.setattr(os, name, _refuse(f"os.{name}"))
    mp.setattr(socket.socket, "connect", _connect_guard(socket.socket.connect))
    mp.setattr(socket.socket, "connect_ex", _connect_guard(socket.socket.connect_ex))
    return mp


# runtest hooks of a conftest apply to the items under its directory only: fixtures of any scope set up for a unit
# test are guarded too, and a test elsewhere in the same pytest process is not
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    return (yield from _guarded())


def _guarded() -> Iterator[None]:
    if os.environ.get("PROVISIONER_UNIT_GUARD") == "off":
        return (yield)
    mp = _guard()
    try:
        return (yield)
    finally:
        mp.undo()
