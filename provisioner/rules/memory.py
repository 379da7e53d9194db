"""Memory rules (MEM0xx): predict before deploying whether vLLM will load the model and fit its KV cache."""

from __future__ import annotations

from collections.abc import Iterable

from provisioner import catalog, sizing
from provisioner.model import Cluster, Fleet
from provisioner.rules import Finding, rule
from provisioner.rules.cluster import cluster_gpus, model_of, usable
from provisioner.rules.context import RuleContext
from provisioner.sizing import Sizing, human


def cluster_sizing(fleet: Fleet, c: Cluster, ctx: RuleContext) -> Sizing | None:
    """The cluster's sizing, or None when the inputs are not known/valid (other rules say why)."""
    m = model_of(c, ctx)
    gpu_model, _, _ = cluster_gpus(fleet, c)
    g = catalog.gpu(gpu_model)
    if m is None or g is None or not usable(c):
        return None
    return sizing.size(m, g, c.settings)


def _where(c: Cluster) -> str:
    s = c.settings
    return (f"TP {s['tensor_parallel_size']} x PP {s['pipeline_parallel_size']}, dtype {s['dtype']}"
            f"{', fp8 weights' if s.get('quantization') == 'fp8' else ''}")


@rule("MEM001", "weights do not fit in GPU memory")
def weights_fit(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """params x bytes per weight / (TP x PP) must stay below GPU memory x gpu_memory_utilization."""
    for c in fleet.clusters.values():
        sz = cluster_sizing(fleet, c, ctx)
        if sz is None or sz.weights_fit:
            continue
        yield Finding("MEM001", "error", f"weights need {human(sz.weight_bytes_per_gpu)} per GPU ({_where(c)}) but "
                      f"only {human(sz.budget_bytes_per_gpu)} is allowed (GPU memory x gpu_memory_utilization): "
                      "use more GPUs (TP/PP), fp8 quantization, or a higher gpu_memory_utilization",
                      group=c.name, var="vllm_cluster.tensor_parallel_size")


@rule("MEM002", "KV cache cannot hold one max_model_len sequence")
def one_sequence_fits(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """vLLM refuses to start when the KV cache left after the weights cannot hold one full-length sequence."""
    for c in fleet.clusters.values():
        sz = cluster_sizing(fleet, c, ctx)
        if sz is None or not sz.weights_fit or sz.max_full_length_seqs >= 1:
            continue
        fit = sz.kv_cache_bytes_per_gpu // max(1, sz.kv_cache_bytes_per_token_per_gpu)
        yield Finding("MEM002", "error", f"after the weights {human(sz.kv_cache_bytes_per_gpu)} per GPU is left for "
                      f"the KV cache, less than one {c.settings['max_model_len']}-token sequence needs "
                      f"({human(sz.sequence_bytes_per_gpu)}): vLLM will refuse to start; lower max_model_len "
                      f"(at most {fit}), use kv_cache_dtype fp8, or add GPUs", group=c.name,
                      var="vllm_cluster.max_model_len")


@rule("MEM003", "fewer full-length sequences fit than max_num_seqs")
def concurrency_fits(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """A warning: at full length fewer than max_num_seqs sequences fit, so long requests queue or get preempted."""
    for c in fleet.clusters.values():
        sz = cluster_sizing(fleet, c, ctx)
        if sz is None or sz.max_full_length_seqs < 1:
            continue
        want = c.settings["max_num_seqs"]
        if sz.max_full_length_seqs < want:
            yield Finding("MEM003", "warning", f"the KV cache holds {sz.max_full_length_seqs} full-length "
                          f"({c.settings['max_model_len']}-token) sequences, fewer than max_num_seqs {want}: "
                          "long requests will queue or be preempted; lower max_num_seqs/max_model_len or use "
                          "kv_cache_dtype fp8", group=c.name, var="vllm_cluster.max_num_seqs")
