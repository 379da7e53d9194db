"""A Redfish BMC for every host of a rack: sushy-tools' emulator (its Flask app, HTTPS, basic auth) with a systems
driver whose power actions stop and start that host's nspawn container, so `provision power ... cycle` really
restarts the host (its boot id changes). One process per host on 127.0.0.1, TLS from the rack's own BMC CA.

State under the rack directory (`bmc/`): ca.pem, server cert/key, htpasswd, the password (0600), one `HOST.json`
per BMC (port, uuid, boot override, firmware versions). `testbed down` ends the processes with the rack.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

from provisioner_testbed.state import Proc, RackState, pids_with_arg_under, rack_dir, terminate

USER = "testbed"
#: An environment variable a site could name with `bmc_password_env` instead (the generated inventory vaults
#: `bmc_password` with the racks' vault password: provisioner_testbed.vault).
PASSWORD_ENV = "PROVISIONER_TESTBED_BMC_PASSWORD"
ADDRESS = "127.0.0.1"
#: What the simulated hosts' firmware reports unless a test sets another version (`set_firmware`).
DEFAULT_FIRMWARE = {"bios": "2.19.1"}
#: The BIOS attributes the simulated BMCs report (Bios.Attributes); the ACS one follows the host's `acs_on` fault, as a
#: BIOS with ACS enabled sets ACS on at the bridges. Vendors name these differently: these names are the rack's own.
BIOS_ATTRIBUTES = {"BootMode": "Uefi", "PcieAcsControl": "Disabled", "SriovGlobalEnable": "Enabled",
                   "IntelVtForDirectedIo": "Enabled"}


def bmc_dir(rack: str) -> Path:
    return rack_dir(rack) / "bmc"


def password_file(rack: str) -> Path:
    return bmc_dir(rack) / "password"


def _host_file(rack: str, host: str) -> Path:
    return bmc_dir(rack) / f"{host}.json"


def read_host(rack: str, host: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads(_host_file(rack, host).read_text()))
    except (OSError, ValueError):
        return None


def _write_host(rack: str, host: str, data: dict[str, Any]) -> None:
    p = _host_file(rack, host)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, p)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((ADDRESS, 0))
        return int(s.getsockname()[1])


def _tls(d: Path) -> None:
    """The rack's BMC CA and one server certificate for 127.0.0.1 it signed (kept across restarts)."""
    from provisioner_testbed import tls

    tls.ensure(d, ADDRESS, f"provisioner testbed BMC CA ({d.parent.name})")


def _credentials(rack: str) -> None:
    import bcrypt

    d = bmc_dir(rack)
    pw = password_file(rack)
    if pw.is_file() and (d / "htpasswd").is_file():
        return
    password = secrets.token_urlsafe(18)
    fd = os.open(pw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    (d / "htpasswd").write_text(f"{USER}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=6)).decode()}\n")
    os.chmod(d / "htpasswd", 0o600)


def _running(rack: str, host: str) -> list[Proc]:
    cfg = str(_host_file(rack, host))
    return [p for p in (Proc.of(x) for x in pids_with_arg_under(cfg)) if p]


def start(st: RackState, hosts: list[str] | None = None, *, wait: float = 30.0) -> dict[str, int]:
    """Start the BMC of each host (all of the rack's by default) that is not running; {host: port}."""
    d = bmc_dir(st.name)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    _tls(d)
    _credentials(st.name)
    names = hosts or [h.name for h in st.hosts]
    ports: dict[str, int] = {}
    started = []
    for name in names:
        if st.host(name) is None:
            raise KeyError(name)
        cfg = read_host(st.name, name) or {"host": name, "rack": st.name, "uuid": str(uuidlib.uuid4()),
                                            "port": _free_port(), "boot": "Hdd", "firmware": dict(DEFAULT_FIRMWARE)}
        _write_host(st.name, name, cfg)
        ports[name] = int(cfg["port"])
        if _running(st.name, name):
            continue
        log = (d / f"{name}.log").open("a")
        subprocess.Popen([sys.executable, "-m", "provisioner_testbed.bmc", str(_host_file(st.name, name))],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        log.close()
        started.append(name)
    deadline = time.monotonic() + wait
    for name in started:
        while True:
            try:
                socket.create_connection((ADDRESS, ports[name]), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    tail = (d / f"{name}.log").read_text()[-1500:]
                    raise RuntimeError(f"BMC of {name} did not start on {ADDRESS}:{ports[name]}: {tail}") from None
                time.sleep(0.2)
    return ports


def stop(rack: str, hosts: list[str]) -> None:
    """Stop those hosts' BMCs (the `BMC unreachable` fault); their port and state stay for a later start."""
    procs = [p for h in hosts for p in _running(rack, h)]
    terminate(procs, 5.0)


def status(rack: str, host: str) -> str:
    if read_host(rack, host) is None:
        return "none"
    return "up" if _running(rack, host) else "stopped"


def set_firmware(rack: str, host: str, component: str, version: str) -> None:
    """What the host's BMC reports for `component` (bios, bmc) from now on: a wrong-firmware fault."""
    cfg = read_host(rack, host)
    if cfg is None:
        raise KeyError(host)
    cfg.setdefault("firmware", {})[component] = version
    _write_host(rack, host, cfg)


def inventory_vars(rack: str, host: str) -> dict[str, Any]:
    """The host_vars of a host whose BMC exists: where it answers."""
    cfg = read_host(rack, host)
    return {} if cfg is None else {"bmc_address": ADDRESS, "bmc_port": int(cfg["port"])}


def group_vars(rack: str) -> dict[str, Any]:
    """The fleet-wide BMC variables: the credentials (`bmc_password` in plain text here: the inventory writer vaults
    it), the rack's BMC CA."""
    if not bmc_dir(rack).is_dir():
        return {}
    try:
        password = password_file(rack).read_text().strip()
    except OSError:
        return {}
    return {"bmc_username": USER, "bmc_password": password, "bmc_ca_file": str(bmc_dir(rack) / "ca.pem")}


# ---------------------------------------------------------------------------------------------------------------
# the BMC process


def _driver(cfg_path: Path) -> Any:
    from sushy_tools import error
    from sushy_tools.emulator.resources.systems.base import AbstractSystemsDriver

    from provisioner_testbed import rack as rackmod

    class RackHostDriver(AbstractSystemsDriver):  # type: ignore[misc]
        """One nspawn host as a Redfish ComputerSystem: power = its container running, actions stop/start it."""

        def __init__(self) -> None:
            self._lock = threading.Lock()
            self._busy: str | None = None  # the power state an action in progress leads to

        def _cfg(self) -> dict[str, Any]:
            return dict(json.loads(cfg_path.read_text()))

        def _save(self, **changes: Any) -> None:
            cfg = self._cfg()
            cfg.update(changes)
            tmp = cfg_path.with_name(cfg_path.name + ".tmp")
            tmp.write_text(json.dumps(cfg, indent=1))
            os.replace(tmp, cfg_path)

        @property
        def driver(self) -> str:
            return "<provisioner testbed nspawn>"

        @property
        def systems(self) -> list[str]:
            return [self._cfg()["uuid"]]

        def uuid(self, identity: str) -> str:
            cfg = self._cfg()
            if identity in (cfg["uuid"], cfg["host"]):
                return str(cfg["uuid"])
            raise error.NotFound(f"System {identity} not found")

        def name(self, identity: str) -> str:
            return str(self._cfg()["host"])

        def _on(self) -> bool:
            cfg = self._cfg()
            st = rackmod.load(cfg["rack"])
            h = rackmod.get_host(st, cfg["host"])
            return h.proc is not None and h.proc.alive()

        def get_power_state(self, identity: str) -> str:
            with self._lock:
                busy = self._busy
            if busy in ("ForceOff", "GracefulShutdown"):
                return "PoweringOff"
            if busy:  # on, or a restart: On again once the host is up (SSH answers)
                return "PoweringOn"
            return "On" if self._on() else "Off"

        def _act(self, state: str) -> None:
            cfg = self._cfg()
            try:
                if state in ("ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart",
                             "PowerCycle") and self._on():
                    rackmod.stop_host(cfg["rack"], cfg["host"])
                if state not in ("ForceOff", "GracefulShutdown"):
                    rackmod.start_host_cmd(cfg["rack"], cfg["host"])
            except Exception as exc:  # noqa: BLE001 (the log says why; the power state shows the outcome)
                print(f"power {state} of {cfg['host']} failed: {type(exc).__name__}: {exc}", flush=True)
            finally:
                with self._lock:
                    self._busy = None

        def set_power_state(self, identity: str, state: str) -> None:
            if state not in ("On", "ForceOn", "ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart",
                             "PowerCycle"):
                raise error.NotSupportedError(f"Power state {state} is not supported")
            with self._lock:
                if self._busy:
                    raise error.Conflict(f"a power action is in progress (to {self._busy})")
                self._busy = state
            # like a real BMC: the request is accepted, the host changes state afterwards
            threading.Thread(target=self._act, args=(state,), daemon=True).start()

        def get_boot_device(self, identity: str) -> str:
            return str(self._cfg().get("boot", "Hdd"))

        def set_boot_device(self, identity: str, boot_source: str) -> None:
            self._save(boot=boot_source)

        def get_boot_mode(self, identity: str) -> str:
            return "UEFI"

        def set_boot_mode(self, identity: str, boot_mode: str) -> None:
            if boot_mode != "UEFI":
                raise error.NotSupportedError("only UEFI")

        def get_versions(self, identity: str) -> dict[str, str]:
            fw = self._cfg().get("firmware") or {}
            return {"BiosVersion": str(fw.get("bios", DEFAULT_FIRMWARE["bios"]))}

        def set_versions(self, identity: str, firmware_versions: dict[str, str]) -> None:
            """The emulator's SimpleUpdate: the BIOS reports the new version from now on (the image is not read)."""
            fw = dict(self._cfg().get("firmware") or {})
            if "BiosVersion" in firmware_versions:
                fw["bios"] = str(firmware_versions["BiosVersion"])
            self._save(firmware=fw)

        def get_bios(self, identity: str) -> dict[str, str]:
            cfg = self._cfg()
            st = rackmod.load(cfg["rack"])
            spec = rackmod._load_spec(st, rackmod.get_host(st, cfg["host"]))
            acs = (spec.get("faults") or {}).get("acs_on") not in (None, False)
            return {**BIOS_ATTRIBUTES, "PcieAcsControl": "Enabled" if acs else "Disabled"}

        def get_nics(self, identity: str) -> list[dict[str, str]]:
            return []

    return RackHostDriver()


def serve(cfg_path: Path) -> None:
    """Run one BMC (blocking): the emulator's Flask app with the rack host driver, HTTPS, basic auth."""
    from sushy_tools.emulator import main as emu

    cfg = json.loads(cfg_path.read_text())
    d = cfg_path.parent
    driver = _driver(cfg_path)
    emu.Application.systems = property(lambda self: driver)  # type: ignore[method-assign,assignment]
    emu.app.configure(extra_config={"SUSHY_EMULATOR_AUTH_FILE": str(d / "htpasswd"),
                                    "SUSHY_EMULATOR_STATE_DIR": str(d / f"{cfg['host']}.state")})
    import flask

    @emu.app.after_request
    def _bmc_firmware(resp: Any) -> Any:
        """The Manager's FirmwareVersion (the emulator's is a constant) from this BMC's state: the wrong-BMC-firmware
        fault (`set_firmware(..., "bmc", V)`)."""
        if flask.request.method != "GET" or not resp.is_json or \
                not flask.request.path.rstrip("/").startswith("/redfish/v1/Managers/"):
            return resp
        version = (json.loads(cfg_path.read_text()).get("firmware") or {}).get("bmc")
        if version:
            data = resp.get_json()
            if isinstance(data, dict) and "FirmwareVersion" in data:
                data["FirmwareVersion"] = str(version)
                resp.set_data(json.dumps(data))
        return resp

    emu.app.run(host=ADDRESS, port=int(cfg["port"]), ssl_context=(str(d / "server.pem"), str(d / "server.key")),
                threaded=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
