"""provisioner.alerts.payload: Alertmanager's webhook body read as data, and what acts (pure)."""

from __future__ import annotations

import pytest

from provisioner.alerts.payload import Alert, PayloadError, decide, parse, safe


def body(*alerts: dict) -> dict:
    return {"version": "4", "status": "firing", "alerts": list(alerts)}


def alert(status: str = "firing", fp: str = "a1b2", starts: str = "2026-12-07T08:00:00Z", **labels: str) -> dict:
    return {"status": status, "labels": labels, "annotations": {}, "startsAt": starts, "fingerprint": fp,
            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": ""}


def test_parse_keeps_key_labels_status() -> None:
    [a] = parse(body(alert(host="n1", alertname="ProvisionNodeXidFatal", remediate="true")))
    assert (a.key, a.host, a.name, a.status) == ("a1b2@2026-12-07T08:00:00Z", "n1", "ProvisionNodeXidFatal", "firing")


@pytest.mark.parametrize("doc, why", [
    ([], "not a JSON object"),
    ({"version": "3", "alerts": []}, "only Alertmanager's webhook version 4"),
    ({"version": "4", "alerts": {}}, "'alerts' is not a list"),
    (body(alert(status="pending")), "neither firing nor resolved"),
    (body({**alert(), "labels": {"host": 1}}), "labels is not an object of strings"),
    (body(alert(fp="x y")), "fingerprint or startsAt missing or not plain text"),
    (body(alert(starts="")), "fingerprint or startsAt missing or not plain text"),
])
def test_parse_refuses_what_is_not_a_webhook_body(doc: object, why: str) -> None:
    with pytest.raises(PayloadError, match=why):
        parse(doc)


def test_decide() -> None:
    nodes = {"n1", "n2"}
    fire = Alert("firing", {"host": "n1", "remediate": "true"}, "f", "s")
    assert decide(fire, nodes, ()).act
    assert decide(fire, nodes, {"f@s"}).why == "duplicate"
    assert decide(Alert("resolved", fire.labels, "f", "s"), nodes, ()).why == "resolved"
    assert decide(Alert("firing", {"host": "n1"}, "f", "s"), nodes, ()).why == "not an acting alert"
    assert decide(Alert("firing", {"host": "lb1", "remediate": "true"}, "f", "s"), nodes, ()).why == "unknown host"
    assert decide(Alert("firing", {"remediate": "true"}, "f", "s"), nodes, ()).why == "unknown host"


def test_safe_keeps_log_lines_one_line() -> None:
    assert safe("n1\n2026 fake line\x1b[31m") == "n1?2026 fake line?[31m"
    assert len(safe("x" * 500)) == 120


def test_a_trailing_newline_is_not_plain_text() -> None:
    with pytest.raises(PayloadError):
        parse(body(alert(fp="a1b2\n")))
    assert decide(Alert("firing", {"host": "n1\n", "remediate": "true"}, "f", "s"), {"n1"}, ()).why == "unknown host"
