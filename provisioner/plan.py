"""The fleet plan: what every host gets, computed once from a Fleet and handed down as data.

`compute(fleet)` is the one function behind the play (plugins/action/provisioner_plan.py, run once at the top of
every playbook), `provision render` and `provision plan`, so the three cannot disagree. Per host: its vLLM cluster and
members, the exact `vllm serve` argv and unit list, the IMEX tray list; per cluster: head, port, members and the start
order; and the balancer/monitoring targets. `fleet_from_vars` builds the Fleet of a running play from what Ansible
resolved (each host's variables, the `groups` map): Ansible's own precedence decides every value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from provisioner import defaults
from provisioner.model import Cluster, Fleet, Host, freeze

PLAN_VERSION = 1
#: Roles whose defaults the plan reads (paths and watch settings of the units), in merge order.
PLAN_ROLES = ("nccl_tuning", "vllm", "vllm_launch")
WRAPPER = "vllm-group-run"
_SAFE_ARG = re.compile(r"[A-Za-z0-9_./:=,@+\-]+")  # an ExecStart= argument that needs no quoting
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # C0, DEL, C1, line/paragraph separators
#: Groups the suite gives a meaning of their own: never a vLLM cluster (docs/inventory.md).
STRUCTURAL_GROUPS = frozenset({"all", "ungrouped", "gpu_nodes", "vllm_clusters", "lb", "monitoring",
                               "execution_nodes"})
#: Connection variables the probes (paramiko) need to reach hosts the way Ansible does; other ansible_* are dropped.
ANSIBLE_KEEP = frozenset({
    "ansible_host", "ansible_port", "ansible_user", "ansible_ssh_user", "ansible_ssh_port",
    "ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_private_key_file",
    "ansible_private_key_file", "ansible_python_interpreter", "ansible_connection",
    "ansible_become", "ansible_become_user",
    "ansible_architecture",  # a hint the rules compare with the GPU model's cpu_arch (HW015)
})
#: Ansible's magic and per-run variables: not inventory data.
MAGIC_VARS = frozenset({
    "groups", "group_names", "hostvars", "inventory_hostname", "inventory_hostname_short", "playbook_dir",
    "play_hosts", "omit", "role_names", "environment", "vars",
    "provisioner_plan", "provisioner_plan_result",
})


def cluster_defaults() -> dict[str, Any]:
    """Every vllm_cluster key's default: `vllm_cluster_defaults` of roles/provisioner_plan (the one home)."""
    return dict(defaults.role_default("provisioner_plan", "vllm_cluster_defaults") or {})


def inventory_vars(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A host's variables without Ansible's magic ones, without gathered facts (also those injected as variables)
    and without ansible_* other than the connection settings."""
    facts = raw.get("ansible_facts")
    facts = facts if isinstance(facts, Mapping) else {}

    def keep(k: str) -> bool:
        if k in MAGIC_VARS or k in facts or k.removeprefix("ansible_") in facts:
            return False
        return not k.startswith("ansible_") or k in ANSIBLE_KEEP

    return {str(k): v for k, v in raw.items() if keep(str(k))}


def make_host(name: str, merged: Mapping[str, Any], groups: Iterable[str]) -> Host:
    return Host(name=name, address=str(merged.get("ansible_host") or name),
                groups=tuple(sorted(g for g in groups if g != "all")), vars=freeze(inventory_vars(merged)))


def make_cluster(name: str, raw: Any, members: Iterable[str], hosts: Mapping[str, Host]) -> Cluster:
    """A Cluster: `raw` (the group's vllm_cluster) over the defaults, members ordered by node_rank (unranked last)."""
    settings = cluster_defaults()
    if isinstance(raw, Mapping):
        settings.update(raw)

    def key(n: str) -> tuple[int, int, str]:
        r = hosts[n].node_rank if n in hosts else None
        return (0, r, n) if r is not None else (1, 0, n)

    return Cluster(name=name, settings=freeze(settings), members=tuple(sorted(members, key=key)))


def _cluster_size(host: Host) -> int | None:
    """How many hosts `host`'s cluster has in a valid inventory: TP x PP / the host's GPUs (rules CL003/CL004)."""
    vc, per_node = host.vars.get("vllm_cluster"), host.gpu_count
    if not isinstance(vc, Mapping) or not per_node:
        return None
    d = cluster_defaults()
    try:
        world = int(vc.get("tensor_parallel_size", d["tensor_parallel_size"])) * \
            int(vc.get("pipeline_parallel_size", d["pipeline_parallel_size"]))
    except (TypeError, ValueError):
        return None
    return world // per_node if world > 0 and world % per_node == 0 else None


def detect_clusters(hosts: Mapping[str, Host], groups: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Cluster group -> members, from resolved variables only (what a play can see). A host's cluster is a group
    holding it whose members all resolve the same `vllm_cluster`, of the cluster's size (TP x PP / gpu_count: a rack
    row inside the cluster is smaller, the parent of two replicas larger; when the size is unknown, the smallest),
    never one of the suite's own groups; equal candidates: the first name. Rule CL019 checks that this is the
    group whose own vars define vllm_cluster."""
    candidates: list[tuple[int, str, tuple[str, ...]]] = []
    for g, members in groups.items():
        if g in STRUCTURAL_GROUPS or not members:
            continue
        if any(m not in hosts or "vllm_cluster" not in hosts[m].vars for m in members):
            continue
        first = hosts[members[0]].vars["vllm_cluster"]
        if all(hosts[m].vars["vllm_cluster"] == first for m in members[1:]):
            candidates.append((len(members), g, tuple(members)))
    candidates.sort()
    by_host: dict[str, list[tuple[int, str]]] = {}  # host -> its candidate groups, smallest first
    for n, g, ms in candidates:
        for m in ms:
            by_host.setdefault(m, []).append((n, g))
    out: dict[str, list[str]] = {}
    taken: set[str] = set()
    for name, h in hosts.items():
        if "vllm_cluster" not in h.vars or name in taken:
            continue
        mine = by_host.get(name, [])
        size = _cluster_size(h)
        best = next((g for n, g in mine if n == size), None) if size else None
        if best is None and mine:
            best = mine[0][1]
        if best is not None:
            out[best] = list(groups[best])
            taken.update(out[best])
    return out


def fleet_from_vars(host_vars: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Sequence[str]],
                    source: str | Path = "") -> Fleet:
    """The Fleet of a running play: `host_vars` = each host's variables as Ansible resolved them (`hostvars.raw_get`,
    -e on top), `groups` = the play's `groups` (every host of the inventory, limits ignored)."""
    member_of: dict[str, list[str]] = {}
    for g, ms in groups.items():
        for m in ms:
            member_of.setdefault(m, []).append(g)
    hosts = {n: make_host(n, v, member_of.get(n, ())) for n, v in host_vars.items()}
    found = detect_clusters(hosts, groups)
    clusters = {g: make_cluster(g, hosts[ms[0]].vars.get("vllm_cluster"), ms, hosts) for g, ms in found.items()}
    # the group's own vllm_cluster as its members resolve it (rules that tell a group's value from a host's read it)
    group_vars = {g: freeze({"vllm_cluster": hosts[ms[0]].vars.get("vllm_cluster")}) for g, ms in found.items()}
    return Fleet(source=Path(source) if source else Path.cwd(), hosts=freeze(hosts), clusters=freeze(clusters),
                 group_vars=freeze(group_vars), groups=freeze({g: tuple(ms) for g, ms in groups.items()}))


# --- the plan -----------------------------------------------------------------------------------------------------


def _c_escape(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x80 else f"\\u{c:04x}"


def systemd_quote(arg: str) -> str:
    """One argument for an ExecStart= line: bare when plain, else double-quoted with C escapes (systemd unescapes
    them: a newline stays inside the argument); % and $ escaped for systemd's specifiers and variables."""
    s = str(arg).replace("%", "%%").replace("$", "$$")
    if _SAFE_ARG.fullmatch(s):
        return s
    return '"' + _CONTROL.sub(_c_escape, s.replace("\\", "\\\\").replace('"', '\\"')) + '"'


def unit_text(value: Any) -> str:
    """A value for free text in a unit file (Description=, a comment): one line (control characters shown as
    \\xNN), % doubled (systemd specifiers)."""
    return _CONTROL.sub(_c_escape, str(value).replace("%", "%%"))


def systemd_exec(argv: Sequence[str]) -> str:
    return " ".join(systemd_quote(a) for a in argv)


def settings_for(host: Host) -> dict[str, Any]:
    """The unit settings the plan uses for `host`: the plan roles' defaults, the host's variables on top."""
    v = defaults.role_defaults(*PLAN_ROLES)
    v.update({k: host.vars[k] for k in host.vars if k in v})
    return v


def cluster_of(fleet: Fleet, host: str) -> Cluster | None:
    names = fleet.cluster_of(host)
    return fleet.clusters[sorted(names)[0]] if names else None


def vllm_facts(fleet: Fleet, host: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Everything the vLLM templates and tasks need about `host`; None: not in a cluster. `variables`: the unit
    settings (paths, watch intervals; default `settings_for(host)`)."""
    from provisioner.vllm_args import serve_command

    cluster = cluster_of(fleet, host)
    if cluster is None:
        return None
    h = fleet.hosts[host]
    var = settings_for(h) if variables is None else variables
    s = cluster.settings
    members = list(cluster.members)
    head = fleet.hosts[members[0]]
    executor = str(s["executor"])
    is_head = h.name == head.name
    rank = h.node_rank if h.node_rank is not None else members.index(h.name)
    venv = str(var["vllm_venv"])
    port = int(s["port"])
    master_port = int(s["master_port"])
    head_address = str(head.get("vllm_host_ip") or head.address)
    host_ip = str(h.get("vllm_host_ip") or h.address)
    health_url = f"http://127.0.0.1:{port}/health"
    argv = serve_command(cluster, h, fleet, vllm=f"{venv}/bin/vllm")
    wrapper = ["/usr/bin/python3", f"{var['vllm_libexec_dir']}/{WRAPPER}"]
    exec_argv: list[str] = []
    units: list[dict[str, str]] = []
    unit_dir = str(var["vllm_unit_dir"])
    if executor == "ray":
        role = "head" if is_head else "ray-worker"
        ray = f"{venv}/bin/ray"
        gpus = str(h.gpu_count or 0)
        ray_port = int(var["vllm_ray_port"])
        if is_head:
            ray_argv = [ray, "start", "--block", "--head", f"--node-ip-address={host_ip}", f"--port={ray_port}",
                        f"--num-gpus={gpus}"]
            world = int(s["tensor_parallel_size"]) * int(s["pipeline_parallel_size"])
            exec_argv = [*wrapper, "--health-url", health_url, "--wait-ray-gpus", str(world),
                         "--ray-python", f"{venv}/bin/python", "--", *argv]
        else:
            ray_argv = [ray, "start", "--block", f"--address={head_address}:{ray_port}",
                        f"--node-ip-address={host_ip}", f"--num-gpus={gpus}"]
        units.append({"template": "vllm-ray.service.j2", "dest": f"{unit_dir}/vllm-ray.service",
                      "name": "vllm-ray.service"})
        ray_exec = systemd_exec(ray_argv)
    else:
        role = "head" if is_head else "worker"
        ray_exec = ""
        if is_head:
            peers = [str(fleet.hosts[m].get("vllm_host_ip") or fleet.hosts[m].address) for m in members[1:]]
            exec_argv = [*wrapper, "--health-url", health_url, "--misses", str(var["vllm_watch_misses"]),
                         "--interval", str(var["vllm_head_watch_interval"]),
                         *(["--peers", ",".join(peers), "--peer-port", str(port),
                            "--peer-interval", str(var["vllm_watch_interval"])] if peers else []),
                         "--", *argv]
        else:
            exec_argv = [*wrapper, "--head-addr", head_address, "--head-port", str(master_port),
                         "--misses", str(var["vllm_watch_misses"]),
                         "--interval", str(var["vllm_watch_interval"]),
                         "--join-timeout", str(var["vllm_join_timeout"]),
                         # the cluster's API port is free on a headless worker: its member /health for the head
                         "--serve-health", f"[{host_ip}]:{port}" if ":" in host_ip else f"{host_ip}:{port}",
                         "--", *argv]
    if exec_argv:
        template = "vllm-head.service.j2" if is_head else "vllm-worker.service.j2"
        units.append({"template": template, "dest": f"{unit_dir}/vllm.service", "name": "vllm.service"})
    return {
        "cluster": cluster.name,
        "executor": executor,
        "role": role,
        "rank": rank,
        "nnodes": len(members),
        "members": members,
        "head": head.name,
        "head_address": head_address,
        "host_ip": host_ip,
        "socket_ifname": h.bootstrap_interface or "",
        "port": port,
        "master_port": master_port,
        "drain_wait": int(s.get("drain_wait") or 0),
        "model": str(s.get("model", "")),
        "served_model_name": str(s.get("served_model_name") or s.get("model", "")),
        "argv": argv,
        "exec_argv": exec_argv,
        "exec_start": systemd_exec(exec_argv) if exec_argv else "",
        "ray_exec_start": ray_exec,
        "health_url": health_url,
        "units": units,
        # the same values for a unit file's free text (Description=, comments): one line, % doubled
        "text": {"cluster": unit_text(cluster.name), "host": unit_text(h.name), "head_address": unit_text(head_address),
                 "served_model_name": unit_text(s.get("served_model_name") or s.get("model", ""))},
    }


def imex_nodes(fleet: Fleet, host: str) -> list[str]:
    """The addresses nodes_config.cfg lists on `host`: every tray of its nvlink_domain (imex_address, else
    ansible_host), sorted by host name so every tray gets the same bytes; [] when the host runs no IMEX (its GPU
    model's catalog entry says imex: false) or names no domain (rule NVL001)."""
    from provisioner import catalog

    h = fleet.hosts[host]
    spec = catalog.gpu(h.gpu_model)
    if spec is None or not spec.imex or not h.nvlink_domain:
        return []
    return [t.imex_address for t in sorted(fleet.gpu_nodes, key=lambda t: t.name)
            if t.nvlink_domain == h.nvlink_domain and catalog.gpu(t.gpu_model) is spec]


def start_order(fleet: Fleet, facts: Mapping[str, Mapping[str, Any] | None]) -> list[dict[str, Any]]:
    """Per cluster: name, head, port, members and `steps` (Ray units on every member first, then vllm.service)."""
    out = []
    for name in sorted(fleet.clusters):
        c = fleet.clusters[name]
        units = {m: [u["name"] for u in (facts.get(m) or {}).get("units", [])] for m in c.members}
        steps = [{"host": m, "unit": unit} for unit in ("vllm-ray.service", "vllm.service")
                 for m in c.members if unit in units[m]]
        out.append({"name": name, "head": c.head, "port": int(c.settings["port"]), "members": list(c.members),
                    "steps": steps})
    return out


def host_plan(fleet: Fleet, host: str) -> dict[str, Any]:
    """One host's part of the plan (what its roles read: `provisioner_plan.hosts[inventory_hostname]`)."""
    h = fleet.hosts[host]
    cluster = cluster_of(fleet, host)
    members = list(cluster.members) if cluster else []
    return {
        "cluster": cluster.name if cluster else None,
        "cluster_members": members,
        "cluster_member_addresses": [fleet.hosts[m].address for m in members],
        "vllm": vllm_facts(fleet, host),
        "imex_nodes": imex_nodes(fleet, host) if h.is_gpu_node else [],
    }


def compute(fleet: Fleet) -> dict[str, Any]:
    """The plan of every host of `fleet` (a fleet that passed the rules): plain data (JSON-ready)."""
    from provisioner.monitoring import fleet_targets

    hosts = {n: host_plan(fleet, n) for n in fleet.hosts}
    return {
        "version": PLAN_VERSION,
        "hosts": hosts,
        "clusters": start_order(fleet, {n: p["vllm"] for n, p in hosts.items()}),
        "targets": fleet_targets(fleet),
    }
