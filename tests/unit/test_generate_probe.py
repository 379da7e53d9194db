"""The generation probe's decisions (provisioner/probes/generate.py) and the filters that carry them into the
vllm_launch wait and the balancer's probe file (plugins/filter/provisioner_probe.py)."""

from __future__ import annotations

import base64
import importlib.util
import json

from provisioner import PROJECT_ROOT
from provisioner.plan import cluster_defaults
from provisioner.probes import generate
from provisioner.rules.cluster import setting_problems

_spec = importlib.util.spec_from_file_location("provisioner_probe",
                                               PROJECT_ROOT / "plugins/filter/provisioner_probe.py")
assert _spec and _spec.loader
filt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filt)

DONE = {"choices": [{"text": " jumps over", "index": 0}]}


def test_request_is_greedy_and_short() -> None:
    assert generate.request_body("m") == {"model": "m", "prompt": generate.PROMPT, "max_tokens": 4, "temperature": 0}


def test_verdicts() -> None:
    assert generate.verdict(200, DONE, 0.2, " jumps over", 10).ok
    assert generate.verdict(200, DONE, 0.2, None, 10).ok  # no launch record: any completion
    bad = generate.verdict(200, DONE, 0.2, " lazy dog", 10)
    assert not bad.ok and "at launch ' lazy dog'" in bad.reason
    slow = generate.verdict(200, DONE, 12.5, " jumps over", 10)
    assert not slow.ok and slow.reason == "answered in 12.5 s > 10 s"
    assert generate.verdict(0, None, 10, None, 10).reason == "no answer"
    assert generate.verdict(401, None, 0.1, None, 10).reason == "HTTP 401"
    assert generate.verdict(200, {"object": "error"}, 0.1, None, 10).reason == "not a completion"


def test_only_running_out_of_time_is_slow() -> None:
    """`slow` (the balancer's check then asks the engine's counters whether it is busy) only when the bound ran out
    or the right answer came late; a refused connection, an HTTP error or a wrong answer is never slow."""
    timed_out = generate.verdict(0, None, 10.0, " jumps over", 10, timed_out=True)
    assert not timed_out.ok and timed_out.slow and timed_out.reason == "no answer within 10 s"
    assert not generate.verdict(0, None, 0.01, " jumps over", 10).slow  # refused
    assert generate.verdict(200, DONE, 12.5, " jumps over", 10).slow
    assert generate.verdict(200, DONE, 12.5, None, 10).slow  # no launch record: any text
    assert not generate.verdict(200, DONE, 12.5, " lazy dog", 10).slow  # late and wrong
    assert not generate.verdict(503, None, 12.5, None, 10, timed_out=True).slow
    assert not generate.verdict(200, {"object": "error"}, 12.5, None, 10).slow


def test_engine_tokens_from_a_metrics_page_are_checked_data() -> None:
    page = "\n".join([
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        'vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 120.0',
        'vllm:generation_tokens_total{engine="1",model_name="a}b \\"q\\""} 3',  # braces and quotes in a label
        'vllm:generation_tokens_created{engine="0",model_name="tiny-llama"} 1.7e9',
        'vllm:prompt_tokens_total{engine="0",model_name="tiny-llama"} 40.0',
        'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 2.0',
        'vllm:prompt_tokens_total{engine="2"} NaN', 'vllm:prompt_tokens_total{engine="3"} -5',
        'vllm:prompt_tokens_total{engine="4"} many', "vllm:prompt_tokens_total{broken 9", "",
    ])
    assert generate.engine_tokens(page) == 163.0
    assert generate.engine_tokens("vllm:num_requests_running 1\n<html>not metrics</html>") is None
    assert generate.engine_tokens("") is None
    assert generate.busy(10.0, 11.0) and not generate.busy(10.0, 10.0)
    assert not generate.busy(None, 11.0) and not generate.busy(10.0, None) and not generate.busy(11.0, 10.0)


def test_records_from_a_node_are_checked_data() -> None:
    rec = generate.make_record(" jumps", "c1", "m", "p", 4)
    assert generate.parse_record(json.dumps(rec)) == rec
    for raw in (None, b"", b"not json", b"[]", json.dumps({**rec, "text": 3}), json.dumps({**rec, "max_tokens": "4"})):
        assert generate.parse_record(raw) is None


def test_launch_records_a_new_configuration_and_checks_a_known_one() -> None:
    kw = {"cluster": "c1", "model": "m", "prompt": "p", "max_tokens": 4}
    rec = generate.make_record(" jumps", "c1", "m", "p", 4)
    new, err = generate.launch_decision(" jumps", None, configuration_changed=False, **kw)
    assert new and new["text"] == " jumps" and not err
    assert generate.launch_decision(" jumps", rec, configuration_changed=False, **kw) == (None, "")
    new, err = generate.launch_decision(" garbage", rec, configuration_changed=False, **kw)
    assert new is None and "answered ' garbage'" in err and "' jumps' at launch" in err and "cluster c1" in err
    # a changed configuration (new weights, new args) or a changed probe request records the new answer
    new, err = generate.launch_decision(" other", rec, configuration_changed=True, **kw)
    assert new and new["text"] == " other" and not err
    new, err = generate.launch_decision(" other", rec, configuration_changed=False, **{**kw, "max_tokens": 6})
    assert new and new["max_tokens"] == 6 and not err


def test_launch_filter() -> None:
    item = {"name": "c1", "head": "node01", "changed": False}
    rec = json.dumps(generate.make_record(" jumps", "c1", "m", "p", 4))
    slurp = {"content": base64.b64encode(rec.encode()).decode()}
    out = filt.provisioner_probe_launch({"item": item, "json": {"choices": [{"text": " jumps"}]}}, slurp, "m", "p", "4")
    assert out == {"write": "", "error": ""}
    out = filt.provisioner_probe_launch({"item": item, "json": {"choices": [{"text": "zz"}]}}, slurp, "m", "p", 4)
    assert out["write"] == "" and "cluster c1" in out["error"]
    out = filt.provisioner_probe_launch({"item": item, "json": {"choices": [{"text": "zz"}]}}, {}, "m", "p", 4)
    assert json.loads(out["write"])["text"] == "zz" and out["error"] == ""
    assert filt.provisioner_probe_launch({"item": item, "json": None}, {}, "m", "p", 4)["error"]


def test_balancer_probe_file() -> None:
    rec = json.dumps(generate.make_record(" jumps", "c1", "tiny", "p", 4))
    slurps = [
        {"item": {"host": "node01", "address": "198.18.1.11", "port": 8000, "model": "tiny"},
         "content": base64.b64encode(rec.encode()).decode()},
        {"item": {"host": "node03", "address": "198.18.1.13", "port": 8000, "model": "tiny"}, "failed": True},
    ]
    out = filt.provisioner_probe_servers(slurps, {"node01": "k1", "node03": "k3"}, "q", 6)
    assert out["servers"]["198.18.1.11:8000"] == {"host": "node01", "model": "tiny", "prompt": "p", "max_tokens": 4,
                                                  "expected": " jumps", "key": "k1"}
    # no record yet: the head must still generate (any text), with the site's probe request
    assert out["servers"]["198.18.1.13:8000"]["expected"] is None
    assert out["servers"]["198.18.1.13:8000"]["max_tokens"] == 6


def test_drain_wait_is_a_setting_rendered_as_the_shutdown_timeout() -> None:
    assert cluster_defaults()["drain_wait"] == 120
    assert not setting_problems(cluster_defaults())
    assert [k for k, _ in setting_problems({**cluster_defaults(), "drain_wait": "2m"})] == ["drain_wait"]
    assert [k for k, _ in setting_problems({**cluster_defaults(), "drain_wait": -1})] == ["drain_wait"]


def test_head_command_and_verdict() -> None:
    cmd = generate.head_command(8000, "tiny", bound_s=5)
    assert cmd.startswith("python3 -c ") and " 8000 " in cmd and "/etc/vllm/vllm.env" in cmd
    rec = json.dumps(generate.make_record(" jumps", "c1", "tiny", "p", 4))
    line = json.dumps({"status": 200, "payload": DONE, "latency_s": 0.3, "record": rec})
    v = generate.head_verdict(line, 5)
    assert not v.ok and "at launch ' jumps'" in v.reason
    line = json.dumps({"status": 200, "payload": DONE, "latency_s": 0.3, "record": None})
    assert generate.head_verdict("noise\n" + line, 5).ok
    assert generate.head_verdict("Traceback ...", 5).reason == "the head's probe printed no result"


def test_status_page_serving_rows_are_data() -> None:
    from provisioner.probes.serving import line
    from provisioner.reports.status_html import render

    bad = {"cluster": "c1", "head": "node01", "server": "10.0.0.1:8000", "serves": False, "latency_s": 0.2,
           "reason": "answered '<script>x</script>', at launch ' jumps'"}
    good = {**bad, "cluster": "c2", "serves": True, "reason": ""}
    page = render("inv", [], {}, str, 0.0, serving=[bad, good])
    assert "<script>x" not in page and "&lt;script&gt;" in page and 'class="seen yes">yes (0.2 s)' in page
    assert line(bad).startswith("c1 (head node01, 10.0.0.1:8000): NOT serving: answered")
    assert render("inv", [], {}, str, 0.0).count('id="serving"') == 0
