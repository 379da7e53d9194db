"""`validate(fleet) -> ValidationResult`: every rule's findings plus each cluster's sizing (what reports print)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.model import Fleet
from provisioner.rules import Finding, RuleContext, build_context, run_rules
from provisioner.rules.cluster import cluster_gpus
from provisioner.rules.memory import cluster_sizing


@dataclass(frozen=True)
class ClusterSummary:
    name: str
    members: tuple[str, ...]
    gpu_model: str | None
    gpus_per_node: int | None
    model: str | None  # model_arch, or the config.json's model name
    tensor_parallel_size: Any
    pipeline_parallel_size: Any
    max_model_len: Any
    max_num_seqs: Any
    weight_bytes_per_gpu: int | None
    kv_cache_bytes_per_token: int | None  # whole model, before any split over GPUs
    kv_cache_bytes_per_token_per_gpu: int | None
    kv_cache_bytes_per_gpu: int | None
    max_full_length_seqs: int | None

    def as_json(self) -> dict[str, Any]:
        """Exactly the issue's schema."""
        return {
            "name": self.name,
            "nodes": len(self.members),
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
            "max_full_length_seqs": self.max_full_length_seqs,
        }


@dataclass(frozen=True)
class ValidationResult:
    source: Path
    hosts: int
    findings: tuple[Finding, ...]
    clusters: tuple[ClusterSummary, ...]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "errors": [f.as_dict() for f in self.errors],
            "warnings": [f.as_dict() for f in self.warnings],
            "clusters": [c.as_json() for c in self.clusters],
        }


def validate(fleet: Fleet, ctx: RuleContext | None = None) -> ValidationResult:
    ctx = ctx or build_context(fleet)
    findings = tuple(run_rules(fleet, ctx))
    clusters = []
    for c in fleet.clusters.values():
        sz = cluster_sizing(fleet, c, ctx)
        gm, per_node, _ = cluster_gpus(fleet, c)
        spec = ctx.models.get(c.name)
        clusters.append(ClusterSummary(
            name=c.name,
            members=c.members,
            gpu_model=gm,
            gpus_per_node=per_node,
            model=spec.name if spec else (arch if isinstance(arch := c.settings.get("model_arch"), str) else None),
            tensor_parallel_size=c.settings.get("tensor_parallel_size"),
            pipeline_parallel_size=c.settings.get("pipeline_parallel_size"),
            max_model_len=c.settings.get("max_model_len"),
            max_num_seqs=c.settings.get("max_num_seqs"),
            weight_bytes_per_gpu=sz.weight_bytes_per_gpu if sz else None,
            kv_cache_bytes_per_token=sz.kv_cache_bytes_per_token if sz else None,
            kv_cache_bytes_per_token_per_gpu=sz.kv_cache_bytes_per_token_per_gpu if sz else None,
            kv_cache_bytes_per_gpu=sz.kv_cache_bytes_per_gpu if sz else None,
            max_full_length_seqs=sz.max_full_length_seqs if sz else None,
        ))
    return ValidationResult(source=fleet.source, hosts=len(fleet.hosts), findings=findings, clusters=tuple(clusters))
