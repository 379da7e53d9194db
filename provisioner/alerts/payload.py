"""Alertmanager's webhook payload (version 4) read as data, and what the receiver does with each alert: pure.

An alert acts when it is firing, carries the label `remediate="true"` (the node-faults rules set it) and names a GPU
node of the inventory in `host`. Its key is fingerprint + startsAt: Alertmanager resends a firing alert on every
group_interval/repeat_interval with the same key, so each fault is acted on once; a fault that clears and comes back
is a new key. A resolved alert never takes anything out: the receiver only queues the return of a node whose alert
it acted on (server.Receiver; the return itself is remediate's decision, on a passing health gate).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

#: What a key, a host name and a label value may look like before they reach a log line or an argv.
_SAFE = re.compile(r"[A-Za-z0-9_.:@+=,/-]{1,200}")


class PayloadError(ValueError):
    """The body is not an Alertmanager webhook payload (answered 400)."""


@dataclass(frozen=True)
class Alert:
    status: str  # firing | resolved
    labels: dict[str, str]
    fingerprint: str
    starts_at: str

    @property
    def key(self) -> str:
        return f"{self.fingerprint}@{self.starts_at}"

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def host(self) -> str:
        return self.labels.get("host", "")


@dataclass(frozen=True)
class Decision:
    alert: Alert
    act: bool
    why: str  # one phrase, for the log line and the /metrics outcome label


def parse(doc: Any) -> list[Alert]:
    """The alerts of a webhook body (already JSON-decoded); PayloadError naming what is wrong."""
    if not isinstance(doc, Mapping):
        raise PayloadError("the body is not a JSON object")
    if str(doc.get("version", "")) != "4":
        raise PayloadError(f"version {str(doc.get('version'))[:20]!r}: only Alertmanager's webhook version 4 is read")
    alerts = doc.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("'alerts' is not a list")
    out = []
    for i, a in enumerate(alerts):
        if not isinstance(a, Mapping):
            raise PayloadError(f"alerts[{i}] is not an object")
        labels = a.get("labels")
        if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
            raise PayloadError(f"alerts[{i}].labels is not an object of strings")
        status, fp, starts = a.get("status"), a.get("fingerprint"), a.get("startsAt")
        if status not in ("firing", "resolved"):
            raise PayloadError(f"alerts[{i}].status is neither firing nor resolved")
        if not (isinstance(fp, str) and _SAFE.fullmatch(fp) and isinstance(starts, str) and _SAFE.fullmatch(starts)):
            raise PayloadError(f"alerts[{i}]: fingerprint or startsAt missing or not plain text")
        out.append(Alert(status, {str(k): v for k, v in labels.items()}, fp, starts))
    return out


def decide(alert: Alert, gpu_nodes: Collection[str], seen: Collection[str]) -> Decision:
    """Act on this alert, or why not (one phrase)."""
    if alert.status != "firing":
        return Decision(alert, False, "resolved")
    if alert.labels.get("remediate") != "true":
        return Decision(alert, False, "not an acting alert")
    if alert.key in seen:
        return Decision(alert, False, "duplicate")
    if not _SAFE.fullmatch(alert.host) or alert.host not in gpu_nodes:
        return Decision(alert, False, "unknown host")
    return Decision(alert, True, "act")


def safe(text: str, limit: int = 120) -> str:
    """A label value from the payload for a log line: printable ASCII only, bounded (what a node sent is data)."""
    return "".join(c if 32 <= ord(c) < 127 else "?" for c in text[:limit])
