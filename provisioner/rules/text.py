"""Text rules (TXT0xx): no inventory or extra-var value may change the shape of a file the suite renders.

TXT001 refuses control characters (C0 with newline, CR, tab and NUL; DEL; C1; U+2028/U+2029) in every host name,
group name and variable (keys and values, nested ones too); TXT002 refuses, per variable, the delimiters of the
format the value reaches (nginx, systemd, nftables, Prometheus YAML, nccl.conf / EnvironmentFile lines). Each
message names the variable, where it is set (group or host) and the file it would reach. The templates quote or
escape for their format as well (defence in depth); these rules make a bad value an error before anything renders.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from provisioner.bmc.config import is_vaulted
from provisioner.model import Fleet
from provisioner.rules import Finding, rule
from provisioner.rules._util import show
from provisioner.rules.context import RuleContext

#: C0 (NUL, tab, newline, CR, ESC...), DEL, C1 (NEL U+0085 included), and Unicode's line/paragraph separators
#: (Python's str.splitlines and YAML break lines at U+2028/U+2029 too).
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

#: Variables whose values are multi-line texts by design: newline (and CR) allowed, other controls still refused.
MULTILINE_VARS = frozenset({"site_ca_certificates", "bundle_mirror_tls_certificate", "bundle_mirror_tls_key"})

_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL", "\x1b": "an escape",
          "\x7f": "a DEL", "\x85": "a NEL", "\u2028": "a line separator", "\u2029": "a paragraph separator"}

# --- where a variable lands ------------------------------------------------------------------------------------
UNIT = "the vLLM systemd units (vllm.service/vllm-ray.service)"
ENVF = "the vLLM env file (vllm_env_file, /etc/vllm/vllm.env)"
NCCL = "/etc/nccl.conf and the vLLM env file"
NGINX = "the balancer's nginx config (conf.d/vllm-lb.conf)"
PROM = "prometheus.yml / prometheus-rules.yml"
NFT = "the cluster firewall's nftables table (/etc/nftables.d/provisioner-cluster.nft)"
NAMES_REACH = f"{UNIT}, {NGINX} and {PROM}"

_REACH_PREFIX: tuple[tuple[str, str], ...] = (
    ("vllm_cluster.extra_args", f"{UNIT} (ExecStart=)"),
    ("vllm_cluster.model", NAMES_REACH),
    ("vllm_cluster.served_model_name", NAMES_REACH),
    ("vllm_cluster", UNIT),
    ("vllm_env_extra", ENVF),
    ("vllm_api_key", ENVF),
    ("vllm_hf_token", ENVF),
    ("nccl_", NCCL),
    ("aws_ofi_nccl_dir", NCCL),
    ("efa_libfabric_dir", NCCL),
    ("bootstrap_interface", NCCL),
    ("ib_hcas", NCCL),
    ("monitoring_", PROM),
    ("serving_lb_", NGINX),
    ("vllm_client_networks", NFT),
    ("cluster_firewall_", NFT),
    ("ansible_host", f"{UNIT}, {ENVF}, {NFT}, {NGINX} and {PROM}"),
    ("vllm_host_ip", f"{UNIT}, {ENVF} and {NFT}"),
    ("imex_address", "IMEX's nodes_config.cfg"),
    ("vllm_", f"{UNIT} and {ENVF}"),
    ("inventory_hostname", f"every rendered file's header, {PROM} (host label) and {NGINX}"),
    ("(group name)", f"{UNIT} (Description=), {ENVF} and {PROM} (cluster label) when it is a cluster"),
)


def reach(var: str) -> str:
    """The rendered file(s) a variable (a dotted path: vllm_cluster.extra_args[2]) reaches."""
    for prefix, where in _REACH_PREFIX:
        if var == prefix or var.startswith(prefix):
            return where
    return "the files the roles render from it (Ansible templates and task arguments)"


def describe_control(s: str) -> str:
    m = CONTROL_RE.search(s)
    assert m is not None
    c = m.group(0)
    name = _NAMES.get(c, "a control character")
    return f"{name} (U+{ord(c):04X}) at character {m.start() + 1} of {show(s)}"


def _walk(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, text) for every string inside `value`: mapping keys and values, list items. Vault values are skipped
    (their plain text is not the rules' to read)."""
    if is_vaulted(value):
        return
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(k, str):
                yield f"{path} (key)", k
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")


def _control_in(var: str, text: str) -> bool:
    if var.split(".")[0].split("[")[0] in MULTILINE_VARS:
        text = text.replace("\r\n", "").replace("\n", "")
    return CONTROL_RE.search(text) is not None


def _same(a: Any, b: Any) -> bool:
    return not is_vaulted(a) and not is_vaulted(b) and type(a) is type(b) and a == b


def _where_set(fleet: Fleet) -> Iterator[tuple[str | None, str | None, str, Any]]:
    """(group, host, var, value): each group's own variables once, then each host's variables that none of its
    groups set to the same value (a value set on a group is reported once, on the group)."""
    for g in sorted(fleet.group_vars):
        for k, v in fleet.group_vars[g].items():
            yield g, None, str(k), v
    for h in fleet.hosts.values():
        for k, v in h.vars.items():
            if any(_same(fleet.group_vars.get(g, {}).get(k), v) for g in (*h.groups, "all")):
                continue
            yield None, h.name, str(k), v


@rule("TXT001", "a control character in a name or value that reaches a rendered file")
def control_characters(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Control characters in a host name, a group name or any variable: a newline in a systemd argument, an env
    file line, nccl.conf, nginx, Prometheus YAML or nftables adds directives (ExecStartPost=, a second
    VLLM_API_KEY, a server {} block, a remote_write, a firewall rule)."""
    fix = "control characters are refused in every inventory and extra-var value: remove it"
    for g in sorted(fleet.groups):
        if CONTROL_RE.search(g):
            yield Finding("TXT001", "error", f"the group name holds {describe_control(g)}: it reaches "
                          f"{reach('(group name)')}; {fix}", group=g, var="(group name)")
    for name in fleet.hosts:
        if CONTROL_RE.search(name):
            yield Finding("TXT001", "error", f"the host name holds {describe_control(name)}: it reaches "
                          f"{reach('inventory_hostname')}; {fix}", host=name, var="inventory_hostname")
    for group, host, var, value in _where_set(fleet):
        if CONTROL_RE.search(var):
            yield Finding("TXT001", "error", f"a variable name holds {describe_control(var)}; {fix}",
                          group=group, host=host, var=show(var))
            continue
        for path, text in _walk(value, var):
            if _control_in(path, text):
                yield Finding("TXT001", "error", f"{path} holds {describe_control(text)}: it would reach "
                              f"{reach(path)}; {fix}", group=group, host=host, var=var)


# --- TXT002: each format's delimiters --------------------------------------------------------------------------
_MODEL_RE = re.compile(r"[A-Za-z0-9_./:@+-]+")
_CLUSTER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_PATH_RE = re.compile(r"/[A-Za-z0-9_./@+-]*")
_UNIT_NAME_RE = re.compile(r"[A-Za-z0-9_.@:\\-]+")
_ACCOUNT_RE = re.compile(r"[a-z_][a-z0-9_-]*\$?")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_PORT_RE = re.compile(r"[0-9]{1,5}(-[0-9]{1,5})?")
_PROM_DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")
_NGINX_TIME = re.compile(r"([0-9]+(ms|s|m|h|d|w|M|y)?)+( ([0-9]+(ms|s|m|h|d|w|M|y)?)+)?")
_DURATION_SUFFIXES = ("_interval", "_timeout", "_for", "_window")
_LINE_DELIMS = set("\"'\\")  # an unquoted KEY=VALUE line of nccl.conf, repeated in the EnvironmentFile
_NGINX_DELIMS = set(";{}\"'#\\")
_YAML_DELIMS = set("'\"#{}[],&*!|>`\\")


def _is_template(v: Any) -> bool:
    return isinstance(v, str) and "{{" in v


def _address(v: str) -> bool:
    try:
        ipaddress.ip_address(v)
        return True
    except ValueError:
        return _HOSTNAME_RE.fullmatch(v) is not None


def _network(v: str) -> bool:
    try:
        ipaddress.ip_network(v, strict=False)
        return True
    except ValueError:
        return False


def _delims(chars: set[str]) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        bad = sorted({c for c in v if c in chars})
        return f"holds {' '.join(repr(c) for c in bad)}" if bad else None

    return check


def _pattern(rx: re.Pattern[str], what: str) -> Callable[[str], str | None]:
    return lambda v: None if rx.fullmatch(v) else f"is not {what}"


_MODEL_CHECK = _pattern(_MODEL_RE, "a model name (letters, digits and . _ / : @ + -)")
_PORT_CHECK = _pattern(_PORT_RE, "a port or a port range (32768-60999)")


def _ADDRESS_CHECK(v: str) -> str | None:  # noqa: N802 (a check, named like the others)
    return None if _address(v) else "is not an IP address or a host name"


def _NETWORK_CHECK(v: str) -> str | None:  # noqa: N802
    return None if _network(v) else "is not an IP address or network (CIDR)"


def _YAML_CHECK(v: str) -> str | None:  # noqa: N802
    return _delims(_YAML_DELIMS)(v) or ("holds ': ' (a YAML key)" if ": " in v or v.endswith(":") else None)


#: top-level variable -> (which strings inside it to check: "value" = the value / every list item, "keys", "values"
#: = a mapping's keys or values), the check, the format it reaches.
_FIELDS: dict[str, tuple[str, Callable[[str], str | None], str]] = {
    "ansible_host": ("value", _ADDRESS_CHECK, "an address"),
    "vllm_host_ip": ("value", _ADDRESS_CHECK, "an address"),
    "imex_address": ("value", _ADDRESS_CHECK, "an address"),
    "vllm_client_networks": ("value", _NETWORK_CHECK, "an nftables set element"),
    "cluster_firewall_member_addresses": ("value", _NETWORK_CHECK, "an nftables set element"),
    "cluster_firewall_lb_addresses": ("value", _NETWORK_CHECK, "an nftables set element"),
    "cluster_firewall_domain_addresses": ("value", _NETWORK_CHECK, "an nftables set element"),
    "cluster_firewall_member_extra_ports": ("value", _PORT_CHECK, "an nftables port"),
    "cluster_firewall_domain_ports": ("value", _PORT_CHECK, "an nftables port"),
    "cluster_firewall_ray_ports": ("value", _PORT_CHECK, "an nftables port"),
    "cluster_firewall_ssh_ports": ("value", _PORT_CHECK, "an nftables port"),
    "cluster_firewall_ephemeral_ports": ("value", _PORT_CHECK, "an nftables port"),
    "cluster_firewall_table": ("value", _pattern(_LABEL_NAME_RE, "an nftables table name"), "nftables"),
    "nccl_extra": ("values", _delims(_LINE_DELIMS), "an unquoted nccl.conf / EnvironmentFile line"),
    "aws_ofi_nccl_dir": ("value", _pattern(_PATH_RE, "an absolute path of plain characters"),
                         "an unquoted nccl.conf / EnvironmentFile line"),
    "efa_libfabric_dir": ("value", _pattern(_PATH_RE, "an absolute path of plain characters"),
                          "an unquoted EnvironmentFile line"),
    "vllm_venv": ("value", _pattern(_PATH_RE, "an absolute path of plain characters"), "a systemd ExecStop= line"),
    "vllm_home": ("value", _pattern(_PATH_RE, "an absolute path of plain characters"), "a systemd unit"),
    "vllm_cache_dir": ("value", _pattern(_PATH_RE, "an absolute path of plain characters"),
                       "an EnvironmentFile line"),
    "vllm_env_file": ("value", _pattern(_PATH_RE, "an absolute path of plain characters"), "a systemd unit"),
    "vllm_libexec_dir": ("value", _pattern(_PATH_RE, "an absolute path of plain characters"), "a systemd unit"),
    "vllm_unit_dir": ("value", _pattern(_PATH_RE, "an absolute path of plain characters"), "a systemd unit"),
    "vllm_after_units": ("value", _pattern(_UNIT_NAME_RE, "a systemd unit name"), "a systemd After= line"),
    "vllm_user": ("value", _pattern(_ACCOUNT_RE, "a user name"), "a systemd User= line"),
    "vllm_group": ("value", _pattern(_ACCOUNT_RE, "a group name"), "a systemd Group= line"),
    "monitoring_external_labels": ("keys", _pattern(_LABEL_NAME_RE, "a Prometheus label name"), "Prometheus YAML"),
    "serving_lb_models": ("value", _MODEL_CHECK, "an nginx string"),
    "serving_lb_default_model": ("value", _MODEL_CHECK, "an nginx string"),
    "serving_lb_model_ports": ("keys", _MODEL_CHECK, "an nginx string"),
}


def _strings(value: Any, how: str, var: str) -> Iterator[tuple[str, str]]:
    if how == "value":
        if isinstance(value, str):
            yield var, value
        elif isinstance(value, (list, tuple)):
            yield from ((f"{var}[{i}]", x) for i, x in enumerate(value) if isinstance(x, str))
    elif isinstance(value, Mapping):
        for k, v in value.items():
            if how == "keys" and isinstance(k, str):
                yield f"{var} key {k!r}", k
            elif how == "values" and isinstance(v, str):
                yield f"{var}.{k}", v


def _check_var(var: str, value: Any) -> Iterator[tuple[str, str, str]]:
    """(path, problem, format) for each string of `var` that holds its format's delimiters."""
    if is_vaulted(value):
        return
    spec = _FIELDS.get(var)
    if spec is None and var.startswith("monitoring_") and var.endswith(_DURATION_SUFFIXES) and isinstance(value, str):
        spec = ("value", _pattern(_PROM_DURATION, "a Prometheus duration (15s, 1m30s)"), "a Prometheus duration")
    if spec is None and var.startswith("serving_lb_") and var.endswith("_timeout") and isinstance(value, str):
        spec = ("value", _pattern(_NGINX_TIME, "an nginx time (60s, 5m)"), "an nginx time")
    if spec is None and var.startswith("serving_lb_") and isinstance(value, str):
        spec = ("value", _delims(_NGINX_DELIMS), "an nginx directive")
    if spec is None and var.startswith("monitoring_") and isinstance(value, str):
        spec = ("value", _YAML_CHECK, "a Prometheus YAML scalar")
    if spec is None:
        return
    how, check, fmt = spec
    for path, text in _strings(value, how, var):
        if not text or _is_template(text) or CONTROL_RE.search(text):
            continue  # "" is unset; a template resolves later (the templates escape it); TXT001 reports controls
        problem = check(text)
        if problem:
            yield path, problem, fmt


def value_problems(var: str, value: Any) -> list[str]:
    """TXT001/TXT002's verdict on one variable outside an inventory (a command's `--set NAME=VALUE`): one line per
    problem, [] when the value may reach its file. Pure."""
    out = [f"{path} holds {describe_control(text)}" for path, text in _walk(value, var) if _control_in(path, text)]
    out += [f"{path} {problem} ({fmt})" for path, problem, fmt in _check_var(var, value)]
    return out


def _cluster_names(vc: Any) -> Iterator[tuple[str, str]]:
    if not isinstance(vc, Mapping):
        return
    for key in ("model", "served_model_name"):
        v = vc.get(key)
        if isinstance(v, str):
            yield f"vllm_cluster.{key}", v
        elif isinstance(v, (list, tuple)):
            yield from ((f"vllm_cluster.{key}[{i}]", x) for i, x in enumerate(v) if isinstance(x, str))


@rule("TXT002", "a value holds a delimiter of the file format it reaches")
def format_delimiters(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Per variable, what its format cannot hold unquoted: a cluster (group) name or model name outside plain
    characters (nginx strings, systemd specifiers), addresses and networks that are not addresses (nftables sets,
    nginx `server`), quotes/backslashes in nccl.conf lines, nginx delimiters in serving_lb_*, YAML syntax in
    monitoring_* scalars, a Prometheus label name that is not one, unit paths and accounts with spaces or `;`."""
    for name, c in sorted(fleet.clusters.items()):
        if not CONTROL_RE.search(name) and not _CLUSTER_RE.fullmatch(name):
            yield Finding("TXT002", "error", f"the cluster group name {show(name)} is not plain (letters, digits, "
                          f"_ . -): it reaches {reach('(group name)')}; rename the group", group=name,
                          var="(group name)")
        vc = fleet.group_vars.get(name, {}).get("vllm_cluster", c.settings)
        for path, text in _cluster_names(vc):
            if CONTROL_RE.search(text) or _is_template(text):
                continue
            problem = _MODEL_CHECK(text)
            if problem or text.startswith(("~", "-")):
                yield Finding("TXT002", "error", f"{path} = {show(text)} {problem or 'starts with ~ or -'}: it "
                              f"reaches {reach(path)} (nginx map keys, unit Description=); use the plain model "
                              "name", group=name, var=path.split("[")[0])
    for group, host, var, value in _where_set(fleet):
        for path, problem, fmt in _check_var(var, value):
            yield Finding("TXT002", "error", f"{path} {problem}: the value lands in {fmt} in {reach(var)}, where "
                          "it would change the file's shape; fix the value", group=group, host=host, var=var)
