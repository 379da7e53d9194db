"""Burn-in decisions, pure: the threshold catalog (catalog/burnin.yaml) as per-model threshold documents, the
controller's verdict on what a node measured, the fleet-relative slow node, and the docs table generated from the
catalog (`python -m provisioner.burnin --docs` prints it; tests/unit/test_burnin.py keeps docs/burn-in.md equal).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import yaml

from provisioner.catalog import CATALOG_DIR, SAFE_LOADER
from provisioner.probes.burninjudge import CODES, METRICS, judge_metric

TIERS = ("quick", "standard", "soak")
#: Figures compared across a fleet for the slow node (higher is better for all of them).
FLEET_METRICS = ("gemm_bf16_tflops", "gemm_fp8_tflops", "hbm_copy_gbps", "sustained_bf16_tflops", "h2d_gbps",
                 "nccl_allreduce_busbw_gbps")
DOC_BEGIN = "<!-- BEGIN burn-in thresholds: generated from provisioner/catalog/burnin.yaml -->"
DOC_END = "<!-- END burn-in thresholds -->"


@lru_cache(maxsize=1)
def catalog() -> dict[str, Any]:
    with open(CATALOG_DIR / "burnin.yaml", encoding="utf-8") as fh:
        data = yaml.load(fh, Loader=SAFE_LOADER)  # noqa: S506 (the safe loader)
    assert isinstance(data, dict) and {"sources", "defaults", "models"} <= set(data), "burnin.yaml: bad shape"
    return data


def minimum(figure: Mapping[str, Any]) -> float:
    return round(float(figure["nominal"]) * (1.0 - float(figure.get("margin", 0.0))), 1)


def thresholds(gpu_model: str | None, gpu_count: int | None = None, ib_rate: float | None = None) -> dict[str, Any]:
    """The threshold document node_burnin.py and the controller judge with, for a node of `gpu_model` carrying
    `gpu_count` GPUs ({} metrics for a model the catalog does not carry: figures reported, not judged). The
    all-reduce figure refers to a full node (gpus.yaml all_reduce_gpus) and is dropped for any other count.
    `ib_rate` (the inventory's ib_rate_gbps) replaces the catalog's InfiniBand port rate."""
    cat = catalog()
    d = cat["defaults"]
    doc: dict[str, Any] = {"metrics": {}, "sustained_fraction": d.get("sustained_fraction"),
                           "clock_fraction": d.get("clock_fraction")}
    m = cat["models"].get(gpu_model or "")
    if not m:
        return doc
    from provisioner import catalog as gpus

    spec = gpus.gpu(gpu_model)
    full = spec.all_reduce_gpus if spec is not None else 8
    for name, fig in (m.get("metrics") or {}).items():
        if name == "nccl_allreduce_busbw_gbps" and gpu_count != full:
            continue
        doc["metrics"][name] = {"min": minimum(fig)}
    if m.get("pcie"):
        doc["pcie"] = {"gen": int(m["pcie"]["gen"]), "width": int(m["pcie"]["width"])}
    if m.get("ib"):
        rate = float(ib_rate if ib_rate is not None else m["ib"]["rate_gbps"])
        doc["ib"] = {"rate_gbps": rate, "width": int(m["ib"]["width"])}
        doc["metrics"]["ib_link_rate_gbps"] = {"min": rate}
    return doc


def tier_knobs(tier: str) -> dict[str, int]:
    d = catalog()["defaults"]
    return {"load_seconds": int(d["load_seconds"].get(tier, 20)),
            "stress_seconds": int((d.get("stress_seconds") or {}).get(tier, 0)),
            "soak_rounds": int(d.get("soak_rounds", 1))}


# ------------------------------------------------------------------------------------------ the controller's verdict
def rejudge(check: dict[str, Any], doc: Mapping[str, Any]) -> dict[str, Any]:
    """A node's result for a measured figure judged again here against the catalog (the node's own verdict is data,
    not trusted); other checks (SDC, ECC, XID, throttle) keep the node's status and code."""
    metric, value = check.get("metric"), check.get("value")
    if metric not in METRICS or check.get("status") == "skip" or check.get("check") == "measure":
        return check
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return dict(check, status="fail", code="BRN014", message=f"{metric}: no number in the node's result")
    if check.get("code") == "BRN006" and metric == "sustained_bf16_tflops":
        return check  # the node's burst comparison (its own figures) stays
    if check.get("code") == "BRN012" and "wrong sum" in str(check.get("message", "")):
        return check
    if check.get("code") == "BRN019" and check.get("status") == "fail":
        return check  # a port down or narrow at a rate that passes: the node's finding stays
    status, code, expected, message = judge_metric(metric, float(value), dict(doc))
    gpu, peer = check.get("gpu"), check.get("peer")
    where = "" if gpu is None else f"GPU {gpu}" + ("" if peer is None else f" -> GPU {peer}")
    if check.get("link"):
        where = str(check["link"])
    out = dict(check, status=status, expected=expected, message=(f"{where}: " if where else "") + message)
    out.pop("code", None)
    if code:
        out["code"] = code
    return out


# ------------------------------------------------------------------------------------------ the slow node
@dataclass(frozen=True)
class SlowNode:
    host: str
    gpu_model: str
    metric: str
    value: float
    median: float
    gap: float  # fraction below the median (0.08 = 8% slow)
    sample: int

    @property
    def message(self) -> str:
        return (f"{self.host}: {self.metric} {self.value:.1f} is {100 * self.gap:.1f}% below the {self.gpu_model} "
                f"fleet median {self.median:.1f} ({self.sample} nodes) [BRN018]")


def node_figure(values: Iterable[float]) -> float | None:
    """A node's figure for one metric: its slowest GPU (a node is as fast as its slowest GPU under TP)."""
    vals = [float(v) for v in values]
    return min(vals) if vals else None


def slow_nodes(figures: Mapping[str, tuple[str, Mapping[str, float]]], *, fraction: float,
               min_sample: int) -> list[SlowNode]:
    """`figures` = {host: (gpu_model, {metric: node figure})} -> the nodes at least `fraction` below the median of
    their model's nodes, per metric, where at least `min_sample` nodes of the model have that metric."""
    by_model: dict[tuple[str, str], dict[str, float]] = {}
    for host, (model, metrics) in figures.items():
        for metric, v in metrics.items():
            if metric in FLEET_METRICS and v is not None:
                by_model.setdefault((model, metric), {})[host] = float(v)
    out = []
    for (model, metric), vals in sorted(by_model.items()):
        if len(vals) < max(min_sample, 2):
            continue
        med = statistics.median(vals.values())
        if med <= 0:
            continue
        for host, v in sorted(vals.items()):
            gap = (med - v) / med
            if gap >= fraction:
                out.append(SlowNode(host, model, metric, v, med, round(gap, 4), len(vals)))
    return out


def number_var(host: str, host_vars: Mapping[str, Any], name: str, default: Any, kind: type = int,
               low: float = 0) -> Any:
    """A numeric burn-in variable of `host` (its default when unset), or a UsageError naming host, variable and
    value (one line, exit 2: never a traceback)."""
    from provisioner.errors import UsageError

    v = host_vars.get(name, default)
    try:
        if isinstance(v, bool):
            raise ValueError
        n = kind(v)
        if n < low or (kind is float and not 0 < n < 1):
            raise ValueError
    except (TypeError, ValueError):
        want = "a fraction between 0 and 1" if kind is float else f"a whole number >= {low:g}"
        raise UsageError(f"host {host}: {name} = {v!r}: expected {want}") from None
    return n


def slow_settings(host_vars: Mapping[str, Any] | None = None, host: str = "") -> tuple[float, int]:
    d = catalog()["defaults"]
    v = host_vars or {}
    return (number_var(host, v, "burnin_slow_fraction", d["slow_fraction"], float),
            number_var(host, v, "burnin_slow_min_sample", d["slow_min_sample"], int, 2))


# ------------------------------------------------------------------------------------------ docs
def _source(src: str) -> str:
    s = catalog()["sources"].get(src)
    if s is None:
        return src
    return f"{src} ({s['kind']})"


def render_docs_table() -> str:
    """The markdown between DOC_BEGIN and DOC_END in docs/burn-in.md."""
    cat = catalog()
    lines = [DOC_BEGIN, "", "| GPU model | metric | nominal | margin | minimum | anchor | source |",
             "|---|---|---|---|---|---|---|"]
    for model, m in cat["models"].items():
        p = m.get("pcie")
        lines.append(f"| {model} | pcie link | gen {p['gen']} x{p['width']} | - | gen {p['gen']} x{p['width']} | - | "
                     f"{_source(p['source'])} |" if p else f"| {model} | pcie link | not PCIe | - | - | - | - |")
        ib = m.get("ib")
        if ib:
            lines.append(f"| {model} | ib link (each HCA port) | {ib['rate_gbps']} Gb/s {ib['width']}X | - | "
                         f"{ib['rate_gbps']} Gb/s {ib['width']}X | - | {_source(ib['source'])} |")
        for metric, f in (m.get("metrics") or {}).items():
            a = f.get("anchor")
            lines.append(f"| {model} | {metric} | {f['nominal']:g} | {100 * float(f.get('margin', 0)):g}% | "
                         f"{minimum(f):g} | {(str(a['value']) + ' (' + a['source'] + ')') if a else '-'} | "
                         f"{_source(str(f['source']))} |")
    lines += ["", "Sources:", ""]
    for key, s in cat["sources"].items():
        detail = "; ".join(str(s[k]) for k in ("hardware", "software", "date", "record", "reference") if s.get(k))
        lines.append(f"- `{key}` ({s['kind']}): {detail}")
    d = cat["defaults"]
    lines += ["", f"Defaults: sustained GEMM >= {d['sustained_fraction']:g} of the GPU's burst; slow node: "
              f">= {100 * d['slow_fraction']:g}% below the model's fleet median with >= {d['slow_min_sample']} "
              "nodes of the model.", "", "Codes:", ""]
    lines += [f"- `{c}` {text}" for c, text in CODES.items()]
    lines += ["", DOC_END]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] == ["--docs"]:
        sys.stdout.write(render_docs_table())
    else:
        sys.stderr.write("usage: python -m provisioner.burnin --docs\n")
        sys.exit(2)
