"""Runtime shared by the stand-in NVIDIA tools (copied into every package that needs it at build time).

Python 3.11 stdlib only: it runs on the testbed hosts (Debian 12), not in the controller's venv.
- The hardware is whatever `$HWSIM_DIR/spec.json` says (default /var/lib/hwsim, bind-mounted read-only from the
  controller). No spec = no GPU driver talking to hardware.
- Runtime state the real driver keeps in the kernel (persistence mode, fabric registration) lives under
  `$HWSIM_RUN_DIR` (default /run, a tmpfs: a reboot clears it, as it clears the real driver state).
"""

from __future__ import annotations

import os

# Start-up cost: nvidia-smi is called by every probe, and a real one answers in milliseconds. So the paths the query
# forms read are plain strings (os.path); pathlib, tempfile and json are imported only by the functions that return a
# Path or write files (the daemons and `-pm`); JSON is read with the json package's own C scanner (`loads`), because
# importing json imports re and enum (~5 ms, as much as the rest of a query). Annotations stay strings (`typing` is
# never imported).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any


def _path(p: str) -> Path:
    from pathlib import Path

    return Path(p)


class NoDriver(Exception):
    """The driver cannot be reached: no hardware spec or no kernel module installed."""


class _ScanContext:
    """What json.decoder.JSONDecoder hands the C scanner (json.loads' defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = None  # NaN/Infinity: not in our files (the json fallback accepts them)


def loads(text: str) -> Any:
    """json.loads(text) for a document that is one JSON value (ValueError when it is not one)."""
    try:
        from _json import make_scanner
    except ImportError:  # another Python: the json package
        import json

        return json.loads(text)
    body = text.strip(" \t\n\r")
    try:
        value, end = make_scanner(_ScanContext())(body, 0)
    except StopIteration as exc:
        raise ValueError(f"not JSON at offset {exc.value}") from None
    if end != len(body):
        raise ValueError(f"extra data at offset {end}")
    return value


def _read(path: str | os.PathLike[str]) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _spec_dir() -> str:
    return os.environ.get("HWSIM_DIR", "/var/lib/hwsim")


def _run_root() -> str:
    return os.environ.get("HWSIM_RUN_DIR", "/run")


def spec_dir() -> Path:
    return _path(_spec_dir())


def run_root() -> Path:
    return _path(_run_root())


def _module_marker() -> str:
    env = os.environ.get("HWSIM_MODULE_MARKER")
    if env:
        return env
    return os.path.join("/usr/lib/modules", os.uname().release, "updates", "dkms", "nvidia.ko")


def module_marker() -> Path:
    """The file nvidia-kernel-open-580 installs where DKMS would put the built module."""
    return _path(_module_marker())


def load_spec(*, need_module: bool = True) -> dict[str, Any]:
    path = os.path.join(_spec_dir(), "spec.json")
    try:
        spec = loads(_read(path))
    except (OSError, ValueError) as exc:
        raise NoDriver(f"no hardware spec at {path}: {exc}") from exc
    if need_module and not os.path.exists(_module_marker()):
        raise NoDriver(f"no NVIDIA kernel module installed ({_module_marker()} missing)")
    return spec


def atomic_write(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> None:
    import tempfile

    path = os.fspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def pid_alive(pidfile: str | os.PathLike[str], name: str) -> int | None:
    """The pid in `pidfile` if that process is alive and its command line names `name`."""
    try:
        pid = int(_read(pidfile).split()[0])
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError, IndexError):
        return None
    return pid if name in cmdline else None


# --- persistence mode -------------------------------------------------------------------------------------------
def _persistenced_dir() -> str:
    return os.path.join(_run_root(), "nvidia-persistenced")


def persistenced_dir() -> Path:
    return _path(_persistenced_dir())


def persistenced_pidfile() -> Path:
    return _path(os.path.join(_persistenced_dir(), "nvidia-persistenced.pid"))


def persistenced_running() -> tuple[bool, bool]:
    """(daemon alive, daemon keeps persistence mode on)."""
    if pid_alive(os.path.join(_persistenced_dir(), "nvidia-persistenced.pid"), "nvidia-persistenced") is None:
        return False, False
    try:
        mode = _read(os.path.join(_persistenced_dir(), "hwsim-persistence-mode")).strip() == "1"
    except OSError:
        mode = False
    return True, mode


def _legacy_file() -> str:
    return os.path.join(_run_root(), "nvidia-hwsim", "persistence.json")


def legacy_persistence() -> dict[str, bool]:
    try:
        data = loads(_read(_legacy_file()))
        return {str(k): bool(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError):
        return {}


def set_legacy_persistence(bus_id: str, on: bool) -> None:
    import json

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
def _fabricmanager_pidfile() -> str:
    return os.path.join(_run_root(), "nvidia-fabricmanager", "nv-fabricmanager.pid")


def fabricmanager_pidfile() -> Path:
    return _path(_fabricmanager_pidfile())


def nvlsm_running() -> bool:
    return pid_alive(os.path.join(_run_root(), "nvlsm", "nvlsm.pid"), "nvlsm") is not None


def fabric_state(spec: dict[str, Any], gpu: dict[str, Any]) -> tuple[str, str]:
    """(State, Status) as `nvidia-smi -q` prints them under Fabric. NVSwitch systems only (>= 2 GPUs).

    HGX B200 (`nvlsm`): Fabric Manager alone gets no further than "In Progress" (NV_WARN_NOTHING_TO_DO) until NVLSM
    runs. GB200 trays (`imex`): the rack's switch trays (NMX) own the fabric, no Fabric Manager on the tray: Completed
    while the tray's NVLinks are up."""
    if len(spec.get("gpus", [])) < 2:
        return "N/A", "N/A"
    links_up = any(link["active"] for link in gpu.get("nvlinks", []))
    if spec.get("imex"):
        return ("Completed", "Success") if links_up else ("In Progress", "N/A")
    if pid_alive(_fabricmanager_pidfile(), "nv-fabricmanager") is not None:
        if spec.get("nvlsm") and not nvlsm_running():
            return "In Progress", "N/A"
        if not links_up:
            return "Completed", "Unexpected Error"  # registered, but no trained link to the NVSwitches
        return "Completed", "Success"
    return "Not Started", "N/A"


def loaded_driver(spec: dict[str, Any]) -> str:
    """The version the loaded kernel module reports (differs from the installed packages under fm_mismatch)."""
    drv = spec.get("driver", {})
    return str(drv.get("kernel_module_version") or drv.get("version"))
