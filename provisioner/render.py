"""Render the files a host gets (nccl.conf, IMEX's nodes_config.cfg, vLLM units, the vLLM env file) from the shared
`templates/`.

The roles render the very same templates with Ansible's template module; this module reproduces that rendering:
variables are the roles' `defaults/main.yml` with the host's merged inventory vars on top, plus `vllm_facts`, the
per-host facts (cluster, rank, the exact `vllm serve` command line from `provisioner.vllm_args`) that the `vllm` role
computes with the same function (`plugins/filter/provisioner_vllm.py` calls `vllm_facts`). So
`provision render` shows byte for byte what a host gets; `tests/unit/test_vllm_units.py` checks it against Ansible's
own template module.

Secrets (`SECRET_VARS`) are never rendered here: their values are replaced by `REDACTED` (the real value only ever
exists as file content on the host, written by Ansible with no_log).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner import defaults
from provisioner.model import Cluster, Fleet, Host
from provisioner.paths import TEMPLATES, data_file

#: Roles whose defaults feed the templates, in merge order.
TEMPLATE_ROLES = ("nccl_tuning", "vllm", "vllm_launch")
SECRET_VARS = ("vllm_api_key", "vllm_hf_token")
REDACTED = "<redacted>"
WRAPPER = "vllm-group-run"

_SAFE_ARG = re.compile(r"^[A-Za-z0-9_./:=,@+\-]+$")


def role_defaults(roles: tuple[str, ...] = TEMPLATE_ROLES) -> dict[str, Any]:
    """The template roles' defaults, merged (provisioner.defaults: read once, declared only in the roles)."""
    return defaults.role_defaults(*roles)


def systemd_quote(arg: str) -> str:
    """One argument for an ExecStart= line: bare when plain, else double-quoted; % and $ escaped for systemd."""
    s = str(arg).replace("%", "%%").replace("$", "$$")
    if _SAFE_ARG.match(s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_exec(argv: list[str]) -> str:
    return " ".join(systemd_quote(a) for a in argv)


def cluster_of(fleet: Fleet, host: str) -> Cluster | None:
    names = fleet.cluster_of(host)
    return fleet.clusters[sorted(names)[0]] if names else None


def vllm_facts(fleet: Fleet, host: str, variables: Mapping[str, Any]) -> dict[str, Any] | None:
    """Everything the vLLM templates and tasks need about `host` beyond plain variables; None: not in a cluster.

    `variables`: the host's variables with role defaults underneath (paths, watch settings)."""
    from provisioner.vllm_args import serve_command

    cluster = cluster_of(fleet, host)
    if cluster is None:
        return None
    h = fleet.hosts[host]
    s = cluster.settings
    members = list(cluster.members)
    head = fleet.hosts[members[0]]
    executor = str(s.get("executor", "mp"))
    is_head = h.name == head.name
    rank = h.node_rank if h.node_rank is not None else members.index(h.name)
    venv = str(variables.get("vllm_venv", "/opt/vllm/venv"))
    libexec = str(variables.get("vllm_libexec_dir", "/usr/local/libexec/provisioner"))
    port = int(s.get("port", 8000))
    master_port = int(s.get("master_port", 29501))
    head_address = str(head.get("vllm_host_ip") or head.address)
    host_ip = str(h.get("vllm_host_ip") or h.address)
    health_url = f"http://127.0.0.1:{port}/health"
    argv = serve_command(cluster, h, fleet, vllm=f"{venv}/bin/vllm")
    wrapper = ["/usr/bin/python3", f"{libexec}/{WRAPPER}"]
    exec_argv: list[str] = []
    units: list[dict[str, str]] = []
    unit_dir = str(variables.get("vllm_unit_dir", "/etc/systemd/system"))
    if executor == "ray":
        role = "head" if is_head else "ray-worker"
        ray = f"{venv}/bin/ray"
        gpus = str(h.gpu_count or 0)
        ray_port = int(variables.get("vllm_ray_port", 6379))
        if is_head:
            ray_argv = [ray, "start", "--block", "--head", f"--node-ip-address={host_ip}", f"--port={ray_port}",
                        f"--num-gpus={gpus}"]
            world = int(s.get("tensor_parallel_size", 1)) * int(s.get("pipeline_parallel_size", 1))
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
            exec_argv = [*wrapper, "--health-url", health_url, "--misses", str(variables.get("vllm_watch_misses", 3)),
                         "--interval", str(variables.get("vllm_head_watch_interval", 10)),
                         *(["--peers", ",".join(peers), "--peer-port", str(port),
                            "--peer-interval", str(variables.get("vllm_watch_interval", 2))] if peers else []),
                         "--", *argv]
        else:
            exec_argv = [*wrapper, "--head-addr", head_address, "--head-port", str(master_port),
                         "--misses", str(variables.get("vllm_watch_misses", 3)),
                         "--interval", str(variables.get("vllm_watch_interval", 2)),
                         "--join-timeout", str(variables.get("vllm_join_timeout", 1800)),
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
        "model": str(s.get("model", "")),
        "served_model_name": str(s.get("served_model_name") or s.get("model", "")),
        "argv": argv,
        "exec_argv": exec_argv,
        "exec_start": systemd_exec(exec_argv) if exec_argv else "",
        "ray_exec_start": ray_exec,
        "health_url": health_url,
        "units": units,
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


@dataclass(frozen=True)
class RenderedFile:
    dest: str  # absolute path on the host
    template: str  # templates/ file name
    content: str
    mode: str
    owner: str
    group: str


def host_variables(fleet: Fleet, host: Host | str, *, redact: bool = True) -> dict[str, Any]:
    """Role defaults, then the host's merged inventory vars, then the magic variables the templates use."""
    h = fleet.hosts[host] if isinstance(host, str) else host
    v: dict[str, Any] = role_defaults()
    v.update(h.vars)
    v["inventory_hostname"] = h.name
    v["inventory_hostname_short"] = h.name.split(".")[0]
    v["group_names"] = list(h.groups)
    v.setdefault("ansible_host", h.address)
    if redact:
        for k in SECRET_VARS:
            if v.get(k):
                v[k] = REDACTED
    v["vllm_facts"] = vllm_facts(fleet, h.name, v)
    v["imex_nodes"] = imex_nodes(fleet, h.name)
    return v


def _env(templates: Path):
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,  # Ansible's template module default
        lstrip_blocks=False,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return env


def render_template(name: str, variables: Mapping[str, Any], templates: Path = TEMPLATES) -> str:
    data_file(templates / name)
    return _env(templates).get_template(name).render(**variables)


def host_files(fleet: Fleet, host: Host | str, *, redact: bool = True,
               templates: Path = TEMPLATES) -> list[RenderedFile]:
    """The files `host` gets from templates/, in the order the roles write them."""
    h = fleet.hosts[host] if isinstance(host, str) else host
    v = host_variables(fleet, h, redact=redact)
    out: list[RenderedFile] = []
    if h.is_gpu_node:
        out.append(RenderedFile("/etc/nccl.conf", "nccl.conf.j2", render_template("nccl.conf.j2", v, templates),
                                "0644", "root", "root"))
    if v["imex_nodes"]:
        out.append(RenderedFile(str(defaults.role_default("imex", "imex_nodes_config_path")),
                                "nvidia-imex-nodes_config.cfg.j2",
                                render_template("nvidia-imex-nodes_config.cfg.j2", v, templates), "0644", "root",
                                "root"))
    facts = v["vllm_facts"]
    if facts:
        out.append(RenderedFile(str(v["vllm_env_file"]), "vllm.env.j2", render_template("vllm.env.j2", v, templates),
                                "0640", "root", str(v["vllm_group"])))
        for u in facts["units"]:
            out.append(RenderedFile(u["dest"], u["template"], render_template(u["template"], v, templates),
                                    "0644", "root", "root"))
    return out
