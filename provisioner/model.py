"""The typed, immutable fleet model every stage works on (built by `provisioner.inventory.load_fleet`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Host:
    """One inventory host with its merged variables (group_vars/host_vars as Ansible merges them)."""

    name: str
    address: str  # ansible_host, or the inventory name
    groups: tuple[str, ...]  # every group the host is in (transitively), sorted, without "all"
    vars: Mapping[str, Any] = field(repr=False)  # merged variables, read-only

    @property
    def is_gpu_node(self) -> bool:
        return "gpu_nodes" in self.groups

    def get(self, key: str, default: Any = None) -> Any:
        return self.vars.get(key, default)

    # Typed shortcuts for the hardware contract. They return None when a value is missing or ill-typed:
    # the rules (provisioner/rules) report those; everything downstream runs only on a valid fleet.
    @property
    def gpu_model(self) -> str | None:
        v = self.vars.get("gpu_model")
        return v if isinstance(v, str) else None

    @property
    def gpu_count(self) -> int | None:
        v = self.vars.get("gpu_count")
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def fabric(self) -> str | None:
        v = self.vars.get("fabric")
        return v if isinstance(v, str) else None

    @property
    def ib_hcas(self) -> tuple[str, ...]:
        v = self.vars.get("ib_hcas")
        if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
            return tuple(v)
        return ()

    @property
    def efa_device_count(self) -> int | None:
        v = self.vars.get("efa_device_count")
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def efa_devices(self) -> tuple[str, ...]:
        v = self.vars.get("efa_devices")
        if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
            return tuple(v)
        return ()

    @property
    def nvlink_domain(self) -> str | None:
        """The NVL72 NVLink/IMEX domain this tray belongs to (trays with the same name form one domain)."""
        v = self.vars.get("nvlink_domain")
        return v if isinstance(v, str) and v else None

    @property
    def imex_address(self) -> str:
        """The address nodes_config.cfg lists for this tray (imex_address, else ansible_host)."""
        v = self.vars.get("imex_address")
        return v if isinstance(v, str) and v else self.address

    @property
    def bootstrap_interface(self) -> str | None:
        v = self.vars.get("bootstrap_interface")
        return v if isinstance(v, str) else None

    @property
    def node_rank(self) -> int | None:
        v = self.vars.get("node_rank")
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def ssh_port(self) -> int:
        v = self.vars.get("ansible_port", 22)
        return int(v) if str(v).isdigit() else 22

    @property
    def ssh_user(self) -> str | None:
        v = self.vars.get("ansible_user")
        return str(v) if v else None


@dataclass(frozen=True)
class Cluster:
    """A vLLM cluster: an inventory group whose group vars hold a `vllm_cluster` dict."""

    name: str  # the group name
    settings: Mapping[str, Any] = field(repr=False)  # vllm_cluster with defaults applied
    members: tuple[str, ...]  # host names, ordered by node_rank (unranked last, by name)

    @property
    def head(self) -> str | None:
        return self.members[0] if self.members else None

    def get(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)


@dataclass(frozen=True)
class Fleet:
    """Everything `load_fleet` read from one inventory source."""

    source: Path
    hosts: Mapping[str, Host]
    clusters: Mapping[str, Cluster]
    # group name -> that group's own vars (inline [g:vars] / YAML vars + group_vars/ files), before host merging;
    # used by rules that must tell "set on the group" from "set on a host"
    group_vars: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)
    # group name -> member host names (transitively, as Ansible's `groups` magic variable), "all" included
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    # the ansible-core InventoryManager `load_fleet` parsed (None otherwise): host patterns and --limit are resolved on
    # it (`inventory.limit_hosts`) instead of parsing the inventory again
    ansible_inventory: Any = field(default=None, repr=False, compare=False)

    @property
    def gpu_nodes(self) -> list[Host]:
        return [h for h in self.hosts.values() if h.is_gpu_node]

    def cluster_of(self, host: str) -> list[str]:
        """Names of the clusters `host` is a member of (normally zero or one)."""
        return list(self.clusters_by_host.get(host, ()))

    @cached_property
    def clusters_by_host(self) -> Mapping[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {}
        for c in self.clusters.values():
            for m in c.members:
                out.setdefault(m, []).append(c.name)
        return MappingProxyType({k: tuple(v) for k, v in out.items()})

    def head_of(self, cluster: Cluster) -> Host | None:
        return self.hosts.get(cluster.head) if cluster.head else None


def freeze(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))
