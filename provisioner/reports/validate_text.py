"""`provision validate` default report: a rich table per cluster (sizing), then the findings, then a verdict."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from provisioner.reports import count
from provisioner.rules import Finding
from provisioner.rules.result import ClusterSummary, ValidationResult
from provisioner.sizing import human

MAX_PER_CODE = 25  # text output only; --format json lists every finding


def _cluster_table(c: ClusterSummary) -> Table:
    """One table per cluster, a row per quantity (fits 80 columns)."""
    t = Table(title=f"cluster [bold]{escape(c.name)}[/]", title_justify="left", show_header=False, min_width=60)
    t.add_column("what", style="bold")
    t.add_column("value", overflow="fold")

    def b(n: int | None) -> str:
        return "?" if n is None else f"{human(n)} ({n:,} B)"

    seqs = "?"
    if c.max_full_length_seqs is not None:
        seqs = f"{c.max_full_length_seqs} x {c.max_model_len} tokens (max_num_seqs {c.max_num_seqs})"
    ranks = ", ".join(f"{m} (rank {i})" for i, m in enumerate(c.members)) or "-"
    t.add_row("nodes", escape(f"{len(c.members)}: {ranks}"))
    t.add_row("GPUs", escape(f"{c.gpus_per_node} x {c.gpu_model} per node") if c.gpu_model else "?")
    t.add_row("model", escape(c.model or "?"))
    t.add_row("TP x PP", f"{c.tensor_parallel_size} x {c.pipeline_parallel_size}")
    t.add_row("weights/GPU", b(c.weight_bytes_per_gpu))
    t.add_row("KV cache/token", b(c.kv_cache_bytes_per_token) + " whole model")
    t.add_row("KV cache/token/GPU", b(c.kv_cache_bytes_per_token_per_gpu))
    t.add_row("KV cache/GPU", b(c.kv_cache_bytes_per_gpu))
    t.add_row("full-length seqs", seqs)
    return t


def _where(f: Finding) -> str:
    return "/".join(x for x in (f.group, f.host) if x) or "-"


def print_report(result: ValidationResult, console: Console) -> None:
    for c in result.clusters:
        console.print(_cluster_table(c))
    if result.findings:
        # one finding per line whatever the width (soft_wrap: never folded, so grep and logs see whole findings;
        # a table would squeeze long messages into slivers)
        console.print("[bold]findings[/]")
        shown: Counter[str] = Counter()
        hidden: Counter[str] = Counter()
        for f in sorted(result.findings, key=lambda f: (f.severity != "error", f.code)):
            if shown[f.code] >= MAX_PER_CODE:
                hidden[f.code] += 1
                continue
            shown[f.code] += 1
            sev = "[red]error[/]  " if f.severity == "error" else "[yellow]warning[/]"
            var = f" ({escape(f.var)})" if f.var else ""
            console.print(f"{sev} [bold]{f.code}[/] {escape(_where(f))}{var}: {escape(f.message)}", highlight=False,
                          soft_wrap=True)
        for code, n in hidden.items():
            console.print(f"... and {n} more {code} finding(s) (--format json lists all)", soft_wrap=True)
    n_e, n_w = len(result.errors), len(result.warnings)
    verdict = "[bold green]valid[/]" if result.ok else "[bold red]invalid[/]"
    console.print(f"{escape(str(result.source))}: {count(result.hosts, 'host')}, "
                  f"{count(len(result.clusters), 'cluster')}: "
                  f"{verdict} ({n_e} error(s), {n_w} warning(s))", highlight=False, soft_wrap=True)
