"""vLLM flag rules (FLAG0xx): flags vLLM no longer accepts, malformed extra_args, and vLLM's own parser."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeGuard

from provisioner.model import Fleet
from provisioner.rules import Finding, rule
from provisioner.rules._util import show, type_name
from provisioner.rules.cluster import usable
from provisioner.rules.context import RuleContext
from provisioner.vllm_args import MANAGED_FLAGS, flag_name, removed_flags, serve_args

VAR = "vllm_cluster.extra_args"


def _extra(fleet: Fleet, name: str) -> object:
    return fleet.clusters[name].settings.get("extra_args")


def _extra_ok(v: object) -> TypeGuard[list[str] | tuple[str, ...]]:
    return isinstance(v, (list, tuple)) and all(isinstance(a, str) for a in v)


@rule("FLAG001", "vLLM flag that no longer exists")
def removed(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """--swap-space, --disable-log-requests, --use-v2-block-manager ...: vLLM exits with 'unrecognized arguments'."""
    for name, c in fleet.clusters.items():
        extra = _extra(fleet, name)
        argv = list(extra) if _extra_ok(extra) else []
        if usable(c) and c.head:
            argv = serve_args(c, c.head, fleet)
        for flag, fix in dict(removed_flags(argv)).items():
            yield Finding("FLAG001", "error", f"{flag} is no longer accepted by vLLM (0.32+): {fix}",
                          group=name, var=VAR)


@rule("FLAG002", "malformed extra_args")
def malformed(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """extra_args is a list of strings, one argv item each, not repeating a flag rendered from vllm_cluster."""
    for name in fleet.clusters:
        extra = _extra(fleet, name)
        if not _extra_ok(extra):
            yield Finding("FLAG002", "error", f"extra_args = {show(extra)} is a {type_name(extra)}: expected a list "
                          "of strings, e.g. ['--enable-log-requests']", group=name, var=VAR)
            continue
        for a in extra:
            f = flag_name(a)
            if secret_flag(a):
                continue  # FLAG004 (which never shows the item: it holds a secret)
            if f in MANAGED_FLAGS:
                yield Finding("FLAG002", "error", f"extra_args repeats {f}, which is rendered from "
                              f"{MANAGED_FLAGS[f]}: set that instead and drop it from extra_args", group=name, var=VAR)
            elif a.startswith("-") and " " in a.strip() and "=" not in f:
                parts = a.split()
                yield Finding("FLAG002", "error", f"extra_args item {a!r} holds a flag and its value: split it into "
                              f"separate items {parts!r} or write {parts[0]}={' '.join(parts[1:])}",
                              group=name, var=VAR)


#: vLLM flags whose value is a secret -> the variable that carries it off the command line (into the 0640 env file)
SECRET_FLAGS = {"--api-key": "vllm_api_key", "--hf-token": "vllm_hf_token"}


def secret_flag(arg: str) -> str | None:
    """The secret flag `arg` sets (as vLLM's parser reads it: `--api_key` is `--api-key`, a value after `=` or a
    space, an unambiguous abbreviation such as `--api-ke`), else None."""
    f = flag_name(arg.strip()).split()[0] if arg.strip() else ""
    if not f.startswith("--"):
        return None
    f = "--" + f[2:].replace("_", "-")
    for name in SECRET_FLAGS:
        if name.startswith(f) and len(f) >= len(name) - 2:
            return name
    return None


@rule("FLAG004", "secret on the vLLM command line")
def secret_in_argv(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """`--api-key`/`--hf-token` in extra_args put the key in argv: the unit file (0644), `ps` on the node and
    `provision plan`. Refused, pointing at the variable that renders it into the env file (the value never shown)."""
    for name in fleet.clusters:
        extra = _extra(fleet, name)
        if not isinstance(extra, (list, tuple)):
            continue
        for a in extra:
            f = secret_flag(a) if isinstance(a, str) else None
            if f:
                var = SECRET_FLAGS[f]
                yield Finding("FLAG004", "error", f"extra_args sets {f}: the key would be on vLLM's command line (the "
                              f"0644 unit, `ps`, `provision plan`); set {var} instead (vault it), which reaches vLLM "
                              f"through the 0640 env file", group=name, var=VAR)


def member_argvs(fleet: Fleet) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(cluster, member, model, argv) for every distinct argv FLAG003 checks (usable clusters only)."""
    out = []
    for name, c in fleet.clusters.items():
        if not usable(c) or not _extra_ok(_extra(fleet, name)) or not c.members:
            continue
        seen: set[tuple[str, ...]] = set()
        for m in c.members:
            argv = tuple(serve_args(c, m, fleet))
            if argv and argv not in seen:
                seen.add(argv)
                out.append((name, m, str(c.settings.get("model") or "model"), argv))
    return out


@rule("FLAG003", "vLLM's own parser rejects the command line")
def vllm_parser(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """When vLLM is importable (validate --vllm-parser / auto), every member's rendered argv goes through
    `vllm serve`'s real argument parser, so no flag typo reaches a node."""
    if ctx.flag_checker is None:
        return
    for name, m, model, argv in member_argvs(fleet):
        err = ctx.flag_checker(model, list(argv))
        if err:
            yield Finding("FLAG003", "error", f"vLLM's parser rejects the command line for {m}: {err}",
                          host=m, group=name, var=VAR)
