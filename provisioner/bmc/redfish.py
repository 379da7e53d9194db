"""Redfish over OpenStack's `sushy`: power state and reset, one-time boot override, firmware inventory and update,
BIOS attributes.

One `Bmc` per host. TLS is verified against `bmc_ca_file` or the system CA bundle unless the host opted out
(`bmc_tls_verify: false`, which `opt_out_line` makes loud). The password is handed to sushy and nowhere else: errors
are turned into one line (`BmcError`) that names the host, the URL and the reason, and sushy's own log is kept at
ERROR so no request detail reaches the output.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

from provisioner.bmc.config import BmcTarget
from provisioner.bmc.firmware import HostFirmware, Item, items_from_inventory, with_fallbacks

ACTIONS = ("on", "off", "cycle", "status")
BOOT_TARGETS = {"pxe": "Pxe", "disk": "Hdd", "hdd": "Hdd"}


class BmcError(Exception):
    """One line about a BMC that could not do what was asked (never a credential)."""


def opt_out_line(t: BmcTarget) -> str | None:
    """The warning printed for every use of a BMC whose certificate is not checked (or that speaks plain HTTP)."""
    if t.scheme == "http":
        return f"warning: {t.host}: BMC {t.url} over plain HTTP: credentials cross the network in clear (BMC005)"
    if t.verify is False:
        return f"warning: {t.host}: TLS verification of BMC {t.url} is OFF (bmc_tls_verify: false, BMC005)"
    return None


def _reason(exc: BaseException) -> str:
    import sushy.exceptions as sx

    if isinstance(exc, sx.AccessError):
        return "the BMC refused the credentials (HTTP 401/403): check bmc_username and the password"
    if isinstance(exc, sx.ResourceNotFoundError):
        return "not found on the BMC (HTTP 404): is bmc_system_id right?"
    if isinstance(exc, sx.HTTPError):
        return f"the BMC answered HTTP {getattr(exc, 'status_code', '?')}: {str(exc).splitlines()[0][:160]}"
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text or "SSLError" in text:
        return ("TLS verification failed: the BMC's certificate is not signed by bmc_ca_file / the system CAs "
                "(or set bmc_tls_verify: false for this host, logged)")
    if isinstance(exc, sx.ConnectionError):
        for hint in ("Connection refused", "timed out", "Name or service not known", "No route to host"):
            if hint in text:
                return f"the BMC is unreachable ({hint.lower()})"
        return "the BMC is unreachable"
    if isinstance(exc, sx.UnknownDefaultError):
        return "the BMC manages several systems: set bmc_system_id"
    return f"{type(exc).__name__}: {text.splitlines()[0][:160] if text else ''}"


class Bmc:
    """A connection to one host's BMC (Redfish service root read on creation)."""

    def __init__(self, target: BmcTarget, *, timeout: float = 20.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self.target = target
        self._sleep = sleep
        self._clock = clock
        logging.getLogger("sushy").setLevel(logging.ERROR)
        import sushy

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # urllib3's InsecureRequestWarning: opt_out_line says it once
                self._root = sushy.Sushy(f"{target.url}/redfish/v1/", username=target.username,
                                         password=target.password, verify=target.verify, server_side_retries=1,
                                         server_side_retries_delay=1, read_timeout=int(timeout),
                                         connect_timeout=min(timeout, 10.0))
        except Exception as exc:
            raise BmcError(self._line(exc)) from None
        self._system: Any = None

    def _line(self, exc: BaseException) -> str:
        return f"{self.target.host}: BMC {self.target.url}: {_reason(exc)}"

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return fn()
        except BmcError:
            raise
        except Exception as exc:
            raise BmcError(self._line(exc)) from None

    @property
    def system(self) -> Any:
        if self._system is None:
            self._system = self._call(lambda: self._root.get_system(
                f"/redfish/v1/Systems/{self.target.system_id}" if self.target.system_id else None))
        return self._system

    def power_state(self) -> str:
        """'On', 'Off', 'PoweringOn', 'PoweringOff' (as the BMC says it, read fresh)."""
        def read() -> str:
            self.system.refresh(force=True)
            ps = self.system.power_state
            return str(getattr(ps, "value", ps))
        return str(self._call(read))

    def _reset(self, value: str) -> None:
        import sushy

        rt = sushy.ResetType(value)

        def do() -> None:
            allowed = self.system.get_allowed_reset_system_values()
            if rt not in allowed:
                raise BmcError(f"{self.target.host}: BMC {self.target.url}: ComputerSystem.Reset {value} is not "
                               f"allowed here (allowed: {', '.join(sorted(a.value for a in allowed))})")
            self.system.reset_system(rt)
        self._call(do)

    def wait_power(self, want: str, timeout: float, poll: float = 1.0) -> str:
        """Poll PowerState until it is `want`; BmcError after `timeout` seconds naming the last state."""
        deadline = self._clock() + timeout
        state = self.power_state()
        while state != want:
            if self._clock() >= deadline:
                raise BmcError(f"{self.target.host}: power state still {state} after {timeout:.0f} s "
                               f"(wanted {want})")
            self._sleep(poll)
            state = self.power_state()
        return state

    def power(self, action: str, *, timeout: float = 300.0, poll: float = 1.0) -> tuple[str, str]:
        """(state before, state after) of `on` / `off` (ForceOff) / `cycle` (ForceRestart when allowed, else ForceOff
        then On; a host that is off is just powered on) / `status`; the state is read back, waited for at most
        `timeout` seconds."""
        before = self.power_state()
        if action == "status":
            return before, before
        if action == "on":
            if before != "On":
                self._reset("On")
            return before, self.wait_power("On", timeout, poll)
        if action == "off":
            if before != "Off":
                self._reset("ForceOff")
            return before, self.wait_power("Off", timeout, poll)
        if action == "cycle":
            if before == "Off":
                self._reset("On")
            else:
                import sushy

                allowed = self._call(self.system.get_allowed_reset_system_values)
                if sushy.ResetType.FORCE_RESTART in allowed:
                    self._reset("ForceRestart")
                else:
                    self._reset("ForceOff")
                    self.wait_power("Off", timeout, poll)
                    self._reset("On")
            return before, self.wait_power("On", timeout, poll)
        raise ValueError(action)

    def boot_once(self, device: str) -> None:
        """One-time boot override: `pxe` (hand-off to MAAS/Ironic/the site's PXE) or `disk` (Hdd), next boot only."""
        import sushy

        source = sushy.BootSource(BOOT_TARGETS[device])
        self._call(lambda: self.system.set_system_boot_options(
            target=source, enabled=sushy.BootSourceOverrideEnabled.ONCE))

    def firmware(self) -> HostFirmware:
        """UpdateService/FirmwareInventory, plus ComputerSystem.BiosVersion and Manager.FirmwareVersion where no
        inventory member is the BIOS / BMC."""
        import sushy.exceptions as sx

        def read() -> HostFirmware:
            items: list[Item] = []
            try:
                inv = self._root.get_update_service().firmware_inventory
            except (sx.MissingAttributeError, sx.ResourceNotFoundError):
                inv = None  # no UpdateService / FirmwareInventory: the fallbacks below only
            if inv is not None:
                items = items_from_inventory(
                    {"Id": m.identity, "Name": m.name, "Version": m.version} for m in inv.get_members())
            bmc_version = None
            try:
                bmc_version = self._root.get_manager().firmware_version
            except (sx.UnknownDefaultError, sx.MissingAttributeError, sx.ResourceNotFoundError):
                pass
            return HostFirmware(self.target.host, tuple(with_fallbacks(items, self.system.bios_version,
                                                                       bmc_version)))
        out: HostFirmware = self._call(read)
        return out

    def bios_attributes(self) -> dict[str, Any]:
        """ComputerSystem/Bios Attributes (vendor-specific names), as the BMC reports them now ({} without a Bios
        resource)."""
        import sushy.exceptions as sx

        def read() -> dict[str, Any]:
            try:
                return dict(self.system.bios.attributes or {})
            except (sx.MissingAttributeError, sx.ResourceNotFoundError):
                return {}  # no Bios resource on this BMC
        return dict(self._call(read))

    def simple_update(self, image_uri: str, component: str) -> None:
        """UpdateService.SimpleUpdate from `image_uri` (the BMC fetches it) for `component`: bios (this
        ComputerSystem) or bmc (its Manager). Returns once the BMC accepted the request."""
        import sushy

        def do() -> None:
            svc = self._root.get_update_service()
            target = self.system.path if component == "bios" else self._root.get_manager().path
            proto = sushy.UpdateTransferProtocolType.HTTPS if image_uri.startswith("https:") \
                else sushy.UpdateTransferProtocolType.HTTP
            svc.simple_update(image_uri, targets=[target], transfer_protocol=proto)
        self._call(do)
