"""Drift as one JSON object: per host its state and drifted resources (task, role, kind, resource, diff)."""

from __future__ import annotations

import json
from typing import Any

from provisioner.results import RunResult

SCHEMA = "provision.drift/v1"


def to_dict(result: RunResult) -> dict[str, Any]:
    hosts: dict[str, Any] = {}
    for name in sorted(result.hosts):
        h = result.hosts[name]
        hosts[name] = {
            "state": "unreachable" if h.unreachable else ("check_failed" if h.failed else
                                                          ("drifted" if h.drift else
                                                           ("not_checked" if h.state == "not_run" else "clean"))),
            "drift": [
                {"kind": d.kind, "resource": d.resource, "task": d.task, "role": d.role, "action": d.action,
                 "diff": d.diff, "tier": d.tier}
                for d in h.drift
            ],
            "errors": [{"task": f.task, "role": f.role, "message": f.message} for f in h.failures],
            "unreachable_message": h.unreachable_message,
            # check mode: applying the playbooks would leave the host needing a reboot (the kernel module changes)
            "reboot_required": h.reboot_required,
            "reboot_reason": h.reboot_reason,
            # two-tier drift: 1 = clean by the probe alone, 2 = checked by Ansible (tier_reason: why)
            "tier": h.tier,
            "tier_reason": h.tier_reason,
            "probe_changes": h.probe_changes,
        }
    return {
        "schema": SCHEMA,
        "inventory": result.inventory,
        "playbook": result.playbook,
        "limit": result.limit,
        "started": result.started,
        "duration": round(result.duration, 3),
        "drift_found": bool(result.drift),
        "complete": not result.unreachable_hosts and not result.failed_hosts and result.error is None,
        "error": result.error,
        "summary": {
            "hosts": len(result.targeted),
            "drifted_hosts": sorted({d.host for d in result.drift}),
            "drifted_resources": len(result.drift),
            "unreachable_hosts": result.unreachable_hosts,
            "check_failed_hosts": result.failed_hosts,
            "reboot_required_hosts": result.reboot_hosts,
            # hosts per tier and why tier 2 ran ({} for a drift without tiers)
            "tiers": result.tiers,
        },
        "hosts": hosts,
        "run_dir": result.run_dir,
        # a sharded run (--exec-node): node, hosts, status, rc, duration, error per execution node; [] otherwise
        "shards": result.shards,
    }


def render(result: RunResult) -> str:
    return json.dumps(to_dict(result), indent=2, default=str) + "\n"
