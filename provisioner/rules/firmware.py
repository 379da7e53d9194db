"""BMC and firmware-map rules (BMC0xx, FW0xx): the out-of-band variables of docs/bmc.md, inventory only.

What the BMCs really report is `provision firmware`'s job (provisioner/bmc/firmware.py: FW010-FW012, not rules).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from provisioner.bmc.components import COMPONENTS, version_problem
from provisioner.bmc.config import ADDRESS, ENV_NAME, SCHEMES, is_template, is_vaulted
from provisioner.model import Fleet
from provisioner.rules import Finding, rule
from provisioner.rules._util import is_int, quoted_hint, show, suggest, type_name
from provisioner.rules._util import places as _places
from provisioner.rules.context import RuleContext


def _unset(v: Any) -> bool:
    return v is None or (isinstance(v, str) and not v)


def _origin_path(v: Any) -> str | None:
    from provisioner.inventory.origin import where

    w = where(v)
    return w[0] if w else None


def _bmc_type_problems(var: str, v: Any) -> str | None:
    if var == "bmc_address":
        if not isinstance(v, str) or not v:
            return f"bmc_address = {show(v)} is a {type_name(v)}: expected the BMC's host name or IP address"
        if "://" in v:
            scheme, _, rest = v.partition("://")
            return (f"bmc_address = {v!r} holds a URL: write bmc_address: {rest.split('/')[0]!r} "
                    f"(and bmc_scheme: {scheme!r} if not https)")
        if not ADDRESS.fullmatch(v):
            if v.count(":") == 1:
                addr, _, port = v.partition(":")
                return f"bmc_address = {v!r} holds a port: write bmc_address: {addr!r} and bmc_port: {port}"
            return f"bmc_address = {v!r} is not a host name or IP address"
    elif var == "bmc_scheme":
        if v not in SCHEMES:
            return f"bmc_scheme = {show(v)}: expected https (the default) or http{suggest(v, SCHEMES)}"
    elif var == "bmc_port":
        if not is_int(v) or not 0 < v < 65536:
            return f"bmc_port = {show(v)}: expected an int 1-65535{quoted_hint(v, 'int')}"
    elif var == "bmc_tls_verify":
        if not isinstance(v, bool):
            return f"bmc_tls_verify = {show(v)}: expected true or false{quoted_hint(v, 'bool')}"
    elif var in ("bmc_username", "bmc_ca_file", "bmc_system_id"):
        if not isinstance(v, str) or not v:
            return f"{var} = {show(v)} is a {type_name(v)}: expected a non-empty string"
    elif var == "bmc_password_env" and (not isinstance(v, str) or not ENV_NAME.fullmatch(v)):
        return f"bmc_password_env = {show(v)}: expected an environment variable name, e.g. BMC_PASSWORD"
    return None


@rule("BMC001", "ill-typed BMC variable")
def bmc_types(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """bmc_address a host name/IP (no URL, no port), bmc_scheme https/http, bmc_port 1-65535, bmc_tls_verify a
    bool, bmc_username / bmc_ca_file / bmc_system_id strings, bmc_password_env a variable name."""
    for var in ("bmc_address", "bmc_scheme", "bmc_port", "bmc_username", "bmc_password_env", "bmc_tls_verify",
                "bmc_ca_file", "bmc_system_id"):
        for g, h, v in _places(fleet, var):
            msg = _bmc_type_problems(var, v)
            if msg:
                yield Finding("BMC001", "error", msg, host=h, group=g, var=var)


@rule("BMC002", "two hosts share a BMC")
def bmc_shared(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Two hosts with the same bmc_address (+ port) would power each other off."""
    seen: dict[tuple[str, Any], str] = {}
    for h in fleet.hosts.values():
        a = h.vars.get("bmc_address")
        if not isinstance(a, str) or not a:
            continue
        key = (a.strip("[]").lower(), h.vars.get("bmc_port"))
        if key in seen:
            yield Finding("BMC002", "error", f"bmc_address {a!r} is also {seen[key]}'s: each host needs its own BMC "
                          "(a power action on one would hit the other)", host=h.name, var="bmc_address")
        else:
            seen[key] = h.name


@rule("BMC003", "BMC without usable credentials")
def bmc_credentials(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """A host with bmc_address needs bmc_username and one of bmc_password (vaulted) / bmc_password_env."""
    for h in fleet.hosts.values():
        if not h.vars.get("bmc_address"):
            continue
        has_pw = not _unset(h.vars.get("bmc_password"))
        has_env = bool(h.vars.get("bmc_password_env"))
        if not h.vars.get("bmc_username"):
            yield Finding("BMC003", "error", "bmc_address is set but bmc_username is not: set it (usually in "
                          "group_vars/gpu_nodes.yml)", host=h.name, var="bmc_username")
        if not has_pw and not has_env:
            yield Finding("BMC003", "error", "bmc_address is set but no password: set bmc_password_env (the name of "
                          "an environment variable) or bmc_password (ansible-vault encrypt_string)",
                          host=h.name, var="bmc_password")
        elif has_pw and has_env:
            yield Finding("BMC003", "error", "both bmc_password and bmc_password_env are set: keep one "
                          "(bmc_password_env would win)", host=h.name, var="bmc_password_env")


@rule("BMC004", "BMC password in plain text")
def bmc_plaintext(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """A bmc_password that is neither vaulted nor a template (`{{ vault_... }}`): a credential in a readable file;
    an INI file cannot hold a vault value at all."""
    for g, h, v in _places(fleet, "bmc_password"):
        if _unset(v) or is_vaulted(v) or is_template(v):
            continue
        path = _origin_path(v) or ""
        where = f" in {path.rsplit('/', 1)[-1]}" if path else ""
        if path.endswith(".ini") or (not path.endswith((".yml", ".yaml", ".json")) and path):
            fix = ("an INI inventory cannot hold a vault value: move it to group_vars/host_vars as "
                   "`ansible-vault encrypt_string`, or set bmc_password_env")
        else:
            fix = "encrypt it (`ansible-vault encrypt_string`) or set bmc_password_env instead"
        yield Finding("BMC004", "warning", f"bmc_password is plain text{where}: {fix}", host=h, group=g,
                      var="bmc_password")


@rule("BMC005", "BMC TLS verification off")
def bmc_tls(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """bmc_tls_verify: false (self-signed BMC certificates) or bmc_scheme: http send the BMC credentials where a
    man in the middle can take them; allowed per host, reported every time (and logged by power/firmware)."""
    for h in fleet.hosts.values():
        if not h.vars.get("bmc_address"):
            continue
        if h.vars.get("bmc_scheme") == "http":
            yield Finding("BMC005", "warning", "bmc_scheme: http sends the BMC credentials in clear: use https and "
                          "bmc_ca_file", host=h.name, var="bmc_scheme")
        elif h.vars.get("bmc_tls_verify") is False:
            extra = " (bmc_ca_file is ignored)" if h.vars.get("bmc_ca_file") else ""
            yield Finding("BMC005", "warning", "bmc_tls_verify: false: the BMC's certificate is not checked"
                          f"{extra}; give its CA in bmc_ca_file instead", host=h.name, var="bmc_tls_verify")


def _fw_items(v: Mapping[str, Any]) -> Iterator[tuple[Any, Any]]:
    yield from v.items()


@rule("FW001", "firmware map of the wrong shape")
def fw_shape(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """`firmware` is a mapping of component -> list of accepted version strings."""
    for g, h, v in _places(fleet, "firmware"):
        if not isinstance(v, Mapping):
            yield Finding("FW001", "error", f"firmware = {show(v)} is a {type_name(v)}: expected a mapping of "
                          "component -> accepted versions, e.g. {bios: ['2.3.1'], bmc: ['7.00.00.00']} "
                          "(in group_vars/*.yml: INI cannot hold it)", host=h, group=g, var="firmware")
            continue
        for comp, versions in _fw_items(v):
            if not isinstance(versions, (list, tuple)) or not versions:
                hint = f": write {comp}: [{versions!r}]" if isinstance(versions, str) else ""
                yield Finding("FW001", "error", f"firmware.{comp} = {show(versions)} is a {type_name(versions)}: "
                              f"expected a non-empty list of accepted versions{hint}", host=h, group=g,
                              var="firmware")


@rule("FW002", "unknown firmware component")
def fw_component(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """A key of `firmware` that is no known component would never be compared (docs/bmc.md lists them)."""
    for g, h, v in _places(fleet, "firmware"):
        if not isinstance(v, Mapping):
            continue
        for comp in v:
            if comp not in COMPONENTS:
                yield Finding("FW002", "error", f"firmware component {comp!r} is unknown{suggest(comp, COMPONENTS)}: "
                              f"one of {', '.join(COMPONENTS)}", host=h, group=g, var="firmware")


@rule("FW003", "malformed firmware version")
def fw_version(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Accepted versions are strings as the firmware reports them (quoted in YAML: 1.10 is not 1.1)."""
    for g, h, v in _places(fleet, "firmware"):
        if not isinstance(v, Mapping):
            continue
        for comp, versions in _fw_items(v):
            if not isinstance(versions, (list, tuple)):
                continue
            for ver in versions:
                p = version_problem(ver)
                if p:
                    yield Finding("FW003", "error", f"firmware.{comp}: {p}", host=h, group=g, var="firmware")
