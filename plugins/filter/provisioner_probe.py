"""Filters of the generation probe (provisioner/probes/generate.py).

`provisioner_probe_launch`: the launch wait's verdict on one head's generation probe (provisioner/probes/generate.py):
the record to write on the head (JSON text, "" = keep the one there) and an error ("" = fine).

    item.0 | provisioner.gpu.provisioner_probe_launch(item.1, MODEL, vllm_probe_prompt, vllm_probe_max_tokens)

item.0: the uri result of the probe (its loop item is the cluster's plan entry), item.1: the slurp of the record.

`provisioner_probe_servers`: the balancer's probe file ({"servers": {"addr:port": {model, prompt, max_tokens,
expected, key}}}) from the slurped launch records of the heads (loop items: serving_lb_fleet.heads) and their keys.
A head without a usable record still has to generate (expected null).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any


def provisioner_probe_launch(result: Mapping[str, Any], slurped: Mapping[str, Any], model: str, prompt: str,
                             max_tokens: Any) -> dict[str, str]:
    from provisioner.probes import generate

    item = result.get("item") or {}
    cluster, model = str(item.get("name", "")), str(model)
    text = generate.answer_text(result.get("json"))
    if text is None:
        return {"write": "", "error": f"cluster {cluster}: the generation probe got no completion back"}
    raw = slurped.get("content")
    record = generate.parse_record(base64.b64decode(raw) if raw else None)
    new, error = generate.launch_decision(text, record, configuration_changed=bool(item.get("changed")),
                                          cluster=cluster, model=model, prompt=str(prompt),
                                          max_tokens=int(max_tokens))
    return {"write": json.dumps(new, sort_keys=True) + "\n" if new else "", "error": error}


def provisioner_probe_servers(slurps: list[Mapping[str, Any]], keys: Mapping[str, Any], prompt: str,
                              max_tokens: Any) -> dict[str, Any]:
    from provisioner.probes import generate

    servers: dict[str, Any] = {}
    for r in slurps:
        head = r.get("item") or {}
        raw = r.get("content")
        rec = generate.parse_record(base64.b64decode(raw) if raw else None)
        model = str(head.get("model", ""))
        if rec is not None and rec["model"] == model:
            spec = {"prompt": rec["prompt"], "max_tokens": rec["max_tokens"], "expected": rec["text"]}
        else:
            spec = {"prompt": str(prompt), "max_tokens": int(max_tokens), "expected": None}
        servers[f"{head.get('address')}:{head.get('port')}"] = {
            "host": str(head.get("host", "")), "model": model, **spec, "key": str(keys.get(head.get("host"), "") or "")}
    return {"servers": dict(sorted(servers.items()))}


class FilterModule:
    def filters(self):
        return {"provisioner_probe_launch": provisioner_probe_launch,
                "provisioner_probe_servers": provisioner_probe_servers}
