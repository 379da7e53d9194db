"""Environment passthrough rules (ENV0xx): `vllm_env_extra`, the free-form part of /etc/vllm/vllm.env."""

from __future__ import annotations

import re
from collections.abc import Iterable

from provisioner.model import Fleet
from provisioner.rules import Finding, rule
from provisioner.rules._util import show, type_name
from provisioner.rules.context import RuleContext
from provisioner.rules.nccl import MANAGED_KEYS as NCCL_MANAGED_KEYS

# Every key templates/vllm.env.j2 writes itself -> what to do instead (tests/unit/test_knobs.py checks it
# against the template). systemd's EnvironmentFile keeps the last assignment of a key, so a key in vllm_env_extra
# either overrides the suite's line or is overridden by it, depending on where the template writes it.
MANAGED_ENV: dict[str, str] = {
    "VLLM_HOST_IP": "set vllm_host_ip",
    "GLOO_SOCKET_IFNAME": "set bootstrap_interface",
    "VLLM_ENGINE_READY_TIMEOUT_S": "set vllm_engine_ready_timeout",
    "VLLM_NO_USAGE_STATS": "the suite always turns vLLM's usage statistics off",
    "DO_NOT_TRACK": "the suite always turns vLLM's usage statistics off",
    "HOME": "set vllm_home",
    "VLLM_CACHE_ROOT": "set vllm_cache_dir",
    "TORCHINDUCTOR_CACHE_DIR": "set vllm_cache_dir",
    "TRITON_CACHE_DIR": "set vllm_cache_dir",
    "VLLM_API_KEY": "set vllm_api_key (vault it: it is never logged)",
    "LD_LIBRARY_PATH": "set efa_libfabric_dir / aws_ofi_nccl_dir (fabric efa)",
}
# written on some fabrics only (elsewhere vllm_env_extra may set them)
MANAGED_ENV_ON: dict[str, tuple[str, ...]] = {"LD_LIBRARY_PATH": ("efa",), "FI_PROVIDER": ("efa",),
                                              "FI_EFA_FORK_SAFE": ("efa",)}
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@rule("ENV001", "vllm_env_extra malformed or sets a key the suite manages")
def vllm_env_extra(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """vllm_env_extra is a map of environment names to strings or numbers; it may not set a key vllm.env.j2 writes
    (VLLM_HOST_IP, HOME, VLLM_API_KEY, ...; LD_LIBRARY_PATH and FI_PROVIDER/FI_EFA_FORK_SAFE on fabric efa) nor any
    NCCL_* key: the NCCL lines of /etc/nccl.conf follow in the same file, and nccl_extra reaches both."""
    for h in fleet.hosts.values():
        extra = h.vars.get("vllm_env_extra")
        if extra is None:
            continue
        if not isinstance(extra, dict):
            yield Finding("ENV001", "error", f"vllm_env_extra = {show(extra)} is a {type_name(extra)}: expected a "
                          "map like {VLLM_CPU_KVCACHE_SPACE: '4'}", host=h.name, var="vllm_env_extra")
            continue
        fabric = h.vars.get("fabric")
        for k in sorted(extra, key=str):
            v = extra[k]
            if not (isinstance(k, str) and ENV_NAME_RE.fullmatch(k)):
                yield Finding("ENV001", "error", f"vllm_env_extra key {show(k)} is not an environment variable name "
                              "(letters, digits, _; not starting with a digit)", host=h.name, var="vllm_env_extra")
                continue
            if isinstance(v, (dict, list, tuple)) or v is None:
                yield Finding("ENV001", "error", f"vllm_env_extra.{k} = {show(v)} is a {type_name(v)}: expected a "
                              "string or number", host=h.name, var="vllm_env_extra")
                continue
            if k in MANAGED_ENV_ON and fabric not in MANAGED_ENV_ON[k]:
                continue
            if k in MANAGED_ENV:
                yield Finding("ENV001", "error", f"vllm_env_extra sets {k}, which vllm.env.j2 writes itself: the env "
                              f"file would hold two {k} lines and systemd keeps the last; remove vllm_env_extra.{k} "
                              f"({MANAGED_ENV[k]})", host=h.name, var="vllm_env_extra")
            elif k.startswith("NCCL_") or k in NCCL_MANAGED_KEYS:
                where = NCCL_MANAGED_KEYS.get(k)
                fix = f"set {where.split(' (')[0]}" if where else f"move it to nccl_extra ({k}: {show(v)})"
                yield Finding("ENV001", "error", f"vllm_env_extra sets {k}, a line of /etc/nccl.conf: vllm.env.j2 "
                              f"repeats those lines after vllm_env_extra (the later line wins); {fix}, which "
                              "reaches both files", host=h.name, var="vllm_env_extra")
