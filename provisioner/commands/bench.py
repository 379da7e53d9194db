"""`provision bench INVENTORY --cluster NAME`: `vllm bench serve` against a cluster, judged against its SLOs.

Runs vLLM's own benchmark client (random dataset) either on the cluster's head over SSH (default: the head has the
pinned vLLM and the model's tokenizer; the API key is read there from the env file and never leaves the host) or
on this machine (`--local`, with a `vllm` from --vllm or PATH). Reports P50/P99 TTFT, TPOT and E2E latency and
request throughput; compares them with the SLOs the cluster declares in `vllm_cluster`:

    slo_p50_ttft_ms, slo_p99_ttft_ms, slo_p50_tpot_ms, slo_p99_tpot_ms, slo_p50_e2el_ms, slo_p99_e2el_ms
        (upper bounds, milliseconds)
    slo_min_request_throughput  (lower bound, requests/s)

Exit codes: 0 every declared SLO met, 1 an SLO breached / failed requests / the benchmark could not run, 2 usage.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from provisioner.commands.common import VAULT_HELP, unwrap, use_vault
from provisioner.errors import Exit, UsageError
from provisioner.model import Cluster, Fleet, Host

err = Console(stderr=True, highlight=False, soft_wrap=True)  # one line per message at any width (grep, logs)
out = Console(highlight=False)

HELP = unwrap("""Benchmark a vLLM cluster with `vllm bench serve` and judge it against its SLOs.

Runs the client against the cluster's head (on the head over SSH, or --local) and reports P50/P99 TTFT, TPOT, E2E
latency and request throughput against the SLOs the cluster declares (vllm_cluster.slo_p99_ttft_ms,
slo_p99_tpot_ms, slo_p99_e2el_ms, their p50 forms, slo_min_request_throughput).

Exit codes: 0 SLOs met, 1 SLO breached or the benchmark failed, 2 usage.""")

#: (metric key in vLLM's result JSON, SLO variable, unit, "max" = upper bound / "min" = lower bound)
METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("p50_ttft_ms", "slo_p50_ttft_ms", "ms", "max"),
    ("p99_ttft_ms", "slo_p99_ttft_ms", "ms", "max"),
    ("p50_tpot_ms", "slo_p50_tpot_ms", "ms", "max"),
    ("p99_tpot_ms", "slo_p99_tpot_ms", "ms", "max"),
    ("p50_e2el_ms", "slo_p50_e2el_ms", "ms", "max"),
    ("p99_e2el_ms", "slo_p99_e2el_ms", "ms", "max"),
    ("request_throughput", "slo_min_request_throughput", "req/s", "min"),
)


def bench_args(*, base_url: str, model: str, tokenizer: str, input_len: int, output_len: int, num_prompts: int,
               concurrency: int, result_dir: str, seed: int) -> list[str]:
    """Arguments after `vllm bench serve` (see ../shared/reference/vllm.md, "Benchmark")."""
    return [
        "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", tokenizer,
        "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--seed", str(seed),
        "--ignore-eos",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", result_dir, "--result-filename", "result.json",
    ]


def judge(result: dict[str, Any], settings: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per metric: value, SLO (or None), ok."""
    rows = []
    for key, slo_var, unit, kind in METRICS:
        value = result.get(key)
        slo = settings.get(slo_var)
        ok = None
        if slo is not None and value is not None:
            ok = value <= float(slo) if kind == "max" else value >= float(slo)
        elif slo is not None:
            ok = False
        rows.append({"metric": key, "value": value, "unit": unit, "slo_var": slo_var, "slo": slo, "ok": ok,
                     "kind": kind})
    return rows


def _ssh_argv(host: Host) -> list[str]:
    v = host.vars
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15"]
    key = v.get("ansible_ssh_private_key_file")
    if key:
        argv += ["-i", str(key)]
    if v.get("ansible_port"):
        argv += ["-p", str(v["ansible_port"])]
    for name in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        if v.get(name):
            argv += shlex.split(str(v[name]))
    user = v.get("ansible_user")
    return argv + [f"{user}@{host.address}" if user else host.address]


def _run_on_head(fleet: Fleet, cluster: Cluster, args: list[str], venv: str, env_file: str,
                 timeout: int) -> dict[str, Any]:
    assert cluster.head is not None  # the caller checked the cluster has members
    head = fleet.hosts[cluster.head]
    rdir = "/tmp/provision-bench"
    script = (
        "set -e; "
        f"rm -rf {rdir}; mkdir -p {rdir}; "
        # the API key stays on the host: read from the env file the units use
        f"if [ -r {shlex.quote(env_file)} ]; then "
        f"k=$(sed -n 's/^VLLM_API_KEY=\"\\(.*\\)\"$/\\1/p' {shlex.quote(env_file)}); "
        "[ -n \"$k\" ] && export OPENAI_API_KEY=\"$k\"; fi; "
        "export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} VLLM_NO_USAGE_STATS=1 TORCH_COMPILE_DISABLE=1; "
        f"{shlex.quote(venv)}/bin/vllm bench serve {' '.join(shlex.quote(a) for a in args)} >{rdir}/log 2>&1 "
        f"|| {{ tail -n 25 {rdir}/log >&2; exit 3; }}; "
        f"cat {rdir}/result.json"
    )
    p = subprocess.run([*_ssh_argv(head), script], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"vllm bench serve on {head.name} failed (rc {p.returncode}): "
                           + (p.stderr.strip()[-2000:] or p.stdout.strip()[-2000:]))
    return json.loads(p.stdout)


def _run_local(vllm: str, args: list[str], api_key: str | None, timeout: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="provision-bench-") as d:
        args = [a if a != "/tmp/provision-bench" else d for a in args]
        env = dict(os.environ, VLLM_NO_USAGE_STATS="1", TORCH_COMPILE_DISABLE="1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        if api_key:
            env["OPENAI_API_KEY"] = api_key
        p = subprocess.run([vllm, "bench", "serve", *args], capture_output=True, text=True, env=env,
                           timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed (rc {p.returncode}): {(p.stdout + p.stderr)[-2000:]}")
        return json.loads((Path(d) / "result.json").read_text())


def register(app: typer.Typer) -> None:
    @app.command("bench", help=HELP)
    def bench_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file.", show_default=False)],
        cluster_name: Annotated[str, typer.Option(
            "--cluster", help="The vLLM cluster (inventory group).", show_default=False)],
        num_prompts: Annotated[int, typer.Option("--num-prompts", min=1, help="Requests sent.")] = 200,
        input_len: Annotated[int, typer.Option("--input-len", min=1, help="Random prompt length (tokens).")] = 1024,
        output_len: Annotated[int, typer.Option("--output-len", min=1, help="Tokens generated per request.")] = 128,
        concurrency: Annotated[int, typer.Option("--max-concurrency", min=1, help="Requests in flight.")] = 16,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the random dataset.")] = 0,
        local: Annotated[bool, typer.Option(
            "--local", help="Run the client here instead of on the head over SSH.")] = False,
        vllm: Annotated[str | None, typer.Option(
            "--vllm", help="vllm executable for --local (default: PATH).")] = None,
        tokenizer: Annotated[str | None, typer.Option(
            "--tokenizer", help="Tokenizer path/name (default: the cluster's model).")] = None,
        json_out: Annotated[Path | None, typer.Option("--json", help="Also write the report as JSON here.")] = None,
        timeout: Annotated[int, typer.Option("--timeout", help="Seconds before the benchmark is abandoned.")] = 3600,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        from provisioner.inventory import load_fleet
        from provisioner.render import role_defaults

        fleet = load_fleet(inventory)
        cluster = fleet.clusters.get(cluster_name)
        if cluster is None:
            raise UsageError(f"no vLLM cluster {cluster_name!r} (clusters: {', '.join(sorted(fleet.clusters))})",
                             path=str(inventory))
        if not cluster.head:
            raise UsageError(f"cluster {cluster_name!r} has no members", path=str(inventory))
        s = dict(cluster.settings)
        head = fleet.hosts[cluster.head]
        defaults = role_defaults()
        hv = {**defaults, **head.vars}
        port = int(s.get("port", 8000))
        model_name = str(s.get("served_model_name") or s["model"])
        address = str(head.get("vllm_host_ip") or head.address)
        base_url = f"http://127.0.0.1:{port}" if not local else f"http://{address}:{port}"
        args = bench_args(base_url=base_url, model=model_name, tokenizer=tokenizer or str(s["model"]),
                          input_len=input_len, output_len=output_len, num_prompts=num_prompts,
                          concurrency=concurrency, result_dir="/tmp/provision-bench", seed=seed)
        where = "this machine" if local else f"{head.name} (over SSH)"
        err.print(f"bench {cluster_name}: {num_prompts} prompts, {input_len}->{output_len} tokens, concurrency "
                  f"{concurrency}, client on {where}, server {address}:{port}", markup=False)
        try:
            if local:
                exe = vllm or shutil.which("vllm")
                if not exe:
                    raise UsageError("--local needs a vllm executable (--vllm PATH or vllm on PATH)")
                key = os.environ.get("VLLM_API_KEY") or os.environ.get("OPENAI_API_KEY")
                from provisioner import vault

                value = hv.get("vllm_api_key")
                if not key and (isinstance(value, str) or vault.is_vaulted(value)):
                    if vault.is_vaulted(value):  # decrypted here, for the local client only
                        vault.require(fleet, [head.name], what="provision bench --local", only=("vllm_api_key",))
                    key = str(value)
                result = _run_local(exe, args, key, timeout)
            else:
                result = _run_on_head(fleet, cluster, args, str(hv["vllm_venv"]), str(hv["vllm_env_file"]), timeout)
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError, OSError) as exc:
            err.print(f"[bold red]bench failed:[/] {escape(str(exc))}")
            raise typer.Exit(int(Exit.FAIL)) from None

        rows = judge(result, s)
        completed, failed = int(result.get("completed") or 0), int(result.get("failed") or 0)
        breached = [r for r in rows if r["ok"] is False]
        table = Table(title=f"vllm bench serve · {escape(cluster_name)} · {completed} completed, {failed} failed")
        for col in ("metric", "value", "SLO", "status"):
            table.add_column(col)
        for r in rows:
            val = "-" if r["value"] is None else f"{r['value']:.2f} {r['unit']}"
            slo = "-" if r["slo"] is None else ("<= " if r["kind"] == "max" else ">= ") + f"{r['slo']} {r['unit']}"
            status = {None: "", True: "[green]ok[/]", False: "[bold red]BREACH[/]"}[r["ok"]]
            table.add_row(r["metric"], val, slo, status)
        out.print(table)
        report = {"cluster": cluster_name, "completed": completed, "failed": failed, "metrics": rows,
                  "ok": not breached and failed == 0 and completed > 0,
                  "config": {"num_prompts": num_prompts, "input_len": input_len, "output_len": output_len,
                             "max_concurrency": concurrency, "client": "local" if local else "head"},
                  "raw": {k: v for k, v in result.items() if isinstance(v, (int, float, str))}}
        if json_out:
            json_out.write_text(json.dumps(report, indent=2) + "\n")
        if failed or not completed:
            err.print(f"[bold red]{failed} request(s) failed, {completed} completed[/]")
        for r in breached:
            err.print(f"[bold red]SLO breach:[/] {escape(str(r['metric']))} = {r['value']} {r['unit']} "
                      f"({escape(str(r['slo_var']))} {r['slo']})")
        if not report["ok"]:
            raise typer.Exit(int(Exit.FAIL))
        sys.stdout.flush()
