"""What each host of an inventory fetches, per OS release: apt packages, pip requirements, files, with the role.

The expressions are the roles' own (catalog/bundle.yaml), rendered by Ansible's templar with what a play would see:
the roles' defaults, the host's inventory variables over them, the roles' vars/<Distribution>.yml and vars/main.yml
over those, and the release's facts. Which roles act on a host: the play's group and provisioner.role_gates.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from provisioner import role_gates
from provisioner.catalog import CATALOG_DIR, SAFE_LOADER
from provisioner.errors import UsageError
from provisioner.model import Fleet, Host
from provisioner.paths import ROLES

#: The gpu_nodes play's roles in play order (their defaults are visible to each other, as in the play).
PLAY_ROLES = ("site_trust", "nvidia_driver", "nvidia_persistenced", "nvlsm", "fabric_manager", "imex", "cuda_nccl",
              "infiniband", "efa", "nccl_tuning", "cluster_firewall", "vllm", "vllm_launch", "serving_lb",
              "monitoring", "node_health", "alertmanager", "bundle_mirror")


@dataclass(frozen=True, order=True)
class Need:
    """One thing a host fetches: kind apt|pip|file, name, version ("" = any), the role, the release."""

    kind: str
    name: str
    version: str
    role: str
    release: str
    url: str = ""  # files: where the inventory says it is
    sha256: str = ""  # files: the inventory's pin


@functools.cache
def catalog() -> dict[str, Any]:
    path = CATALOG_DIR / "bundle.yaml"
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)  # noqa: S506
    if not isinstance(data, dict) or "roles" not in data or "releases" not in data:
        raise UsageError("needs `roles` and `releases`", path=str(path))
    return data


def releases() -> tuple[str, ...]:
    return tuple(sorted(catalog()["releases"]))


def release(name: str) -> Mapping[str, Any]:
    rel = catalog()["releases"].get(name)
    if rel is None:
        raise UsageError(f"unknown release {name!r} (known: {', '.join(releases())})")
    return rel


def _yaml(path: Any) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)  # noqa: S506
    return data if isinstance(data, dict) else {}


@functools.cache
def _role_layers(distribution: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(defaults of every play role, vars of every play role for `distribution`), merged in play order."""
    defaults: dict[str, Any] = {}
    role_vars: dict[str, Any] = {}
    for role in PLAY_ROLES:
        defaults.update(_yaml(ROLES / role / "defaults" / "main.yml"))
        role_vars.update(_yaml(ROLES / role / "vars" / f"{distribution}.yml"))
        role_vars.update(_yaml(ROLES / role / "vars" / "main.yml"))
    return defaults, role_vars


def _trusted(value: Any) -> Any:
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, Mapping):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_trusted(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _acts(role: str, gate: str | None, fleet: Fleet, host: Host) -> bool:
    if gate is None:
        return True
    try:
        return role_gates.acts(gate, fleet, host)
    except role_gates.Unknown:
        return True  # only Ansible can decide: the bundle carries it


def _templar(fleet: Fleet, host: Host, rel_name: str, kernel: str) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    rel = release(rel_name)
    facts = {**rel["facts"], "kernel": kernel or "KERNEL-UNKNOWN"}
    defaults, role_vars = _role_layers(str(rel["facts"]["distribution"]))
    variables = _trusted({**defaults, **_plain(dict(host.vars)), **role_vars})
    variables.update({"ansible_facts": facts, "inventory_hostname": host.name,
                      "groups": {g: list(ms) for g, ms in fleet.groups.items()}, "group_names": list(host.groups),
                      "role_path": str(ROLES / "vllm")})
    return Templar(loader=DataLoader(), variables=variables)


def _render(templar: Any, expr: str, what: str, fleet: Fleet) -> Any:
    from ansible.errors import AnsibleError

    try:
        return _plain(templar.template(_trusted(expr)))
    except AnsibleError as exc:
        raise UsageError(f"{what}: cannot resolve: {str(exc).splitlines()[0]}", path=str(fleet.source)) from None


#: The NVIDIA repository settings the bundle fetches from, as the nvidia_driver role resolves them.
REPO_VARS = ("nvidia_repo_url", "nvidia_repo_key_url", "nvidia_repo_key_fingerprints", "nvidia_repo_suite",
             "nvidia_repo_components")


def repo_settings(fleet: Fleet, host: Host, rel_name: str) -> dict[str, Any]:
    """`host`'s NVIDIA repository variables on release `rel_name`, rendered as the role renders them."""
    t = _templar(fleet, host, rel_name, "")
    return {v: _render(t, "{{ " + v + " }}", f"host {host.name}, variable {v}", fleet) for v in REPO_VARS}


def host_needs(fleet: Fleet, host: Host, rel_name: str, kernel: str = "") -> list[Need]:
    """What `host` fetches on release `rel_name` (sorted). `kernel`: the nodes' kernel (linux-headers-<kernel>)."""
    templar = _templar(fleet, host, rel_name, kernel)
    out: list[Need] = []
    for role, spec in catalog()["roles"].items():
        if spec.get("group") not in host.groups or not _acts(role, spec.get("gate"), fleet, host):
            continue
        for kind in ("apt", "pip", "files"):
            for expr in spec.get(kind, []):
                items = _render(templar, expr, f"host {host.name}, role {role}: what it installs", fleet)
                out.extend(_needs_of(kind, items, role, rel_name, host))
    return sorted(set(out))


def _needs_of(kind: str, items: Any, role: str, rel: str, host: Host) -> Iterable[Need]:
    if isinstance(items, Mapping):
        items = [items]
    if not isinstance(items, list):
        raise UsageError(f"host {host.name}, role {role}: expected a list of {kind} items, got {type(items).__name__}")
    for item in items:
        if kind == "files":
            url, sha = str(item.get("url", "")), str(item.get("sha256", "")).lower()
            if not url:
                raise UsageError(f"host {host.name}, role {role}: efa_installer_url is empty (the bundle needs "
                                 "the installer's URL to carry it)")
            yield Need("file", url.rstrip("/").rsplit("/", 1)[-1], str(item.get("version", "")), role, rel, url, sha)
        elif kind == "pip":
            name, _, version = str(item).partition("==")
            yield Need("pip", name.strip(), version.strip(), role, rel)
        else:
            name, _, version = str(item).partition("=")
            yield Need("apt", name.strip(), version.strip(), role, rel)


def fleet_needs(fleet: Fleet, rels: Iterable[str], kernel: str = "") -> dict[Need, tuple[str, ...]]:
    """Every need of the inventory -> the hosts that need it."""
    out: dict[Need, list[str]] = {}
    for rel in rels:
        for name in sorted(fleet.hosts):
            for need in host_needs(fleet, fleet.hosts[name], rel, kernel):
                out.setdefault(need, []).append(name)
    return {n: tuple(hs) for n, hs in sorted(out.items())}
