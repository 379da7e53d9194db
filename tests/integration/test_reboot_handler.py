"""roles/nvidia_driver's reboot handler reboots the boot it was asked on, once (issue 43, class 6).

Ansible's ssh connection re-runs a command whose connection dropped (ansible.cfg `retries`); a re-run of a plain
`shutdown -r` that reaches the host's next boot reboots that boot too, and the module then reports success on a
host that is going down. The handler's reboot command compares the boot id read before the reboot with the one on
the host: here it runs in `sh` with a `shutdown` of the test's own on PATH, against this machine's real boot id."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from provisioner import PROJECT_ROOT

HANDLERS = PROJECT_ROOT / "roles/nvidia_driver/handlers/main.yml"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _handlers() -> list[dict]:
    return yaml.safe_load(HANDLERS.read_text())


def _reboot() -> dict:
    return next(h for h in _handlers() if "ansible.builtin.reboot" in h)


def _command(boot_id: str) -> list[str]:
    """The handler's reboot_command as Ansible renders it, split the way the reboot action runs it (the first word,
    an absolute path, then the rest through the remote shell)."""
    text = jinja2.Template(_reboot()["ansible.builtin.reboot"]["reboot_command"]).render(
        __nvidia_driver_boot_id={"stdout": boot_id + "\n"})
    return ["sh", "-c", text]


def _run(tmp_path: Path, boot_id: str) -> tuple[subprocess.CompletedProcess[str], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    (bin_dir / "shutdown").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "shutdown").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    r = subprocess.run(_command(boot_id), env=env, capture_output=True, text=True, timeout=30)
    return r, calls.read_text() if calls.exists() else ""


def test_the_boot_id_is_read_first_by_a_handler_on_the_same_topic() -> None:
    hs = _handlers()
    names = [h["name"] for h in hs]
    read = next(h for h in hs if h.get("register") == "__nvidia_driver_boot_id")
    reboot = _reboot()
    assert names.index(read["name"]) < names.index(reboot["name"])  # handlers run in the order of the file
    assert read["listen"] == reboot["listen"] and read["when"] == reboot["when"]
    assert read["ansible.builtin.command"] == "cat /proc/sys/kernel/random/boot_id"
    assert reboot["ansible.builtin.reboot"]["reboot_command"].startswith("/bin/sh -c ")


def test_the_boot_it_was_asked_on_reboots(tmp_path: Path) -> None:
    r, calls = _run(tmp_path, BOOT_ID.read_text().strip())
    assert r.returncode == 0, r.stderr
    assert calls.startswith("-r 0 provisioner: rebooting"), calls


def test_a_rerun_that_reaches_the_next_boot_does_nothing(tmp_path: Path) -> None:
    r, calls = _run(tmp_path, "00000000-0000-0000-0000-000000000000")
    assert r.returncode == 0 and r.stdout.strip() == "rebooted already" and calls == "", (r.stdout, calls)


@pytest.mark.parametrize(("state", "ok"), [("running", True), ("degraded", True), ("starting", False),
                                           ("stopping", False), ("maintenance", False)])
def test_the_test_command_passes_once_the_boot_finished(tmp_path: Path, state: str, ok: bool) -> None:
    """A host whose sshd answers while it is still starting, or already stopping again, is not back."""
    tc = _reboot()["ansible.builtin.reboot"]["test_command"]
    assert "systemctl is-system-running --wait" in tc
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\n[ "$*" = "is-system-running --wait" ] && echo {state}\n')
    (bin_dir / "systemctl").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    r = subprocess.run(["sh", "-c", tc], env=env, capture_output=True, text=True, timeout=30)
    assert (r.returncode == 0) is ok and r.stdout.strip() == state
