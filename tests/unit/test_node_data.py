"""What a node sends back is data (issue 43, class 2): typed, bounded, and escaped before a Prometheus file."""

from __future__ import annotations

import json
import re

import pytest

from provisioner.bmc.firmware import items_from_node
from provisioner.probes.health import MAX_CHECKS, MAX_MESSAGE, parse_output, render_prometheus
from provisioner.probes.ssh import ExecResult
from provisioner.reports.textfile import escape_label, sample, sample_value
from provisioner.reports.untrusted import node_text

# one sample line of the text exposition format: name{label="escaped",...} value
_SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\n"])*",?)*\})? '
                     r'(-?[0-9.e+]+|NaN|[+-]Inf)')


def exposition(text: str) -> list[tuple[str, dict[str, str]]]:
    """(metric, labels) per sample line; every line must be a comment or a well-formed sample."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _SAMPLE.fullmatch(line)
        assert m, f"not a sample line: {line!r}"
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out.append((m.group(1), labels))
    return out


def node(*records: object, summary: bool = True) -> ExecResult:
    lines = [json.dumps(r) for r in records]
    if summary:
        lines.append(json.dumps({"check": "summary", "status": "pass", "failed": [], "host": "n1"}))
    return ExecResult("n1", ok=True, rc=0, stdout="\n".join(lines) + "\n")


def test_a_node_cannot_forge_a_sample_for_another_host() -> None:
    forged = '1\nprovisioner_node_health_ok{host="n2"} 1'
    h = parse_output("n1", node({"check": "allreduce", "status": "pass", "message": "ok",
                                 "found": {"busbw_gbps": forged, "gpus": 8}},
                                {"check": "gpu", "status": "pass",
                                 "message": 'x"}\nprovisioner_node_health_ok{host="n2"} 1'}))
    text = render_prometheus({"n1": h}, now=0)
    samples = exposition(text)
    assert {lab.get("host") for _, lab in samples if lab} == {"n1"}
    assert "provisioner_node_health_allreduce_busbw_gbps" not in text  # not a number: no sample


@pytest.mark.parametrize("name", [7, None, ["gpu"], {"a": 1}, "gpu\nprovisioner_x 1", 'a"b', "x" * 40])
def test_a_malformed_check_name_is_an_error_not_a_crash(name: object) -> None:
    h = parse_output("n1", node({"check": name, "status": "pass", "message": ""}))
    assert not h.ok and h.error and "malformed" in h.error and "\n" not in h.error
    exposition(render_prometheus({"n1": h}, now=0))  # renders, one host, well-formed


@pytest.mark.parametrize("status", ["PASS", 1, None, "pass\n"])
def test_an_unknown_status_is_an_error(status: object) -> None:
    h = parse_output("n1", node({"check": "gpu", "status": status, "message": ""}))
    assert not h.ok and "status" in (h.error or "")


def test_messages_and_details_are_bounded() -> None:
    h = parse_output("n1", node({"check": "gpu", "status": "fail", "message": "\x1b[31m" + "m" * 10_000 + "\nx",
                                 "found": {"blob": "b" * 100_000}}))
    c = h.checks[0]
    assert len(c["message"]) == MAX_MESSAGE and "\x1b" not in c["message"] and "\n" not in c["message"]
    assert set(c["found"]) == {"dropped"}


def test_too_many_checks_or_too_much_output() -> None:
    many = [{"check": f"c{i}", "status": "pass", "message": ""} for i in range(MAX_CHECKS + 5)]
    h = parse_output("n1", node(*many))
    assert len(h.checks) == MAX_CHECKS and not h.ok
    big = ExecResult("n1", ok=True, rc=0, stdout="x" * (2 * 1024 * 1024))
    assert "output" in (parse_output("n1", big).error or "")


def test_escape_label_keeps_any_value_in_its_quotes() -> None:
    for v in ["a\nb", 'q"', "back\\", "\r\x00\x1b\x85\u2028", 12, None, "x" * 1000]:
        line = sample("m", {"host": "n1", "v": v}, 1)
        assert line is not None and len(exposition(line)) == 1
    assert len(escape_label("x" * 1000)) <= 256


def test_sample_value_only_numbers() -> None:
    assert [sample_value(v) for v in (1, 2.5, True, float("nan"), "1", "1\nx", None)] == \
        ["1", "2.5", "1", "NaN", None, None, None]


def test_node_text() -> None:
    assert node_text("a\nb\x1b[0m", 10) == "a b [0m"
    assert node_text({"x": 1}) == "<dict>" and len(node_text("y" * 999, 50)) == 50


def test_firmware_lines_from_a_node_are_data() -> None:
    items = items_from_node("gpu 0 96.00.89.00.01\nhca mlx5_0\x1b[2J 28.39.1002\nhca mlx5_1 28.39.1002\n")
    assert [(i.id, i.version) for i in items] == [("GPU0", "96.00.89.00.01"), ("mlx5_1", "28.39.1002")]


def test_probe_free_text_is_one_bounded_line() -> None:
    from provisioner.probes.parsers import parse_probe

    f = parse_probe("@@pv@@ begin kernel\n6.1.0\x1b]0;owned\x07-amd64\n@@pv@@ end kernel 0\n"
                    "@@pv@@ begin arch\n" + "x" * 500 + "\n@@pv@@ end arch 0\n")
    assert f.kernel is not None and "\x1b" not in f.kernel and "\x07" not in f.kernel
    assert f.arch is not None and len(f.arch) == 64


def test_inflight_reads_numbers_only() -> None:
    from provisioner.day2.drain import inflight

    text = ('vllm:num_requests_running{model="m"} abc\nvllm:num_requests_waiting{model="m"} NaN\n'
            'vllm:num_requests_running{model="m"} 3\nvllm:num_requests_waiting{model="m"} +Inf\n')
    assert inflight(text) == 3
