"""Render the files a host gets (nccl.conf, IMEX's nodes_config.cfg, vLLM units, the vLLM env file) from the shared
`templates/`.

The roles render the very same templates with Ansible's template module; this module reproduces that rendering:
variables are the roles' `defaults/main.yml` with the host's merged inventory vars on top, plus the host's part of
the fleet plan (`provisioner.plan.host_plan`: `vllm_facts`, `imex_nodes`), the function the play's provisioner_plan
runs. So `provision render` shows byte for byte what a host gets.

Secrets (`SECRET_VARS`) are never rendered here: their values are replaced by `REDACTED` (the real value only ever
exists as file content on the host, written by Ansible with no_log).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner import defaults, plan
from provisioner.model import Fleet, Host
from provisioner.paths import TEMPLATES, data_file

#: Roles whose defaults feed the templates, in merge order (the plan's).
TEMPLATE_ROLES = plan.PLAN_ROLES
SECRET_VARS = ("vllm_api_key", "vllm_hf_token")
REDACTED = "<redacted>"


def role_defaults(roles: tuple[str, ...] = TEMPLATE_ROLES) -> dict[str, Any]:
    """The template roles' defaults, merged (provisioner.defaults: read once, declared only in the roles)."""
    return defaults.role_defaults(*roles)


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
        from provisioner.vault import is_vaulted

        for k in SECRET_VARS:  # a vaulted value is set, and shown redacted without being decrypted
            if is_vaulted(v.get(k)) or v.get(k):
                v[k] = REDACTED
    part = plan.host_plan(fleet, h.name)  # the function the play's provisioner_plan runs
    v["vllm_facts"] = part["vllm"]
    v["imex_nodes"] = part["imex_nodes"]
    return v


@functools.lru_cache(maxsize=8)
def _env(templates: Path):
    """One environment per templates folder: it keeps each compiled template (recompiled when its file changes),
    so a fleet's hosts do not compile the same template again."""
    import jinja2
    import jinja2.sandbox

    # sandboxed like `provision monitoring`: the templates' inputs are inventory values
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
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


def out_paths(files: list[RenderedFile], out: Path) -> list[tuple[RenderedFile, Path]]:
    """Where `render --out DIR` writes each file: DIR + its absolute host path. UsageError (nothing written yet)
    when a destination is not absolute or would land outside DIR: `..` in `vllm_env_file`/`vllm_unit_dir` (or any
    other path variable), or a directory under DIR that is a symlink out of it."""
    import os

    from provisioner.errors import UsageError

    root = os.path.realpath(out)
    placed: list[tuple[RenderedFile, Path]] = []
    for f in files:
        if not f.dest.startswith("/"):
            raise UsageError(f"{f.dest!r} (from templates/{f.template}) is not an absolute path: not written",
                             path=str(out))
        rel = os.path.normpath(f.dest.lstrip("/"))
        dest = os.path.join(root, rel)
        if rel in (".", "") or rel == ".." or rel.startswith("../") or os.path.commonpath([root, dest]) != root:
            raise UsageError(f"{f.dest!r} (from templates/{f.template}) lies outside --out: nothing written",
                             path=str(out))
        # the deepest directory that exists already must resolve inside DIR (no symlink out of it)
        probe = os.path.dirname(dest)
        while probe != root and not os.path.lexists(probe):
            probe = os.path.dirname(probe)
        real = os.path.realpath(probe)
        if os.path.commonpath([root, real]) != root:
            raise UsageError(f"{f.dest!r}: {probe} resolves outside --out ({real}): nothing written", path=str(out))
        placed.append((f, Path(dest)))
    return placed
