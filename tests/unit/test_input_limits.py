"""Resource limits on inventory input (provisioner/inventory/limits.py): a FIFO/device among the inventory's files, a
YAML alias bomb in group_vars/host_vars or an -e @FILE, `/dev/null` or an inventory without hosts are refused in one
line naming the file (exit 2), fast, before ansible-core reads them."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cli_inproc import provision
from inventory_factory import write_inventory

from provisioner.commands.common import extra_vars
from provisioner.errors import UsageError
from provisioner.inventory.limits import MAX_ALIAS_VALUES, alias_problem
from provisioner.inventory import load_fleet


def bomb(levels: int, width: int = 10) -> str:
    """`levels` of aliases of aliases, each `width` times the one below: width**levels values once expanded."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _load_within(inv: Path, seconds: float = 30) -> BaseException | None:
    """load_fleet in a thread: the error it raised (None: it loaded); fails the test if it blocks (a FIFO would)."""
    out: dict[str, Any] = {}

    def go() -> None:
        try:
            load_fleet(inv)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["exc"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"load_fleet({inv}) still blocked after {seconds} s"
    return out.get("exc")


def test_dev_null_is_refused_with_exit_2() -> None:
    with pytest.raises(UsageError, match="the inventory is a character device"):
        load_fleet("/dev/null")
    p = provision("validate", "/dev/null")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: /dev/null: the inventory is a character device, not a file or directory of inventory sources"]


def test_an_inventory_without_hosts_is_refused(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, ini="[gpu_nodes]\n\n[gpu_nodes:vars]\ngpu_count=8\n", base=False)
    with pytest.raises(UsageError, match="defines no hosts") as ei:
        load_fleet(inv)
    assert str(inv) in str(ei.value)


@pytest.mark.parametrize("where", ["group_vars/all.yml", "group_vars/gpu_nodes/extra.yml", "host_vars/n1"])
def test_a_fifo_beside_the_inventory_is_refused_not_waited_on(tmp_path: Path, where: str) -> None:
    inv = write_inventory(tmp_path)
    fifo = tmp_path / where
    fifo.parent.mkdir(parents=True, exist_ok=True)
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    exc = _load_within(inv)
    assert isinstance(exc, UsageError) and "a FIFO (named pipe)" in str(exc) and str(fifo) in str(exc), exc


def test_a_socket_in_an_inventory_directory_is_refused(tmp_path: Path) -> None:
    write_inventory(tmp_path)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        exc = _load_within(tmp_path)  # the directory is the inventory: ansible-core reads every file in it
    assert isinstance(exc, UsageError) and "a socket" in str(exc) and str(tmp_path / "sock") in str(exc)


def test_an_alias_bomb_in_group_vars_is_refused_at_once(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, files={"group_vars/all.yml": bomb(9)})  # a billion values
    t = time.monotonic()
    with pytest.raises(UsageError, match="alias bomb") as ei:
        load_fleet(inv)
    assert time.monotonic() - t < 10  # refused on the node graph, never expanded (a correctness bound, not a goal)
    assert str(tmp_path / "group_vars" / "all.yml") in str(ei.value)


def test_anchors_a_site_really_writes_still_load(tmp_path: Path) -> None:
    shared = ("defaults: &defaults {gpu_count: 8, fabric: infiniband}\n"
              "gpu_nodes_extra: {<<: *defaults, bootstrap_interface: eth0}\n" + bomb(4))  # 10,000 values: fine
    inv = write_inventory(tmp_path, files={"group_vars/all.yml": shared})
    fleet = load_fleet(inv)
    assert len(fleet.hosts["n1"].vars["a3"]) == 10


def test_alias_problem_counts_what_aliases_add() -> None:
    assert alias_problem(bomb(4)) is None  # about 12,000 values once expanded, written as 40
    assert "alias bomb" in (alias_problem(bomb(6)) or "")  # a million
    assert alias_problem("a: &a [1, 2]\nb: *a\n") is None
    assert alias_problem("[gpu_nodes]\nn1 x=*&\n") is None  # not YAML that composes to a bomb: left to the reader
    assert "recursive" in (alias_problem("a: &a [1, *a]\n") or "")
    wide = "a: &a [" + ", ".join(["x"] * 1000) + "]\nb: [" + ", ".join(["*a"] * (MAX_ALIAS_VALUES // 1000 + 1)) + "]\n"
    assert "alias bomb" in (alias_problem(wide) or "")


def test_extra_vars_file_bomb_and_fifo_are_refused(tmp_path: Path) -> None:
    (tmp_path / "bomb.yml").write_text(bomb(9))
    with pytest.raises(UsageError, match="alias bomb") as ei:
        extra_vars([f"@{tmp_path / 'bomb.yml'}"])
    assert str(tmp_path / "bomb.yml") in str(ei.value)
    os.mkfifo(tmp_path / "vars.fifo")
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(r=_catch(lambda: extra_vars([f"@{tmp_path / 'vars.fifo'}"]))),
                         daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "-e @FIFO blocked"
    assert isinstance(out["r"], UsageError) and "FIFO" in str(out["r"])


def _catch(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
