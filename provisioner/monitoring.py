"""Render the serving edge and monitoring files from the Fleet: Prometheus scrape config + alert rules, nginx config.

The templates in `templates/` (`prometheus.yml.j2`, `prometheus-rules.yml.j2`, `nginx-vllm.conf.j2`) are the same
ones `roles/monitoring` and `roles/serving_lb` render with Ansible. What they need from the inventory is
`fleet_targets(fleet)`: every cluster head (cluster = the group that defines `vllm_cluster`, its served model names,
address and port), the GPU nodes with their cluster, the balancers. The roles get it from the fleet plan
(`provisioner_plan.targets`: provisioner.plan.compute calls this module), the CLI calls it directly, and both render
on top of the roles' `defaults/main.yml`, so they produce the same bytes
(tests/integration/test_serving_lb.py and test_monitoring.py compare them with real ansible-playbook output).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import yaml

from provisioner import defaults
from provisioner.errors import UsageError
from provisioner.model import Cluster, Fleet, Host
from provisioner.paths import TEMPLATES, data_file

#: Files `provision monitoring` writes, and the template each comes from.
MONITORING_FILES: dict[str, str] = {
    "prometheus.yml": "prometheus.yml.j2",
    "prometheus-rules.yml": "prometheus-rules.yml.j2",
}

_TEMPLATED = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)


def role_defaults(role: str) -> dict[str, Any]:
    """A role's `defaults/main.yml` (empty when the role has none)."""
    return defaults.role_defaults(role)


def ansible_bool(value: Any) -> bool:
    """Ansible's `bool` filter: INI inventories hand over "false"/"yes"/"1" as strings."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value == 1
    return str(value).strip().lower() in ("yes", "on", "1", "true", "y", "t")


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    # One environment for the process: it keeps each compiled template (recompiled when its file changes).
    # The settings of Ansible's template module: trim_blocks on, lstrip_blocks off, trailing newline kept.
    # Filters: plain Jinja2 plus Ansible's `bool` (the only Ansible filter the shared templates may use).
    # Sandboxed: inventory strings are templated here (_resolve), so "{{ ''.__class__... }}" in a value reaches no
    # Python internals (SecurityError, reported as a one-line usage error).
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        trim_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    env.filters["bool"] = ansible_bool
    return env


def _resolve(ctx: dict[str, Any], env: jinja2.Environment) -> dict[str, Any]:
    """Template string values that refer to other variables ("{{ serving_lb_conf_dir }}/njs"), as Ansible would.

    Values that need Ansible-only context (e.g. `playbook_dir`) stay as written: the templates do not use them.
    """
    out = dict(ctx)
    for _ in range(5):
        changed = False
        for k, v in out.items():
            if isinstance(v, str) and _TEMPLATED.search(v):
                try:
                    new = env.from_string(v).render(out)
                except (jinja2.UndefinedError, jinja2.TemplateSyntaxError):
                    continue
                except jinja2.sandbox.SecurityError as exc:
                    raise UsageError(f"{k}: the value is a template that reaches outside the sandbox ({exc})"
                                     ) from None
                if new != v:
                    out[k] = new
                    changed = True
        if not changed:
            break
    return out


def _served_names(cluster: Cluster) -> list[str]:
    served = cluster.get("served_model_name") or cluster.get("model") or ""
    if isinstance(served, str):
        return [served] if served else []
    if isinstance(served, (list, tuple)):
        return [str(x) for x in served if x]
    return [str(served)]


def fleet_targets(fleet: Fleet) -> dict[str, list[dict[str, Any]]]:
    """What the serving edge and the scrape config need from the inventory (JSON-safe, sorted, stable).

    heads: one per cluster with a head (its node_rank 0 member): host, cluster, model (first served name),
    names (every served name), address (ansible_host), port (vllm_cluster.port).
    gpu_nodes, lbs (hosts in group `lb`): host, address, cluster (None outside clusters).
    """
    heads = []
    for c in sorted(fleet.clusters.values(), key=lambda c: c.name):
        if c.head is None or c.head not in fleet.hosts:
            continue
        h = fleet.hosts[c.head]
        names = _served_names(c)
        port = c.get("port")
        heads.append({
            "host": h.name, "cluster": c.name, "model": names[0] if names else "", "names": names,
            "address": h.address, "port": int(port) if str(port).isdigit() else 8000,
        })

    def node(h: Host) -> dict[str, Any]:
        clusters = sorted(fleet.cluster_of(h.name))
        return {"host": h.name, "address": h.address, "cluster": clusters[0] if clusters else None}

    gpu_nodes = [node(h) for h in sorted(fleet.gpu_nodes, key=lambda h: h.name)]
    lbs = [node(h) for h in sorted(fleet.hosts.values(), key=lambda h: h.name) if "lb" in h.groups]
    return {"heads": heads, "gpu_nodes": gpu_nodes, "lbs": lbs}


def inventory_overrides(fleet: Fleet, prefix: str, groups: tuple[str, ...] = ()) -> dict[str, Any]:
    """`prefix*` variables the inventory sets: group `all` first, then each group in `groups` (later wins)."""
    out: dict[str, Any] = {}
    for g in ("all", *groups):
        for k, v in (fleet.group_vars.get(g) or {}).items():
            if k.startswith(prefix):
                out[k] = v
    return out


def template_context(
    fleet: Fleet,
    *,
    roles: tuple[str, ...] = (),
    host: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Variables a template sees: role defaults < host's merged vars (when `host`) < overrides, plus
    `<role>_fleet` = fleet_targets(fleet) for each role (what the role's vars/main.yml sets through its plugin)."""
    ctx: dict[str, Any] = {}
    for role in roles:
        ctx.update(role_defaults(role))
    if host is not None:
        if host not in fleet.hosts:
            raise UsageError(f"host {host!r} is not in the inventory", path=str(fleet.source))
        ctx.update(fleet.hosts[host].vars)
    ctx.update(overrides or {})
    targets = fleet_targets(fleet)
    for role in roles:
        ctx[f"{role}_fleet"] = targets
    return _resolve(ctx, _environment())


def render_template(name: str, ctx: Mapping[str, Any]) -> str:
    env = _environment()
    data_file(TEMPLATES / name)
    try:
        return env.get_template(name).render(dict(ctx))
    except jinja2.UndefinedError as exc:
        raise UsageError(f"cannot render {name}: {exc.message}") from None
    except jinja2.sandbox.SecurityError as exc:
        raise UsageError(f"cannot render {name}: {exc}") from None


def render_lb_config(fleet: Fleet, *, host: str | None = None, overrides: Mapping[str, Any] | None = None) -> str:
    """The nginx http-context file a balancer gets (`host`: an `lb` member whose vars apply; default the first)."""
    if host is None:
        lbs = [n for n, h in fleet.hosts.items() if "lb" in h.groups]
        host = lbs[0] if lbs else None
    ctx = template_context(fleet, roles=("serving_lb",), host=host, overrides=overrides)
    return render_template("nginx-vllm.conf.j2", ctx)


def render_monitoring(fleet: Fleet, overrides: Mapping[str, Any] | None = None) -> dict[str, str]:
    """{file name: text} for `prometheus.yml` and `prometheus-rules.yml`.

    Variables: roles/monitoring/defaults/main.yml < `monitoring_*` set for group `all` < for group `monitoring`
    < `overrides`.
    """
    merged = inventory_overrides(fleet, "monitoring_", ("monitoring",))
    merged.update(overrides or {})
    ctx = template_context(fleet, roles=("monitoring",), overrides=merged)
    return {out: render_template(tpl, ctx) for out, tpl in MONITORING_FILES.items()}


def write_monitoring(fleet: Fleet, out_dir: Path, overrides: Mapping[str, Any] | None = None) -> list[Path]:
    """Render and write the monitoring files into `out_dir` (created); returns the paths written."""
    files = render_monitoring(fleet, overrides)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create output directory: {exc.strerror}", path=str(out_dir)) from None
    written = []
    for name, text in files.items():
        p = out_dir / name
        p.write_text(text, encoding="utf-8")
        written.append(p)
    return written


def scrape_targets(prometheus_yml: str) -> dict[str, list[dict[str, Any]]]:
    """job name -> static_configs (targets + labels) of a rendered prometheus.yml (for reports and tests)."""
    data = yaml.safe_load(prometheus_yml) or {}
    out: dict[str, list[dict[str, Any]]] = {}
    for job in data.get("scrape_configs") or []:
        out[job["job_name"]] = list(job.get("static_configs") or [])
    return out
