"""Runtime shared by the stand-in NVIDIA tools (copied into every package that needs it at build time).

Python 3.11 stdlib only: it runs on the testbed hosts (Debian 12), not in the controller's venv.
- The hardware is whatever `$HWSIM_DIR/spec.json` says (default /var/lib/hwsim, bind-mounted read-only from the
  controller). No spec = no GPU driver talking to hardware.
- Runtime state the real driver keeps in the kernel (persistence mode, fabric registration) lives under
  `$HWSIM_RUN_DIR` (default /run, a tmpfs: a reboot clears it, as it clears the real driver state).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any


class NoDriver(Exception):
    """The driver cannot be reached: no hardware spec or no kernel module installed."""


def spec_dir() -> Path:
    return Path(os.environ.get("HWSIM_DIR", "/var/lib/hwsim"))


def run_root() -> Path:
    return Path(os.environ.get("HWSIM_RUN_DIR", "/run"))


def module_marker() -> Path:
    """The file nvidia-kernel-open-580 installs where DKMS would put the built module."""
    env = os.environ.get("HWSIM_MODULE_MARKER")
    if env:
        return Path(env)
    return Path("/usr/lib/modules") / platform.release() / "updates" / "dkms" / "nvidia.ko"


def load_spec(*, need_module: bool = True) -> dict[str, Any]:
    path = spec_dir() / "spec.json"
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise NoDriver(f"no hardware spec at {path}: {exc}") from exc
    if need_module and not module_marker().exists():
        raise NoDriver(f"no NVIDIA kernel module installed ({module_marker()} missing)")
    return spec


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def pid_alive(pidfile: Path, name: str) -> int | None:
    """The pid in `pidfile` if that process is alive and its command line names `name`."""
    try:
        pid = int(pidfile.read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError, IndexError):
        return None
    return pid if name in cmdline else None


# --- persistence mode -------------------------------------------------------------------------------------------
def persistenced_dir() -> Path:
    return run_root() / "nvidia-persistenced"


def persistenced_pidfile() -> Path:
    return persistenced_dir() / "nvidia-persistenced.pid"


def persistenced_running() -> tuple[bool, bool]:
    """(daemon alive, daemon keeps persistence mode on)."""
    if pid_alive(persistenced_pidfile(), "nvidia-persistenced") is None:
        return False, False
    try:
        mode = (persistenced_dir() / "hwsim-persistence-mode").read_text().strip() == "1"
    except OSError:
        mode = False
    return True, mode


def _legacy_file() -> Path:
    return run_root() / "nvidia-hwsim" / "persistence.json"


def legacy_persistence() -> dict[str, bool]:
    try:
        data = json.loads(_legacy_file().read_text())
        return {str(k): bool(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError):
        return {}


def set_legacy_persistence(bus_id: str, on: bool) -> None:
    data = legacy_persistence()
    data[bus_id] = on
    atomic_write(_legacy_file(), json.dumps(data, sort_keys=True) + "\n")


def persistence_enabled(spec: dict[str, Any], gpu: dict[str, Any]) -> bool:
    if spec.get("persistence", {}).get("forced_off"):
        return False
    explicit = legacy_persistence().get(gpu["pci_bus_id"])
    if explicit is not None:
        return explicit
    alive, mode = persistenced_running()
    return alive and mode


# --- fabric manager ---------------------------------------------------------------------------------------------
def fabricmanager_pidfile() -> Path:
    return run_root() / "nvidia-fabricmanager" / "nv-fabricmanager.pid"


def fabric_state(spec: dict[str, Any], gpu: dict[str, Any]) -> tuple[str, str]:
    """(State, Status) as `nvidia-smi -q` prints them under Fabric. NVSwitch systems only (>= 2 GPUs)."""
    if len(spec.get("gpus", [])) < 2:
        return "N/A", "N/A"
    if pid_alive(fabricmanager_pidfile(), "nv-fabricmanager") is not None:
        if not any(link["active"] for link in gpu.get("nvlinks", [])):
            return "Completed", "Unexpected Error"  # registered, but no trained link to the NVSwitches
        return "Completed", "Success"
    return "Not Started", "N/A"


def loaded_driver(spec: dict[str, Any]) -> str:
    """The version the loaded kernel module reports (differs from the installed packages under fm_mismatch)."""
    drv = spec.get("driver", {})
    return str(drv.get("kernel_module_version") or drv.get("version"))
