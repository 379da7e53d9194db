"""Render the serving edge and monitoring files from the Fleet: Prometheus scrape config + alert rules, nginx config.

The templates in `templates/` (`prometheus.yml.j2`, `prometheus-rules.yml.j2`, `nginx-vllm.conf.j2`) are the same
ones `roles/monitoring` and `roles/serving_lb` render with Ansible. They read the Ansible magic variables `groups`
and `hostvars`; `template_context` builds those from the Fleet (hostvars = each host's merged vars plus
`inventory_hostname` and `group_names`), under the roles' `defaults/main.yml` and the inventory's own values, so the
CLI and the roles produce the same bytes (tests/unit/test_serving_lb.py compares them).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import jinja2
import yaml

from provisioner import ROLES, TEMPLATES
from provisioner.errors import UsageError
from provisioner.model import Fleet

#: Files `provision monitoring` writes, and the template each comes from.
MONITORING_FILES: dict[str, str] = {
    "prometheus.yml": "prometheus.yml.j2",
    "prometheus-rules.yml": "prometheus-rules.yml.j2",
}

_TEMPLATED = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)


def role_defaults(role: str) -> dict[str, Any]:
    """A role's `defaults/main.yml` (empty when the role has none)."""
    path = ROLES / role / "defaults" / "main.yml"
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise UsageError("role defaults are not a mapping", path=str(path))
    return data


def ansible_bool(value: Any) -> bool:
    """Ansible's `bool` filter: INI inventories hand over "false"/"yes"/"1" as strings."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value == 1
    return str(value).strip().lower() in ("yes", "on", "1", "true", "y", "t")


def _environment() -> jinja2.Environment:
    # The settings of Ansible's template module: trim_blocks on, lstrip_blocks off, trailing newline kept.
    # Filters: plain Jinja2 plus Ansible's `bool` (the only Ansible filter the shared templates may use).
    env = jinja2.Environment(
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
                except jinja2.UndefinedError:
                    continue
                if new != v:
                    out[k] = new
                    changed = True
        if not changed:
            break
    return out


def ansible_magic(fleet: Fleet) -> dict[str, Any]:
    """`groups` and `hostvars` as Ansible would hand them to a template, built from the Fleet."""
    groups: dict[str, list[str]] = {"all": list(fleet.hosts)}
    for name, h in fleet.hosts.items():
        for g in h.groups:
            groups.setdefault(g, []).append(name)
    ungrouped = [n for n, h in fleet.hosts.items() if not h.groups]
    if ungrouped:
        groups["ungrouped"] = ungrouped
    hostvars: dict[str, dict[str, Any]] = {}
    for name, h in fleet.hosts.items():
        hv = dict(h.vars)
        hv.setdefault("ansible_host", h.address)
        hv["inventory_hostname"] = name
        hv["group_names"] = list(h.groups)
        hostvars[name] = hv
    return {"groups": groups, "hostvars": hostvars}


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
    """Variables a template sees: role defaults < host's merged vars (when `host`) < overrides, + groups/hostvars."""
    ctx: dict[str, Any] = {}
    for role in roles:
        ctx.update(role_defaults(role))
    magic = ansible_magic(fleet)
    if host is not None:
        if host not in fleet.hosts:
            raise UsageError(f"host {host!r} is not in the inventory", path=str(fleet.source))
        ctx.update(magic["hostvars"][host])
    ctx.update(overrides or {})
    ctx.update(magic)
    return _resolve(ctx, _environment())


def render_template(name: str, ctx: Mapping[str, Any]) -> str:
    env = _environment()
    try:
        return env.get_template(name).render(dict(ctx))
    except jinja2.UndefinedError as exc:
        raise UsageError(f"cannot render {name}: {exc.message}") from None


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
