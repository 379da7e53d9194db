"""Split one run's hosts into shards, one per execution node (`plan`), and what each shard's worker needs to reach its
hosts (`connection`). Pure: no I/O. A vLLM cluster, an NVLink domain and a `rack` are never split across shards."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from provisioner.errors import UsageError

if TYPE_CHECKING:
    from provisioner.model import Fleet

#: The inventory group whose hosts may run shards (`provision run|drift --exec-node NAME`).
EXEC_GROUP = "execution_nodes"
#: Host variables that keep hosts in one shard (besides vLLM cluster membership).
TOGETHER_VARS = ("nvlink_domain", "rack")
#: ssh options naming files the worker needs (copied into the shard's private data dir, the option rewritten).
_FILE_OPTS = ("userknownhostsfile", "globalknownhostsfile")
#: file names these options take that are no file to carry (ssh reads nothing from them)
_NO_FILE = ("/dev/null", "none")
CONNECTION_VARS = ("ansible_ssh_private_key_file", "ansible_ssh_common_args", "ansible_ssh_extra_args")


#: Host variable: how many shards (ansible-playbook processes) an execution node runs at once (default: the role's).
SHARDS_VAR = "execution_node_shards"


@dataclass(frozen=True)
class Shard:
    node: str  # the execution node (an inventory host of group execution_nodes)
    hosts: tuple[str, ...]  # the targeted hosts it runs, sorted
    units: tuple[str, ...]  # why these hosts are together: "cluster vllm_pp", "rack r1", "host node07"
    name: str = ""  # the node, or NODE-N when the node runs several shards (its run dir and job names)

    @property
    def label(self) -> str:
        return self.name or self.node


def shards_per_node(fleet: Fleet, node: str) -> int:
    """`execution_node_shards` of the node (one ansible-playbook process per shard; its serial main loop bounds the
    hosts one shard drifts in time, so a node with many cores runs several)."""
    from provisioner.defaults import role_default

    v = fleet.hosts[node].get(SHARDS_VAR, role_default("execution_node", SHARDS_VAR) or 1)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise UsageError(f"host {node} (group {EXEC_GROUP}): {SHARDS_VAR} must be a whole number >= 1, got {v!r}",
                         path=str(fleet.source))
    return v


def exec_nodes(fleet: Fleet, names: Iterable[str]) -> list[str]:
    """The --exec-node names checked against the inventory (comma lists allowed, order kept, duplicates dropped)."""
    out: list[str] = []
    for raw in names:
        for name in filter(None, (n.strip() for n in raw.split(","))):
            if name in out:
                continue
            host = fleet.hosts.get(name)
            if host is None:
                raise UsageError(f"--exec-node {name}: no such host in the inventory", path=str(fleet.source))
            if EXEC_GROUP not in host.groups:
                raise UsageError(f"--exec-node {name}: host {name} is not in group {EXEC_GROUP} (add it there, "
                                 f"and set it up with `provision run --limit {name}`)", path=str(fleet.source))
            out.append(name)
    return out


def _units(fleet: Fleet, targeted: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Targeted hosts in groups that must stay together (union of shared cluster / NVLink domain / rack)."""
    parent = {h: h for h in targeted}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    labels: dict[str, list[str]] = {h: [] for h in targeted}
    keys: dict[str, list[str]] = {}
    for h in targeted:
        host = fleet.hosts.get(h)
        for c in fleet.cluster_of(h):
            keys.setdefault(f"cluster {c}", []).append(h)
        for var in TOGETHER_VARS:
            v = host.get(var) if host is not None else None
            if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v):
                keys.setdefault(f"{var.replace('_', ' ')} {v}", []).append(h)
    for label, members in keys.items():
        for m in members[1:]:
            parent[find(m)] = find(members[0])
        for m in members:
            labels[m].append(label)
    groups: dict[str, list[str]] = {}
    for h in targeted:
        groups.setdefault(find(h), []).append(h)
    out = []
    for members in groups.values():
        why = sorted({lbl for m in members for lbl in labels[m]}) or [f"host {members[0]}"]
        out.append((", ".join(why), tuple(sorted(members))))
    return out


def plan(fleet: Fleet, targeted: Sequence[str], nodes: Sequence[str]) -> list[Shard]:
    """`execution_node_shards` shards per execution node (slots taken round-robin across the nodes): the units
    (never split) placed largest first on the least loaded slot (ties: the earlier slot), so the shards are as even as
    the units allow. Slots left without hosts get no shard."""
    if not nodes:
        raise UsageError("sharding needs at least one --exec-node")
    both = sorted(set(nodes) & set(targeted))
    if both:
        raise UsageError(f"{', '.join(both)}: an execution node cannot also be a target of its own run (narrow "
                         "--limit, or provision it in a run without --exec-node)", path=str(fleet.source))
    per = {n: shards_per_node(fleet, n) for n in nodes}
    slots = [(n, i) for i in range(max(per.values())) for n in nodes if i < per[n]]
    units = sorted(_units(fleet, targeted), key=lambda u: (-len(u[1]), u[1][0]))
    load: dict[tuple[str, int], list[tuple[str, tuple[str, ...]]]] = {s: [] for s in slots}
    for unit in units:
        slot = min(slots, key=lambda s: (sum(len(u[1]) for u in load[s]), slots.index(s)))
        load[slot].append(unit)
    return [Shard(node=n, hosts=tuple(sorted(h for u in us for h in u[1])), units=tuple(u[0] for u in us),
                  name=f"{n}-{i + 1}" if per[n] > 1 else "")
            for (n, i), us in sorted(load.items(), key=lambda kv: (nodes.index(kv[0][0]), kv[0][1])) if us]


@dataclass(frozen=True)
class Connection:
    """How a shard's worker reaches its hosts: the controller files to carry (worker-relative name -> controller
    path) and the connection variables to set as extra vars, rewritten to the carried copies."""

    files: tuple[tuple[str, str], ...]
    extravars: tuple[tuple[str, str], ...]


def connection(fleet: Fleet, hosts: Sequence[str], worker_dir: str) -> Connection:
    """The shard's SSH key and known_hosts files, carried to the worker (`<worker_dir>/connection/`). Extra vars are
    the same for every host of a shard, so each connection variable must be the same on all its hosts."""
    files: dict[str, str] = {}
    extravars: list[tuple[str, str]] = []
    for var in CONNECTION_VARS:
        values = {h: fleet.hosts[h].get(var) for h in hosts}
        distinct = {str(v) for v in values.values() if v not in (None, "")}
        if not distinct:
            continue
        unset = sorted(h for h, v in values.items() if v in (None, ""))
        if len(distinct) > 1 or unset:
            items = sorted(values.items())
            a = items[0][0]
            b = next(h for h, v in items if str(v) != str(items[0][1]))
            raise UsageError(f"{var} differs between hosts {a} and {b} of one shard: a shard's worker carries one "
                             f"value (set it on a group, or shard those hosts apart with --limit)",
                             path=str(fleet.source))
        value = distinct.pop()
        if var == "ansible_ssh_private_key_file":
            files["connection/ssh_key"] = value
            extravars.append((var, f"{worker_dir}/connection/ssh_key"))
            continue

        extravars.append((var, _carry_known_hosts(value, files, worker_dir)))
    return Connection(files=tuple(sorted(files.items())), extravars=tuple(extravars))


def _carry_known_hosts(args: str, files: dict[str, str], worker_dir: str) -> str:
    """`args` (ssh options) with every file of `-o UserKnownHostsFile=`/`GlobalKnownHostsFile=` (a whitespace list,
    as ssh reads it; `~` expanded for the controller) carried into `files` and named by its copy on the worker;
    `/dev/null` and `none` stay as they are. StrictHostKeyChecking passes unchanged: the worker's ssh judges the keys
    exactly as the controller's would. Arguments that do not split (unbalanced quotes) pass unchanged."""
    import os

    try:
        toks = shlex.split(args)
    except ValueError:
        return args
    changed = False
    for i, tok in enumerate(toks):
        prefix = ""
        if tok.startswith("-o") and len(tok) > 2:
            prefix, tok = "-o", tok[2:]
        elif not (i > 0 and toks[i - 1] == "-o"):
            continue
        m = re.match(r"(?i)\s*(\w+)(\s*=\s*|\s+)(.*)$", tok, re.S)
        if not m or m.group(1).lower() not in _FILE_OPTS:
            continue
        out = []
        for f in m.group(3).split():
            if f.lower() in _NO_FILE:
                out.append(f)
                continue
            name = f"connection/{m.group(1).lower()}-{len(files)}"
            files[name] = os.path.expanduser(f)
            out.append(f"{worker_dir}/{name}")
        toks[i] = f"{prefix}{m.group(1)}={' '.join(out)}"
        changed = True
    return shlex.join(toks) if changed else args
