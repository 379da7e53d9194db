"""`provisioner_vllm_launch`: the fleet plan's clusters (start order included) with what this run found: whether any
member's files changed, whether every member is still in the play. Pure data in, data out; no Fleet is rebuilt.

    vllm_plan: "{{ provisioner_plan.clusters | provisioner.gpu.provisioner_vllm_launch(hostvars, ansible_play_hosts) }}"
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping


def provisioner_vllm_launch(clusters: Iterable[Mapping[str, Any]], hostvars: Mapping[str, Any],
                            play_hosts: Iterable[str]) -> list[dict[str, Any]]:
    """Clusters with at least one member in the play: the plan's name, head, port, members and `steps`, plus
    `changed` (a member's units or env file changed in this run) and `complete` (every member still in the play:
    a failed member keeps its cluster untouched)."""
    alive = {str(h) for h in play_hosts}
    out = []
    for c in clusters:
        members = [str(m) for m in c.get("members") or []]
        if not alive.intersection(members):
            continue
        changed = any(_true(hostvars[m].get("vllm_launch_changed")) for m in members if m in alive)
        out.append({**c, "changed": changed, "complete": all(m in alive for m in members)})
    return out


def _true(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "yes", "1", "on")
    return bool(v)


class FilterModule:
    def filters(self):
        return {"provisioner_vllm_launch": provisioner_vllm_launch}
