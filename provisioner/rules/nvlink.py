"""NVLink-domain rules (NVL0xx): GB200/GB300 NVL72 trays, their `nvlink_domain` (one NVLink/IMEX domain per name)
and the IMEX membership every tray of a domain must agree on. Catalog fields: imex, nvlink_domain_size,
max_per_node."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from provisioner import catalog
from provisioner.model import Fleet, Host
from provisioner.rules import Finding, rule
from provisioner.rules._util import show, type_name
from provisioner.rules.context import RuleContext
from provisioner.rules.hardware import driver_version


def imex_trays(fleet: Fleet) -> list[Host]:
    """GPU nodes whose GPU model shares memory over NVLink across trays (catalog imex: true)."""
    out = []
    for h in fleet.gpu_nodes:
        spec = catalog.gpu(h.gpu_model)
        if spec is not None and spec.imex:
            out.append(h)
    return out


def domains(fleet: Fleet) -> dict[str, list[Host]]:
    """nvlink_domain name -> its trays (IMEX models only), in inventory order."""
    out: dict[str, list[Host]] = defaultdict(list)
    for h in imex_trays(fleet):
        if h.nvlink_domain:
            out[h.nvlink_domain].append(h)
    return dict(out)


@rule("NVL001", "NVL72 tray without nvlink_domain")
def domain_missing(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Every tray of an IMEX model names its NVLink domain: nodes_config.cfg lists the domain's trays, and tensor
    parallelism across trays is fast only inside one."""
    for h in imex_trays(fleet):
        v = h.vars.get("nvlink_domain")
        if v is None:
            yield Finding("NVL001", "error", f"{h.gpu_model} trays need nvlink_domain: name the NVL72 rack this tray "
                          "sits in (trays with the same name form one NVLink/IMEX domain), e.g. nvlink_domain: rack1",
                          host=h.name, var="nvlink_domain")
        elif not (isinstance(v, str) and v.strip()):
            yield Finding("NVL001", "error", f"nvlink_domain = {show(v)} is a {type_name(v)}: expected a non-empty "
                          "name such as rack1", host=h.name, var="nvlink_domain")


@rule("NVL002", "NVLink domain larger than the hardware allows")
def domain_too_large(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """One NVL72 domain holds at most nvlink_domain_size GPUs (72) in nvlink_domain_size / max_per_node trays (18)."""
    for name, trays in domains(fleet).items():
        spec = catalog.gpu(trays[0].gpu_model)
        assert spec is not None
        max_trays = spec.nvlink_domain_size // spec.max_per_node
        gpus = sum(h.gpu_count or 0 for h in trays)
        if len(trays) > max_trays or gpus > spec.nvlink_domain_size:
            yield Finding("NVL002", "error", f"nvlink_domain {name!r} has {len(trays)} trays / {gpus} GPUs; one "
                          f"{spec.name} NVLink domain holds at most {max_trays} trays / {spec.nvlink_domain_size} "
                          f"GPUs: split it (one nvlink_domain per rack)", host=trays[-1].name, var="nvlink_domain")


@rule("NVL003", "trays of one NVLink domain differ in GPU model or driver")
def domain_mixed(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """IMEX joins the trays of a domain only when every tray runs the same GPU model and the exact same driver (and
    nvidia-imex at that version)."""
    for name, trays in domains(fleet).items():
        first = trays[0]
        for h in trays[1:]:
            if h.gpu_model != first.gpu_model:
                yield Finding("NVL003", "error", f"nvlink_domain {name!r}: gpu_model {h.gpu_model} here but "
                              f"{first.gpu_model} on {first.name}: one domain is one model", host=h.name,
                              var="gpu_model")
            if driver_version(h) != driver_version(first):
                yield Finding("NVL003", "error", f"nvlink_domain {name!r}: nvidia_driver_version "
                              f"{driver_version(h)!r} here but {driver_version(first)!r} on {first.name}: IMEX needs "
                              "the same driver on every tray of a domain", host=h.name, var="nvidia_driver_version")


@rule("NVL004", "IMEX address used twice in a domain")
def imex_address_twice(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """nodes_config.cfg lists one address per tray (imex_address, else ansible_host): two trays with one address make
    the domain wait for a tray that never joins."""
    for name, trays in domains(fleet).items():
        seen: dict[str, str] = {}
        for h in trays:
            v = h.vars.get("imex_address")
            if v is not None and not (isinstance(v, str) and v.strip()):
                yield Finding("NVL004", "error", f"imex_address = {show(v)} is a {type_name(v)}: expected the "
                              "tray's address on the IMEX network, or leave it unset (ansible_host)", host=h.name,
                              var="imex_address")
                continue
            a = h.imex_address
            if a in seen:
                yield Finding("NVL004", "error", f"nvlink_domain {name!r}: IMEX address {a} is also {seen[a]}'s: "
                              "give each tray its own imex_address", host=h.name, var="imex_address")
            seen.setdefault(a, h.name)


@rule("NVL005", "nvlink_domain on a GPU model without multi-node NVLink")
def domain_meaningless(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """nvlink_domain is read only for IMEX models (GB200/GB300 trays); on HGX boards the NVLink domain is the node."""
    for h in fleet.gpu_nodes:
        spec = catalog.gpu(h.gpu_model)
        if spec is not None and not spec.imex and h.vars.get("nvlink_domain") is not None:
            yield Finding("NVL005", "warning", f"nvlink_domain is set but {h.gpu_model} has no multi-node NVLink "
                          f"(its NVLink domain is one node of {spec.nvlink_domain_size} GPUs): remove it",
                          host=h.name, var="nvlink_domain")
