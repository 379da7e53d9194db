"""Where the launched vLLM clusters answer, for the end of `provision onboard` and `provision run`: per cluster the
endpoint URL (the head's `vllm_host_ip`, else its address, and the cluster's port), the served model name, where
the API key lives (the variable and the inventory file that sets it; never the key itself) and one `curl` line that
works as printed (the key read from that file by a shell expansion, or from `$VLLM_API_KEY` where it cannot be).

`cluster_endpoints` and `endpoint_lines` are pure (the inventory's variable files come in as text); `var_files`
reads the files that may set the key for the clusters' heads. Which clusters a `provision run` launched:
`LaunchSeen` (the run's `on_event`) notes the clusters roles/vllm_launch's start step looked at, and
`launched_clusters` keeps those whose members all came through.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from provisioner.model import Fleet, Host
from provisioner.monitoring import _served_names
from provisioner.results import RunResult

KEY_VAR = "vllm_api_key"
#: What vLLM reads the key from on each member (templates/vllm.env.j2), the env file of roles/vllm_launch.
KEY_ENV = "VLLM_API_KEY"
ENV_FILE_DEFAULT = "/etc/vllm/vllm.env"
#: `sed -n 's/^vllm_api_key: *//p' FILE` reads a plain YAML line; `= *` an INI `[group:vars]` line.
_YAML_LINE = re.compile(r"^" + KEY_VAR + r": *(.*)$")
_INI_LINE = re.compile(r"^" + KEY_VAR + r" *= *(.*)$")


#: roles/vllm_launch/tasks/clusters.yml: the first task of the start step (not in check mode, not with --skip-tags
#: vllm_launch_start), one loop item per complete cluster of the play, labelled with the cluster's name.
START_TASK = "Is each cluster serving now? (head /health)"


class LaunchSeen:
    """`on_event` of a run: the clusters the vLLM launch's start step looked at (`clusters`, in order) and those a
    task of the role then failed for (`failed`: a failed loop item labelled with the cluster, e.g. the /health wait,
    or a failed task whose name ends with `: CLUSTER`, rolling.yml's). A run_once failure fails every host of the
    play in Ansible without a failure event for each, so the members' states alone cannot tell."""

    def __init__(self) -> None:
        self.clusters: list[str] = []
        self.failed: set[str] = set()

    def __call__(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event")
        ed = event.get("event_data") or {}
        res = ed.get("res") or {}
        label = res.get("_ansible_item_label") if isinstance(res, dict) else None
        task = str(ed.get("task") or "")
        if kind == "runner_item_on_ok" and task == START_TASK and isinstance(label, str):
            if label not in self.clusters:
                self.clusters.append(label)
        elif kind in ("runner_item_on_failed", "runner_on_failed") and ed.get("role") == "vllm_launch" \
                and not ed.get("ignore_errors"):
            if isinstance(label, str):
                self.failed.add(label)
            tail = task.rsplit(": ", 1)[-1] if ": " in task else ""
            if tail in self.clusters:
                self.failed.add(tail)


def launched_clusters(fleet: Fleet, result: RunResult, seen: LaunchSeen) -> list[str]:
    """Clusters `seen` saw started that the run left serving: not check mode, no launch failure for the cluster,
    every member reached without failure."""
    if result.check:
        return []
    out = []
    for name in seen.clusters:
        if name in seen.failed:
            continue
        c = fleet.clusters.get(name)
        if c is None or not c.members:
            continue
        states = [result.hosts[m].state if m in result.hosts else "not_run" for m in c.members]
        if all(st in ("ok", "changed") for st in states):
            out.append(name)
    return out


@dataclass(frozen=True)
class Endpoint:
    cluster: str
    head: str
    url: str  # http://ADDRESS:PORT
    model: str  # the name clients ask for (first served name, else the model)
    key: bool  # the cluster requires an API key
    key_file: str | None = None  # the inventory file that sets vllm_api_key (None: not found, or not plain)
    key_read: str | None = None  # a shell expansion printing the key from key_file (None: export VLLM_API_KEY)
    vaulted: bool = False
    env_file: str = ENV_FILE_DEFAULT  # on every member: VLLM_API_KEY=... (0640 root:vllm)
    clients: tuple[str, ...] = ()  # vllm_client_networks: who the cluster firewall lets in
    # where clients reach the model through the serving edge (roles/serving_lb on the hosts of group lb): URL per
    # balancer that fronts this model (its main port, and its dedicated port for the model if it has one)
    balancers: tuple[str, ...] = ()
    balancer_hosts: tuple[str, ...] = ()  # the lb host of each URL above

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def candidate_files(fleet: Fleet, host: Host) -> list[Path]:
    """Files that can set a variable for `host`, most specific first: host_vars/HOST, group_vars/GROUP of each of
    its groups, group_vars/all (`.yml`, `.yaml`, none, or a directory of them), then the inventory file itself
    (inline `[group:vars]`)."""
    src = Path(fleet.source)
    base = src if src.is_dir() else src.parent
    out: list[Path] = []

    def add(d: Path, name: str) -> None:
        for p in (d / f"{name}.yml", d / f"{name}.yaml", d / name):
            if p.is_dir():
                out.extend(sorted(q for q in p.iterdir() if q.suffix in (".yml", ".yaml", "") and q.is_file()))
            elif p.is_file():
                out.append(p)

    add(base / "host_vars", host.name)
    for g in sorted(host.groups, key=lambda g: (len(fleet.groups.get(g, ())), g)):  # smaller (child) groups first
        add(base / "group_vars", g)
    add(base / "group_vars", "all")
    if src.is_file():
        out.append(src)
    return out


def var_files(fleet: Fleet, clusters: Iterable[str]) -> dict[str, str]:
    """path -> text of every file that may set the key for the heads of `clusters` (unreadable ones left out)."""
    files: dict[str, str] = {}
    for name in clusters:
        c = fleet.clusters.get(name)
        head = fleet.hosts.get(c.head) if c is not None and c.head else None
        if head is None:
            continue
        for p in candidate_files(fleet, head):
            if str(p) not in files:
                try:
                    files[str(p)] = p.read_text(errors="replace")
                except OSError:
                    continue
    return files


def _shown_path(path: str, cwd: str | None) -> str:
    if cwd:
        rel = os.path.relpath(path, cwd)
        if not rel.startswith(".."):
            return rel
    return path


def key_source(value: Any, files: Mapping[str, str], order: Iterable[str], cwd: str | None = None
               ) -> tuple[str | None, str | None, bool]:
    """(file, shell expansion, vaulted) for the key `value`: the first file in `order` with exactly one line setting
    vllm_api_key whose plain text is the value (what `sed` would print: that is what the expansion runs); a file
    setting it through `!vault` gives (file, None, True). Nothing matched: (None, None, vaulted-looking value)."""
    for path in order:
        text = files.get(path)
        if text is None:
            continue
        lines = text.split("\n")
        is_ini = not path.endswith((".yml", ".yaml")) and any(_INI_LINE.match(ln) for ln in lines)
        rx = _INI_LINE if is_ini else _YAML_LINE
        hits = [m.group(1) for ln in lines if (m := rx.match(ln))]
        if len(hits) != 1:
            continue
        shown = _shown_path(path, cwd)
        if hits[0].lstrip().startswith("!vault"):
            return shown, None, True
        if isinstance(value, str) and hits[0] == value:
            sep = " *= *" if is_ini else ": *"
            return shown, f"$(sed -n 's/^{KEY_VAR}{sep}//p' {shlex.quote(shown)})", False
    return None, None, not isinstance(value, str)


#: listen addresses that mean "every address": the balancer is reached on its host's address
_ANY = ("", "0.0.0.0", "*", "::", "[::]")


def balancer_urls(fleet: Fleet, model: str, defaults: Mapping[str, Any] | None = None
                  ) -> list[tuple[str, str]]:
    """(URL, lb host) for every host of group `lb` whose balancer fronts served model `model` (serving_lb_models
    empty or naming it): its main port, and the model's dedicated port (serving_lb_model_ports) when it has one.
    Pure: the roles' defaults come in as `defaults`, each lb host's own variables win."""
    out: list[tuple[str, str]] = []
    for h in fleet.hosts.values():
        if "lb" not in h.groups or not model:
            continue
        hv = {**dict(defaults or {}), **dict(h.vars)}
        only = hv.get("serving_lb_models") or []
        if isinstance(only, list | tuple) and only and model not in only:
            continue
        listen = str(hv.get("serving_lb_listen_address") or "")
        address = h.address if listen in _ANY else listen
        host_part = f"[{address}]" if ":" in address else address
        out.append((f"http://{host_part}:{hv.get('serving_lb_listen_port', 8000)}", h.name))
        ports = hv.get("serving_lb_model_ports") or {}
        if isinstance(ports, Mapping) and model in ports:
            out.append((f"http://{host_part}:{ports[model]}", h.name))
    return out


def cluster_endpoints(fleet: Fleet, clusters: Iterable[str], files: Mapping[str, str] | None = None,
                      cwd: str | None = None, defaults: Mapping[str, Any] | None = None) -> list[Endpoint]:
    """One Endpoint per named cluster that has a head, in the order given. `files`: `var_files` output; `defaults`:
    the roles' defaults (the head's own variables win)."""
    out: list[Endpoint] = []
    for name in clusters:
        c = fleet.clusters.get(name)
        if c is None or not c.head or c.head not in fleet.hosts:
            continue
        head = fleet.hosts[c.head]
        hv = {**dict(defaults or {}), **dict(head.vars)}
        address = str(head.get("vllm_host_ip") or head.address)
        port = int(c.get("port", 8000))
        names = _served_names(c)
        value = hv.get(KEY_VAR)
        from provisioner.vault import is_vaulted

        has_key = is_vaulted(value) or value not in (None, "")  # a vaulted key is set: never decrypted here
        key_file = key_read = None
        vaulted = False
        if has_key:
            order = [str(p) for p in candidate_files(fleet, head)]
            key_file, key_read, vaulted = key_source(value, files or {}, order, cwd)
        clients = hv.get("vllm_client_networks") or ()
        lbs = balancer_urls(fleet, names[0] if names else "", defaults)
        out.append(Endpoint(
            cluster=name, head=head.name, url=f"http://{address}:{port}", model=names[0] if names else "",
            key=has_key, key_file=key_file, key_read=key_read, vaulted=vaulted,
            env_file=str(hv.get("vllm_env_file") or ENV_FILE_DEFAULT),
            clients=tuple(str(n) for n in clients) if isinstance(clients, list | tuple) else (str(clients),),
            balancers=tuple(u for u, _ in lbs), balancer_hosts=tuple(n for _, n in lbs)))
    return out


def endpoint_lines(endpoints: Iterable[Endpoint]) -> list[str]:
    """The report: a line per cluster (URL, model), a line per balancer URL fronting it, where its key is, and a
    `curl` line. Never a key."""
    lines: list[str] = []
    for e in endpoints:
        lines.append(f"{e.cluster}: {e.url}  model {e.model} (head {e.head})")
        for url, lb in zip(e.balancers, e.balancer_hosts, strict=False):
            lines.append(f"  balancer: {url}  model {e.model} (nginx on {lb}; clients use this)")
        header = ""
        if e.key:
            if e.key_read:
                where = f"{KEY_VAR} in {e.key_file}"
                bearer = e.key_read
            elif e.key_file:
                where = f"{KEY_VAR} in {e.key_file}{' (vaulted)' if e.vaulted else ''}; export {KEY_ENV} with it"
                bearer = f"${KEY_ENV}"
            else:
                where = (f"{KEY_VAR} ({'vaulted, ' if e.vaulted else ''}set in the inventory); export {KEY_ENV} "
                         "with it")
                bearer = f"${KEY_ENV}"
            lines.append(f"  API key: {where} (on the members: {KEY_ENV} in {e.env_file})")
            header = f' -H "Authorization: Bearer {bearer}"'
        else:
            lines.append(f"  API key: none ({KEY_VAR} is empty: the API is open to the client networks)")
        if e.clients:
            lines.append(f"  clients: {', '.join(e.clients)} (vllm_client_networks; the cluster firewall drops others)")
        lines.append(f"  curl -s {e.url}/v1/models{header}")
    return lines


def endpoints_for(fleet: Fleet, clusters: Iterable[str], cwd: str | None = None) -> list[Endpoint]:
    """`cluster_endpoints` with the roles' defaults and the inventory's variable files read (paths shown relative to
    `cwd`, default the working directory, when under it)."""
    from provisioner.render import role_defaults

    names = list(clusters)
    if not names:
        return []
    return cluster_endpoints(fleet, names, var_files(fleet, names), cwd=cwd or os.getcwd(), defaults=role_defaults())
