"""Roles that would do nothing on any host of a run, so `provision run|drift` can leave them out by tag.

Each gate mirrors the `when` the role (or its play entry) puts around all of its tasks. A value this module cannot
decide (a Jinja expression, an unknown GPU model, an extra var that sets it) counts as "the role acts": the gate
only ever removes roles that would skip every task anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from provisioner import catalog, plan
from provisioner.model import Fleet, Host

# role tag (the play's role entry carries it) -> the variables its `when` reads
GATED: Mapping[str, tuple[str, ...]] = {
    "nvlsm": ("gpu_model", "gpu_needs_nvlsm"),
    "fabric_manager": ("gpu_model", "gpu_needs_fabric_manager"),
    "imex": ("gpu_model", "gpu_needs_imex"),
    "infiniband": ("fabric",),
    "efa": ("fabric",),
    "vllm": ("vllm_cluster",),
}
_TRUE = {"true", "yes", "on", "1", "y", "t"}
_FALSE = {"false", "no", "off", "0", "n", "f", ""}


class Unknown(Exception):
    """A deciding value that only Ansible can resolve."""


def _bool(value: Any) -> bool:
    """Ansible's `| bool` for plain values; Unknown for anything templated."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value == 1
    if isinstance(value, str) and "{" not in value:
        if value.strip().lower() in _TRUE:
            return True
        if value.strip().lower() in _FALSE:
            return False
    raise Unknown(repr(value))


def _needs(host: Host, flag: str, catalog_field: str) -> bool:
    explicit = host.get(f"gpu_needs_{flag}")
    if explicit is not None:
        return _bool(explicit)
    model = host.get("gpu_model")
    if not isinstance(model, str) or "{" in model:
        raise Unknown(repr(model))
    spec = catalog.gpus().get(model)
    # the role's defaults: `__<role>_gpu_models[gpu_model] | default(false)`
    return bool(getattr(spec, catalog_field)) if spec is not None else False


def _fabric(host: Host) -> str:
    value = host.get("fabric", "infiniband")
    if not isinstance(value, str) or "{" in value:
        raise Unknown(repr(value))
    return value


def acts(role: str, fleet: Fleet, host: Host) -> bool:
    """Whether GATED `role` acts on `host` (Unknown when only Ansible can decide)."""
    if role == "nvlsm":
        return _needs(host, "nvlsm", "nvlsm")
    if role == "fabric_manager":
        return _needs(host, "fabric_manager", "fabric_manager")
    if role == "imex":
        return _needs(host, "imex", "imex")
    if role == "infiniband":
        return _fabric(host) != "efa"
    if role == "efa":
        return _fabric(host) == "efa"
    if role == "vllm":
        return plan.cluster_of(fleet, host.name) is not None
    if role == "alerting":  # playbooks/alerting.yml: only where the inventory has a monitoring host
        return bool(fleet.groups.get("monitoring"))
    raise KeyError(role)


def idle_roles(fleet: Fleet, hosts: Iterable[str], extravars: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The tags of GATED roles that act on none of `hosts` (sorted). Empty when no host is given or a host is not
    in `fleet`; a role whose deciding variables `extravars` sets is never idle."""
    names = list(hosts)
    if not names or any(n not in fleet.hosts for n in names):
        return ()
    overridden = set(extravars or ())
    idle = []
    for role, deciding in GATED.items():
        if overridden.intersection(deciding):
            continue
        try:
            if not any(acts(role, fleet, fleet.hosts[n]) for n in names):
                idle.append(role)
        except Unknown:
            continue
    return tuple(sorted(idle))
