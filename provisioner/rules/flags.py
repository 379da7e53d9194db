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
            if f in MANAGED_FLAGS:
                yield Finding("FLAG002", "error", f"extra_args repeats {f}, which is rendered from "
                              f"{MANAGED_FLAGS[f]}: set that instead and drop it from extra_args", group=name, var=VAR)
            elif a.startswith("-") and " " in a.strip() and "=" not in f:
                parts = a.split()
                yield Finding("FLAG002", "error", f"extra_args item {a!r} holds a flag and its value: split it into "
                              f"separate items {parts!r} or write {parts[0]}={' '.join(parts[1:])}",
                              group=name, var=VAR)


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
