"""One JSON object for automation: per-host counts, failed tasks with messages, duration, artifact dir."""

from __future__ import annotations

import json
from typing import Any

from provisioner.results import RunResult

SCHEMA = "provision.run/v1"


def to_dict(result: RunResult) -> dict[str, Any]:
    d: dict[str, Any] = {"schema": SCHEMA}
    d.update(result.to_dict())
    d["failures"] = [
        {"host": f.host, "task": f.task, "role": f.role, "play": f.play, "action": f.action, "message": f.message}
        for f in result.failures
    ]
    return d


def render(result: RunResult) -> str:
    return json.dumps(to_dict(result), indent=2, sort_keys=False, default=str) + "\n"
