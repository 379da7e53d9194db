"""The vLLM command line a cluster member runs: one pure function shared by `validate` and the systemd units.

`serve_args(cluster, host, fleet) -> list[str]` returns the arguments that follow `vllm serve MODEL` on `host`
(`serve_command` prepends `vllm serve MODEL`). Multi-node clusters use vLLM's own Ray-free `mp` executor:

    head (rank 0):   --nnodes N --node-rank 0 --master-addr HEAD --master-port P -tp T -pp P
                     [--port 8000 --shutdown-timeout W] ...
    worker (rank R): --nnodes N --node-rank R --master-addr HEAD --master-port P -tp T -pp P ... --headless

`executor: ray` renders `--distributed-executor-backend ray` on the head only; Ray workers run `ray start`, not
`vllm serve`, so `serve_args` returns [] for them. A one-node cluster gets no --nnodes/--node-rank/--master-* flags.
W is the cluster's `drain_wait` (vLLM drains in-flight requests that long on SIGTERM).
HEAD is the head's `vllm_host_ip` when set, else its `ansible_host` (the address the bootstrap interface carries).
The order is fixed (settings flags, then `extra_args` verbatim) so rendered units are byte-stable.

The function expects a cluster that passed `provision validate` (ints are ints); it never does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import yaml

from provisioner.catalog import CATALOG_DIR, SAFE_LOADER
from provisioner.model import Cluster, Fleet, Host

# Flags vLLM no longer accepts (vLLM 0.32/0.33) -> what to do instead: provisioner/catalog/vllm_flags.yaml (shared
# with the vLLM flag rules, which playbooks/validate.yml runs too).
REMOVED_FLAGS: Mapping[str, str] = MappingProxyType(
    yaml.load((CATALOG_DIR / "vllm_flags.yaml").read_text(encoding="utf-8"), Loader=SAFE_LOADER)["removed"])  # noqa: S506

# Flags serve_args renders from vllm_cluster settings; extra_args must not repeat them (FLAG002).
MANAGED_FLAGS: Mapping[str, str] = {
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--nnodes": "the cluster's members",
    "--node-rank": "node_rank",
    "--master-addr": "the head's ansible_host / vllm_host_ip",
    "--master-port": "master_port",
    "--headless": "node_rank (workers are headless)",
    "--distributed-executor-backend": "executor",
    "--dtype": "dtype",
    "--quantization": "quantization",
    "-q": "quantization",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--max-model-len": "max_model_len",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--block-size": "block_size",
    "--enable-chunked-prefill": "enable_chunked_prefill",
    "--no-enable-chunked-prefill": "enable_chunked_prefill",
    "--enable-prefix-caching": "enable_prefix_caching",
    "--no-enable-prefix-caching": "enable_prefix_caching",
    "--port": "port",
    "--shutdown-timeout": "drain_wait",
}


def flag_name(arg: str) -> str:
    """`--foo=1` -> `--foo`."""
    return arg.split("=", 1)[0]


def _bool_flag(name: str, value: Any) -> list[str]:
    return [f"--{name}"] if value else [f"--no-{name}"]


def serve_args(cluster: Cluster, host: Host | str, fleet: Fleet) -> list[str]:
    """Arguments after `vllm serve MODEL` for `host` (a member of `cluster`); see the module docstring."""
    h = fleet.hosts[host] if isinstance(host, str) else host
    s = cluster.settings
    members = cluster.members
    head = fleet.hosts[members[0]] if members else h
    is_head = h.name == head.name
    ray = s.get("executor", "mp") == "ray"
    if ray and not is_head:
        return []
    rank = members.index(h.name) if h.name in members else (h.node_rank or 0)
    if h.node_rank is not None:
        rank = h.node_rank

    argv: list[str] = []
    if len(members) > 1 and not ray:
        master = head.get("vllm_host_ip") or head.address
        argv += ["--nnodes", str(len(members)), "--node-rank", str(rank),
                 "--master-addr", str(master), "--master-port", str(s["master_port"])]
    argv += ["-tp", str(s["tensor_parallel_size"]), "-pp", str(s["pipeline_parallel_size"])]
    if ray:
        argv += ["--distributed-executor-backend", "ray"]
    if is_head:
        argv += ["--port", str(s["port"])]
        # graceful stop: on SIGTERM the engine finishes in-flight requests for up to the drain's wait
        argv += ["--shutdown-timeout", str(s.get("drain_wait", 0))]
    argv += ["--dtype", str(s["dtype"])]
    if s.get("quantization"):
        argv += ["--quantization", str(s["quantization"])]
    argv += ["--kv-cache-dtype", str(s["kv_cache_dtype"]),
             "--max-model-len", str(s["max_model_len"]),
             "--max-num-seqs", str(s["max_num_seqs"])]
    if s.get("max_num_batched_tokens") is not None:
        argv += ["--max-num-batched-tokens", str(s["max_num_batched_tokens"])]
    argv += ["--gpu-memory-utilization", str(s["gpu_memory_utilization"]),
             "--block-size", str(s["block_size"])]
    argv += _bool_flag("enable-chunked-prefill", s.get("enable_chunked_prefill"))
    argv += _bool_flag("enable-prefix-caching", s.get("enable_prefix_caching"))
    if s.get("served_model_name"):
        argv += ["--served-model-name", str(s["served_model_name"])]
    extra = s.get("extra_args") or []
    if isinstance(extra, (list, tuple)):
        argv += [str(a) for a in extra]
    if not is_head:
        argv.append("--headless")
    return argv


def serve_command(cluster: Cluster, host: Host | str, fleet: Fleet, vllm: str = "vllm") -> list[str]:
    """The full argv (`vllm serve MODEL ...`), or [] for a Ray worker."""
    args = serve_args(cluster, host, fleet)
    h = fleet.hosts[host] if isinstance(host, str) else host
    if not args and cluster.settings.get("executor") == "ray" and h.name != cluster.head:
        return []
    return [vllm, "serve", str(cluster.settings["model"]), *args]


def removed_flags(argv: Sequence[str]) -> list[tuple[str, str]]:
    """(flag, what to do instead) for every flag in argv that vLLM no longer accepts."""
    return [(flag_name(a), REMOVED_FLAGS[flag_name(a)]) for a in argv if flag_name(a) in REMOVED_FLAGS]


# Runs inside an interpreter that has vLLM: reads [[model, argv], ...] as JSON on stdin, writes [error-or-null, ...].
_PARSER_SCRIPT = r"""
import contextlib, io, json, sys
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser

def check(model, argv):
    root = FlexibleArgumentParser(prog="vllm")
    subs = root.add_subparsers(dest="subparser")
    sc = ServeSubcommand()
    sc.subparser_init(subs)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(io.StringIO()):
            sc.validate(root.parse_args(["serve", model, *argv]))
    except SystemExit as exc:
        if exc.code in (0, None):
            return None
        lines = [ln for ln in buf.getvalue().strip().splitlines() if ln.strip()]
        return lines[-1] if lines else "vLLM's parser exited %s" % exc.code
    except Exception as exc:
        return "%s: %s" % (type(exc).__name__, exc)
    return None

items = json.load(sys.stdin)
json.dump([check(m, a) for m, a in items], sys.stdout)
"""


def vllm_parser_errors(items: Sequence[tuple[str, Sequence[str]]], python: str | None = None,
                       pythonpath: str | None = None, timeout: float = 900) -> list[str | None]:
    """Check each `vllm serve MODEL argv` with vLLM's own parser (no engine start): None when accepted, else the
    parser's message. In this interpreter when `python` is None (vLLM must be importable), else in `python` (e.g. a
    vLLM venv's interpreter; `pythonpath` becomes its PYTHONPATH) in one batch. Importing vLLM takes 10-20 s or more.
    Raises RuntimeError when the external interpreter cannot run the check."""
    import json
    import subprocess
    import sys

    payload = json.dumps([[m, list(a)] for m, a in items])
    if python is None:
        python = sys.executable
        if not vllm_available():
            raise RuntimeError("the vllm package is not importable here")
    env = None
    if pythonpath:
        import os

        env = dict(os.environ, PYTHONPATH=pythonpath)
    try:
        p = subprocess.run([python, "-c", _PARSER_SCRIPT], input=payload, capture_output=True, text=True,
                           timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"cannot run {python}: {exc}") from None
    try:
        out = json.loads(p.stdout)
    except json.JSONDecodeError:
        tail = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        raise RuntimeError(f"{python} could not run vLLM's parser: {tail}") from None
    return [None if x is None else str(x) for x in out]


def vllm_parser_error(model: str, argv: Sequence[str]) -> str | None:
    """One argv through vLLM's parser in this interpreter (None also when vLLM is not importable)."""
    if not vllm_available():
        return None
    return vllm_parser_errors([(model, argv)])[0]


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None
