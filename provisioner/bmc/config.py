"""A host's BMC as the inventory describes it (`bmc_*` variables), and where its password comes from.

Pure but for `resolve_password` (environment, Ansible Vault). The rules (provisioner/rules/firmware.py) report
ill-typed values; `target` raises BmcConfigError with a one-line reason for a host it cannot use. No function here
puts a password in a message, a repr or a log record.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

BMC_VARS = ("bmc_address", "bmc_scheme", "bmc_port", "bmc_username", "bmc_password", "bmc_password_env",
            "bmc_tls_verify", "bmc_ca_file", "bmc_system_id")
SCHEMES = ("https", "http")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# a host name, IPv4 or [IPv6] / bare IPv6 address: no scheme, no path, no port
ADDRESS = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:]*:[0-9A-Fa-f:.]+|[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
                     r"(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*)")


class BmcConfigError(Exception):
    """A host's BMC variables cannot be used (the message says which and why; never a secret)."""


def is_vaulted(v: Any) -> bool:
    """An Ansible Vault value (`!vault |` in YAML), still encrypted."""
    return type(v).__name__ == "EncryptedString"


def is_template(v: Any) -> bool:
    return isinstance(v, str) and "{{" in v


@dataclass(frozen=True)
class BmcTarget:
    """Where and how to reach one host's BMC. `password` is excluded from repr and comparisons."""

    host: str
    address: str
    scheme: str = "https"
    port: int | None = None
    username: str = ""
    password: str = field(default="", repr=False, compare=False)
    verify: bool | str = True  # True: the system CA bundle; a path: that CA file; False: opted out (logged)
    system_id: str | None = None

    @property
    def url(self) -> str:
        addr = f"[{self.address}]" if ":" in self.address and not self.address.startswith("[") else self.address
        return f"{self.scheme}://{addr}{f':{self.port}' if self.port else ''}"


def has_bmc(vars: Mapping[str, Any]) -> bool:
    return bool(vars.get("bmc_address"))


def target(host: str, vars: Mapping[str, Any], *, password: str | None = None) -> BmcTarget:
    """The host's BMC from its merged variables; `password` as resolved by `resolve_password`."""
    addr = vars.get("bmc_address")
    if not addr:
        raise BmcConfigError("no bmc_address in the inventory")
    if not isinstance(addr, str) or not ADDRESS.fullmatch(addr):
        raise BmcConfigError("bmc_address is not a host name or IP address (provision validate: BMC001)")
    scheme = vars.get("bmc_scheme", "https") or "https"
    if scheme not in SCHEMES:
        raise BmcConfigError(f"bmc_scheme must be https or http, not {scheme!r}")
    port = vars.get("bmc_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise BmcConfigError("bmc_port must be an int 1-65535 (provision validate: BMC001)")
    user = vars.get("bmc_username")
    if not isinstance(user, str) or not user:
        raise BmcConfigError("no bmc_username in the inventory")
    tls = vars.get("bmc_tls_verify", True)
    if not isinstance(tls, bool):
        raise BmcConfigError("bmc_tls_verify must be true or false (provision validate: BMC001)")
    ca = vars.get("bmc_ca_file")
    verify: bool | str = tls
    if tls and ca:
        if not isinstance(ca, str):
            raise BmcConfigError("bmc_ca_file must be a path string")
        if not os.path.isfile(ca):
            raise BmcConfigError(f"bmc_ca_file {ca} is not a readable file")
        verify = ca
    sid = vars.get("bmc_system_id")
    return BmcTarget(host=host, address=addr.strip("[]"), scheme=scheme, port=port, username=user,
                     password=password or "", verify=verify, system_id=str(sid) if sid else None)


def resolve_password(host: str, vars: Mapping[str, Any], environ: Mapping[str, str] | None = None,
                     templar: Any = None) -> str:
    """The BMC password: from the environment variable named by `bmc_password_env`, else `bmc_password` (an Ansible
    Vault value is decrypted with the vault secrets set up by `setup_vault`; a `{{ ... }}` template is rendered
    with `templar`, e.g. `{{ vault_bmc_password }}`). BmcConfigError names the variable, never the value."""
    env = os.environ if environ is None else environ
    name = vars.get("bmc_password_env")
    if name:
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise BmcConfigError("bmc_password_env is not an environment variable name")
        value = env.get(name)
        if not value:
            raise BmcConfigError(f"bmc_password_env names {name}, which is not set in the environment")
        return value
    pw = vars.get("bmc_password")
    if pw is None or (isinstance(pw, str) and not pw):  # never `pw == ""`: comparing a vault value decrypts it
        raise BmcConfigError("no BMC password: set bmc_password (vaulted) or bmc_password_env")
    if is_vaulted(pw):
        try:
            return str(pw)
        except Exception as exc:  # ReferenceError (no vault secrets), AnsibleVaultError (wrong password)
            what = "no vault password given" if isinstance(exc, ReferenceError) else "it cannot be decrypted"
            raise BmcConfigError(f"bmc_password is vaulted and {what} (--vault-password-file, "
                                 "ANSIBLE_VAULT_PASSWORD_FILE or vault_password_file in ansible.cfg)") from None
    if is_template(pw):
        if templar is None:
            raise BmcConfigError("bmc_password is a template and cannot be rendered here")
        try:
            out = templar(pw)
        except Exception as exc:
            raise BmcConfigError(f"bmc_password: its template cannot be rendered ({type(exc).__name__})") from None
        return str(out)
    if not isinstance(pw, str):
        raise BmcConfigError("bmc_password must be a string")
    return pw
