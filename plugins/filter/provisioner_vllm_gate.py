"""The in-service gate of the vLLM launch (docs/vllm.md, "The in-service gate"). Pure functions, no Ansible imports:

    hostvars | provisioner.gpu.provisioner_vllm_gate_hosts(ansible_play_hosts)
        -> every member (sorted) of each vLLM cluster that has a gated host in the play: the hosts whose mark is read
    vllm_launch_marks | provisioner.gpu.provisioner_vllm_gate(vllm_facts, path, inventory_file)
        -> {cluster, members, held, missing: {host: why}, message, summary} for this host's cluster

A cluster (TP x PP across its members) only launches whole, so ONE member without the mark holds the whole cluster
back: no member's unit, env file or service is touched.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping


def provisioner_vllm_gate_hosts(hostvars: Mapping[str, Any], play_hosts: Iterable[str]) -> list[str]:
    """Members of the clusters of the play's hosts that carry `vllm_launch_gated` (members outside the play, e.g.
    outside --limit, included: a cluster launches with all of them)."""
    out: set[str] = set()
    for h in play_hosts:
        hv = hostvars[h]
        facts = hv.get("vllm_facts")
        if facts and _true(hv.get("vllm_launch_gated")):
            out.update(str(m) for m in facts.get("members") or [])
    return sorted(out)


def _true(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "yes", "1", "on")
    return bool(v)


def _why(res: Mapping[str, Any] | None, path: str) -> str | None:
    """None when `res` (one item of the registered stat loop) shows the mark, else why it does not count."""
    if res is None:
        return f"{path} was not read"
    if res.get("unreachable"):
        return f"{path} could not be read (unreachable: {str(res.get('msg') or '').strip()[:200]})"
    if res.get("failed"):
        return f"{path} could not be read ({str(res.get('msg') or 'stat failed').strip()[:200]})"
    if res.get("skipped"):
        return f"{path} was not read"
    st = res.get("stat") or {}
    if not st.get("exists"):
        return f"no {path}"
    if not st.get("isreg", True):
        return f"{path} is not a regular file"
    return None


def provisioner_vllm_gate(marks: Mapping[str, Any] | None, facts: Mapping[str, Any] | None, path: str,
                          inventory: str = "INVENTORY") -> dict[str, Any]:
    """Verdict for the cluster in `facts` (this host's vllm_facts) from the registered stat loop `marks`."""
    if not facts:
        return {"cluster": None, "members": [], "held": False, "missing": {}, "message": "", "summary": ""}
    by_host: dict[str, Mapping[str, Any]] = {}
    for r in (marks or {}).get("results") or []:
        if isinstance(r, Mapping) and r.get("item") is not None:
            by_host[str(r["item"])] = r
    cluster = str(facts.get("cluster"))
    members = [str(m) for m in facts.get("members") or []]
    missing = {m: why for m in members if (why := _why(by_host.get(m), path)) is not None}
    if not missing:
        return {"cluster": cluster, "members": members, "held": False, "missing": {}, "message": "", "summary": ""}
    who = ", ".join(f"{h} ({why})" for h, why in missing.items())
    hosts = " ".join(missing)
    message = (
        f"vLLM cluster {cluster} is not launched: not every member is in service: {who}. "
        f"A cluster starts only with all its members ({', '.join(members)}), so nothing of {cluster} was changed "
        f"on any of them. Onboard the host(s) (health gate, then the mark): provision onboard {inventory} {hosts}; "
        f"or set vllm_launch_require_in_service: false for this cluster to launch without the mark."
    )
    summary = f"vLLM cluster {cluster} held back, not in service: {who}"
    return {"cluster": cluster, "members": members, "held": True, "missing": missing, "message": message,
            "summary": summary}


class FilterModule:
    def filters(self):
        return {"provisioner_vllm_gate_hosts": provisioner_vllm_gate_hosts,
                "provisioner_vllm_gate": provisioner_vllm_gate}
