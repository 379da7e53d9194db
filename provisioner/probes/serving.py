"""The generation probe run on a cluster head over SSH (one exec; the API key is read from the vLLM env file on the
head and never leaves it): `Ops.wait_healthy` (return, upgrade, remediate) and `provision status --nodes`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from provisioner.model import Fleet
from provisioner.probes import generate


def probe_head(fleet: Fleet, cluster: str, host: str, port: int) -> generate.Verdict:
    """One probe on `host` (the head of `cluster`) against 127.0.0.1:`port`, judged against its launch record."""
    from provisioner.monitoring import template_context
    from provisioner.probes.ssh import as_root, run_one, target_for

    v = template_context(fleet, roles=("provisioner_plan", "vllm_launch"), host=host)
    s = fleet.clusters[cluster].settings
    model = str(s.get("served_model_name") or s.get("model") or "")
    bound = float(v.get("vllm_probe_timeout") or generate.TIMEOUT_S)
    cmd = generate.head_command(port, model, record_file=str(v.get("vllm_probe_file") or generate.RECORD_FILE),
                                env_file=str(v.get("vllm_env_file") or "/etc/vllm/vllm.env"), bound_s=bound)
    t = target_for(fleet.hosts[host])
    r = run_one(t, as_root(cmd, t.user), timeout=bound + 30)
    if not r.ok:
        return generate.Verdict(False, f"unreachable: {r.error}")
    if r.rc != 0:
        return generate.Verdict(False, f"the probe exited {r.rc}: {(r.stderr.strip() or 'no output')[-200:]}")
    return generate.head_verdict(r.stdout, bound)


def probe_heads(fleet: Fleet) -> list[dict[str, Any]]:
    """Every cluster head, probed in parallel: cluster, head, server, serves, reason, latency_s."""
    from provisioner.monitoring import fleet_targets

    heads = fleet_targets(fleet)["heads"]

    def one(h: dict[str, Any]) -> dict[str, Any]:
        v = probe_head(fleet, h["cluster"], h["host"], int(h["port"]))
        return {"cluster": h["cluster"], "head": h["host"], "server": f"{h['address']}:{h['port']}",
                "serves": v.ok, "reason": v.reason,
                "latency_s": None if v.latency_s is None else round(v.latency_s, 2)}

    with ThreadPoolExecutor(max_workers=min(16, len(heads) or 1)) as pool:
        return list(pool.map(one, heads))


def line(p: dict[str, Any]) -> str:
    """One probe result as a status line."""
    what = f"generates its launch answer ({p['latency_s']} s)" if p["serves"] else f"NOT serving: {p['reason']}"
    return f"{p['cluster']} (head {p['head']}, {p['server']}): {what}"
