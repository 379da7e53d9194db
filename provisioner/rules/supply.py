"""Supply-chain rules (SUP0xx): where the nodes download software from, and the keys that vouch for it.

The sources are the site variables of docs/inventory.md ("Site mirrors"): the pip index of the vLLM venv
(`vllm_pip_index_url`, `vllm_pip_extra_args`), the NVIDIA and DOCA apt repositories (`nvidia_repo_url`,
`infiniband_doca_repo_url`) and their pinned signing keys (`*_repo_key_fingerprints`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Iterator
from typing import Any

from provisioner.bmc.config import is_template, is_vaulted
from provisioner.model import Fleet
from provisioner.rules import Finding, rule
from provisioner.rules._util import places, show, type_name
from provisioner.rules.context import RuleContext

PIP_INDEX_VARS = ("vllm_pip_index_url",)
PIP_ARGS_VARS = ("vllm_pip_extra_args",)
#: any other variable named like these (a site's own role, a future one) is read as pip arguments too
PIP_ARGS_SUFFIX = "_pip_extra_args"
PIP_REQUIREMENT_VARS = ("vllm_pip_extra_packages", "execution_node_packages")
APT_REPO_VARS = ("nvidia_repo_url", "infiniband_doca_repo_url", "site_apt_repo_url")
FINGERPRINT_VARS = ("nvidia_repo_key_fingerprints", "infiniband_doca_repo_key_fingerprints",
                    "site_apt_repo_key_fingerprints")
# pip options that take a URL (the long and short spellings pip accepts)
_URL_OPTS = {"--index-url": "--index-url", "-i": "--index-url", "--extra-index-url": "--extra-index-url",
             "--find-links": "--find-links", "-f": "--find-links"}
_FINGERPRINT = re.compile(r"[0-9A-F]{40}|[0-9A-F]{64}")


def _literal(v: Any) -> bool:
    """A value the rules can read: a string that is neither vaulted nor a Jinja template."""
    return isinstance(v, str) and not is_vaulted(v) and not is_template(v)


def _http(url: str) -> bool:
    return url.strip().lower().startswith("http://")


def _pip_options(args: str) -> Iterator[tuple[str, str | None]]:
    """(option, value) of a pip command line: `--opt value`, `--opt=value`, `-ivalue`; value None for a flag."""
    try:
        words = shlex.split(args)
    except ValueError:
        words = args.split()
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("--") and "=" in w:
            opt, _, val = w.partition("=")
            yield opt, val
        elif w in _URL_OPTS or w == "--trusted-host":
            yield w, words[i + 1] if i + 1 < len(words) else None
            i += 1
        elif w[:2] in ("-i", "-f") and len(w) > 2:
            yield w[:2], w[2:]
        else:
            yield w, None
        i += 1


def _pip_args_vars(fleet: Fleet) -> list[str]:
    """vllm_pip_extra_args and every other `*_pip_extra_args` the inventory sets (sorted, each once)."""
    names = {n for gv in fleet.group_vars.values() for n in gv if n.endswith(PIP_ARGS_SUFFIX)}
    names |= {n for h in fleet.hosts.values() for n in h.vars if n.endswith(PIP_ARGS_SUFFIX)}
    return sorted(names | set(PIP_ARGS_VARS))


def _where(g: str | None, h: str | None) -> dict[str, str | None]:
    return {"group": g, "host": h}


@rule("SUP001", "pip index over plain HTTP")
def pip_http(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """An http:// pip index (vllm_pip_index_url, or --index-url/--extra-index-url/--find-links in
    vllm_pip_extra_args) or requirement (`name @ http://...` in vllm_pip_extra_packages / execution_node_packages):
    pip fetches it unencrypted and unauthenticated (no hashes are pinned), so anyone on the path can hand the node
    another wheel."""
    for var in PIP_INDEX_VARS:
        for g, h, v in places(fleet, var):
            if _literal(v) and _http(v):
                yield Finding("SUP001", "warning", f"{var} = {v!r} is plain HTTP: pip would install vLLM and its "
                              "dependencies from it unencrypted and unauthenticated; serve the mirror over https "
                              "(a site CA goes in site_ca_certificates)", var=var, **_where(g, h))
    for var in _pip_args_vars(fleet):
        for g, h, v in places(fleet, var):
            if not _literal(v):
                continue
            for opt, val in _pip_options(v):
                if opt in _URL_OPTS and val and _http(val):
                    yield Finding("SUP001", "warning", f"{var}: {_URL_OPTS[opt]} {val} is plain HTTP: pip would "
                                  "download from it unencrypted and unauthenticated; use an https URL (a site CA "
                                  "goes in site_ca_certificates)", var=var, **_where(g, h))
    for var in PIP_REQUIREMENT_VARS:
        for g, h, v in places(fleet, var):
            for item in v if isinstance(v, (list, tuple)) else []:
                url = item.rpartition("@")[2].strip() if _literal(item) else ""
                if _http(url):
                    yield Finding("SUP001", "warning", f"{var}: {item!r} is downloaded over plain HTTP, unencrypted "
                                  "and unauthenticated; use an https URL or put the wheel on the site's index",
                                  var=var, **_where(g, h))


@rule("SUP002", "pip told to trust a host without TLS verification")
def pip_trusted_host(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """--trusted-host in any *_pip_extra_args turns certificate checks off for that host (and allows plain HTTP
    to it): a proxy or a spoofed address can serve any package. An error: never weaken a download to make it work
    (serve the mirror over https, its CA in site_ca_certificates: role bundle_mirror does)."""
    for var, g, h, val in _pip_option_places(fleet, "--trusted-host"):
        yield Finding("SUP002", "error", f"{var}: --trusted-host {val or ''} turns pip's certificate "
                      "check off for that host (and lets it serve plain HTTP): remove it, serve the index over "
                      "https and give the mirror's CA in site_ca_certificates (pip then verifies against it)",
                      var=var, **_where(g, h))


@rule("SUP003", "a second pip index")
def pip_extra_index(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """--extra-index-url in vllm_pip_extra_args: pip takes the highest version of a name from any index, so a
    package published under the same name on the other index replaces the one you meant (dependency confusion)."""
    for var, g, h, val in _pip_option_places(fleet, "--extra-index-url"):
        yield Finding("SUP003", "warning", f"{var}: --extra-index-url {val or ''}: pip installs the "
                      "highest version of each name found on either index, so a same-named package on "
                      "one index shadows the other's; mirror what you need into the one index of "
                      "vllm_pip_index_url", var=var, **_where(g, h))


def _pip_option_places(fleet: Fleet, option: str) -> Iterator[tuple[str, str | None, str | None, str | None]]:
    """(variable, group, host, value) for each literal `option` in a pip-arguments variable, once per place."""
    for var in _pip_args_vars(fleet):
        for g, h, v in places(fleet, var):
            if _literal(v):
                for opt, val in _pip_options(v):
                    if opt == option:
                        yield var, g, h, val


@rule("SUP004", "apt repository over plain HTTP")
def apt_http(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """nvidia_repo_url / infiniband_doca_repo_url over http://: apt still checks the repository's signature (the
    pinned key), but anyone on the path sees what the node installs and can hold back updates (an old, validly
    signed Release: a freeze/replay)."""
    for var in APT_REPO_VARS:
        for g, h, v in places(fleet, var):
            if _literal(v) and _http(v):
                yield Finding("SUP004", "warning", f"{var} = {v!r} is plain HTTP: apt checks the signature, but the "
                              "path sees every package and can serve stale (validly signed) metadata; set "
                              f"{var} to the mirror's https:// URL (a site CA that signs it goes in "
                              "site_ca_certificates)", var=var, **_where(g, h))


def _fingerprint_problem(var: str, v: Any) -> str | None:
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
        return (f"{var} = {show(v)} is a {type_name(v)}: expected a list of OpenPGP fingerprints, e.g. "
                f"[EB693B3035CD5710E231E123A4B469963BF863CC]")
    for x in items:
        norm = re.sub(r"\s+", "", x).upper().removeprefix("0X")
        if not _FINGERPRINT.fullmatch(norm):
            why = "a key id, not a fingerprint" if re.fullmatch(r"[0-9A-F]{8}|[0-9A-F]{16}", norm) else "not one"
            return (f"{var} entry {x!r} is {why}: give the full fingerprint (40 hex digits, 64 for a v6 key) as "
                    "`gpg --show-keys <key file>` prints it")
    return None


@rule("SUP005", "repository signing key not pinned")
def key_pins(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """nvidia_repo_key_fingerprints / infiniband_doca_repo_key_fingerprints are lists of full OpenPGP fingerprints
    (a short key id can be forged); a host with infiniband_stack doca needs the DOCA pin (it has no default)."""
    for var in FINGERPRINT_VARS:
        for g, h, v in places(fleet, var):
            if is_vaulted(v) or (isinstance(v, str) and is_template(v)):
                continue
            msg = _fingerprint_problem(var, v)
            if msg is None and not v:
                msg = f"{var} is empty: a repository key is never installed unpinned; give its fingerprint"
            if msg:
                yield Finding("SUP005", "error", msg, var=var, **_where(g, h))
    var = "infiniband_doca_repo_key_fingerprints"
    for g, h, v in places(fleet, "infiniband_stack"):  # once where doca is chosen (a group, or a host)
        if v != "doca":
            continue
        hosts = [fleet.hosts[h]] if h else [x for x in fleet.gpu_nodes if g == "all" or g in x.groups]
        unpinned = [x.name for x in hosts if var not in x.vars and x.vars.get("infiniband_stack") == "doca"
                    and x.vars.get("fabric") != "efa"]
        if unpinned:
            yield Finding("SUP005", "error", f"infiniband_stack is doca but {var} is not set "
                          f"({len(unpinned)} host(s): {', '.join(unpinned[:3])}{'...' if len(unpinned) > 3 else ''}): "
                          "give the fingerprint(s) of the DOCA repository key you checked (`gpg --show-keys "
                          "GPG-KEY-Mellanox.pub`); the role installs no unpinned key", var="infiniband_stack",
                          **_where(g, h))


MIRROR_GROUP = "bundle_mirror"
_PEM_CERT = re.compile(r"\s*-----BEGIN CERTIFICATE-----")
_PEM_KEY = re.compile(r"\s*-----BEGIN ([A-Z]+ )?PRIVATE KEY-----")
_FALSE = frozenset({"false", "no", "off", "0", "n", "f"})


def _off(v: Any) -> bool:
    """A literal false as Ansible's `bool` reads it (a template or a vaulted value: not known here, so not off)."""
    return (isinstance(v, (bool, int)) and not v) or (_literal(v) and str(v).strip().lower() in _FALSE)


def _pem_state(v: Any, pattern: re.Pattern[str], what: str) -> str | None:
    """None when `v` can be the PEM text role bundle_mirror needs (vaulted or a template counts: read at run time),
    else what was found (never the value: it may be a key)."""
    if v is None:
        return "not set"
    if is_vaulted(v) or (isinstance(v, str) and is_template(v)):
        return None
    if not isinstance(v, str):
        return f"a {type_name(v)}"
    if not v.strip():
        return "empty"
    return None if pattern.match(v) else f"not {what}"


@rule("SUP006", "a bundle mirror without its certificate or key")
def mirror_tls(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """A host of group bundle_mirror serves the bundle over HTTPS (bundle_mirror_tls, the default): role
    bundle_mirror needs bundle_mirror_tls_certificate (PEM, issued by a CA in site_ca_certificates) and
    bundle_mirror_tls_key (its PEM key, vaulted). Without them the run would stop on the mirror host; refused here,
    before any host is touched (the key's value is never shown). bundle_mirror_tls false needs
    bundle_mirror_http_port (apt only over plain HTTP), else the mirror serves nothing."""
    for name in fleet.groups.get(MIRROR_GROUP, ()):
        h = fleet.hosts.get(name)
        if h is None:
            continue
        if _off(h.vars.get("bundle_mirror_tls", True)):
            port = h.vars.get("bundle_mirror_http_port", 0)
            if isinstance(port, int) and not isinstance(port, bool) and port <= 0:
                yield Finding("SUP006", "error", f"{name} (group {MIRROR_GROUP} in {fleet.source.name}): "
                              "bundle_mirror_tls is false and bundle_mirror_http_port is not set: the mirror would "
                              "serve nothing; keep HTTPS (bundle_mirror_tls_certificate, bundle_mirror_tls_key) or "
                              "set bundle_mirror_http_port (the signed apt repository only)", host=name,
                              group=MIRROR_GROUP, var="bundle_mirror_tls")
            continue
        cert = _pem_state(h.vars.get("bundle_mirror_tls_certificate"), _PEM_CERT, "a PEM certificate")
        key = _pem_state(h.vars.get("bundle_mirror_tls_key"), _PEM_KEY, "a PEM private key")
        if cert is None and key is None:
            continue
        var = "bundle_mirror_tls_certificate" if cert else "bundle_mirror_tls_key"
        yield Finding("SUP006", "error", f"{name} (group {MIRROR_GROUP} in {fleet.source.name}) serves the bundle "
                      "over HTTPS (bundle_mirror_tls, the default) and role bundle_mirror needs "
                      "bundle_mirror_tls_certificate (the mirror's PEM certificate, issued by a CA in "
                      "site_ca_certificates) and bundle_mirror_tls_key (its PEM private key, vaulted); found "
                      f"certificate {cert or 'PEM'}, key {key or 'PEM'} (the key is never shown); docs/airgap.md, "
                      "Serve", host=name, group=MIRROR_GROUP, var=var)
