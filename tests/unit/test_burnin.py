"""Burn-in: the threshold catalog and its generated docs, the controller's verdict, the fleet-relative slow node."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from provisioner import burnin
from provisioner.catalog import gpus
from provisioner.probes import burninjudge

ROOT = Path(__file__).resolve().parents[2]


def test_docs_table_is_the_catalog() -> None:
    text = (ROOT / "docs" / "burn-in.md").read_text()
    assert burnin.DOC_BEGIN in text and burnin.DOC_END in text
    got = text[text.index(burnin.DOC_BEGIN):text.index(burnin.DOC_END) + len(burnin.DOC_END)] + "\n"
    assert got == burnin.render_docs_table(), "docs/burn-in.md is stale: python -m provisioner.burnin --docs"


def test_every_figure_has_a_known_source_and_models_exist() -> None:
    cat = burnin.catalog()
    assert {"H100-SXM5-80GB", "H200-SXM-141GB", "B200-SXM-180GB", "GB200-186GB"} <= set(cat["models"])
    for model, m in cat["models"].items():
        assert model in gpus(), model
        figs = list((m.get("metrics") or {}).values()) + [m[k] for k in ("pcie", "ib") if m.get(k)]
        for f in figs:
            src = str(f["source"])
            assert src in cat["sources"] or src.startswith("derived: "), (model, src)
            if "anchor" in f:
                assert f["anchor"]["source"] in cat["sources"]
        for name, f in (m.get("metrics") or {}).items():
            assert name in burninjudge.METRICS, name
            assert 0 <= float(f["margin"]) < 0.5
    for key, s in cat["sources"].items():
        assert s["kind"] in ("measured", "published", "assumed"), key
        if s["kind"] == "measured":
            assert (ROOT / s["record"].split(" ")[0]).is_dir(), s["record"]


def _recorded(metric: str) -> list[float]:
    vals = []
    for f in sorted((ROOT / "benchmarks" / "burnin" / "h100-sxm-2026-12-07").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("metric") == metric and isinstance(r.get("value"), (int, float)):
                vals.append(float(r["value"]))
    return vals


@pytest.mark.parametrize("metric", ["gemm_bf16_tflops", "gemm_fp8_tflops", "hbm_copy_gbps", "h2d_gbps", "d2h_gbps",
                                    "sustained_bf16_tflops"])
def test_measured_h100_figures_are_the_recorded_runs(metric: str) -> None:
    """The catalog's H100 nominal is the median of the JSON lines kept from the real-GPU runs (within 1%)."""
    vals = _recorded(metric)
    assert len(vals) >= 2, metric
    fig = burnin.catalog()["models"]["H100-SXM5-80GB"]["metrics"][metric]
    assert fig["source"] == "h100-sxm-2026-12-07"
    assert abs(float(fig["nominal"]) - statistics.median(vals)) <= 0.01 * statistics.median(vals), (metric, vals)


def test_thresholds_full_node_and_single_gpu() -> None:
    full = burnin.thresholds("H100-SXM5-80GB", 8)
    assert full["metrics"]["nccl_allreduce_busbw_gbps"] == {"min": 460.0}
    assert full["pcie"] == {"gen": 5, "width": 16}
    one = burnin.thresholds("H100-SXM5-80GB", 1)
    assert "nccl_allreduce_busbw_gbps" not in one["metrics"]
    assert one["metrics"]["gemm_bf16_tflops"]["min"] == pytest.approx(688 * 0.92, abs=0.1)
    assert burnin.thresholds("A100-SXM4-80GB", 8)["metrics"] == {}
    assert "pcie" not in burnin.thresholds("GB200-186GB", 4)


def test_gemm_at_90_percent_fails_with_its_code_and_gpu() -> None:
    doc = burnin.thresholds("H100-SXM5-80GB", 8)
    node_said = {"check": "gemm_bf16", "gpu": 3, "status": "pass", "metric": "gemm_bf16_tflops", "value": 0.9 * 688}
    r = burnin.rejudge(node_said, doc)
    assert (r["status"], r["code"], r["gpu"]) == ("fail", "BRN001", 3)
    assert r["message"].startswith("GPU 3: gemm_bf16_tflops 619.2 < 633.0")
    ok = burnin.rejudge(dict(node_said, value=688.0), doc)
    assert ok["status"] == "pass" and "code" not in ok
    # a node that sends no number fails the check, it never passes it
    assert burnin.rejudge(dict(node_said, value="fast"), doc)["code"] == "BRN014"


def test_pcie_and_load_verdicts() -> None:
    doc = burnin.thresholds("H100-SXM5-80GB", 8)
    assert burninjudge.judge_pcie(5, 8, doc)[:2] == ("fail", "BRN004")
    assert burninjudge.judge_pcie(4, 16, doc)[:2] == ("fail", "BRN004")
    assert burninjudge.judge_pcie(5, 16, doc)[0] == "pass"
    hot = {"reasons": ["sw_power_cap", "hw_thermal_slowdown"], "temp_max_c": 91, "power_max_w": 640}
    assert burninjudge.judge_load(hot, doc)[:2] == ("fail", "BRN005")
    capped = {"reasons": ["sw_power_cap"], "sm_clock_median_mhz": 1365, "sm_clock_max_mhz": 1980}
    assert burninjudge.judge_load(capped, doc)[0] == "pass"  # a power-capped GEMM is how an H100 runs
    assert burninjudge.decode_reasons("0x0000000000000044") == ["sw_power_cap", "hw_thermal_slowdown"]
    assert burninjudge.decode_reasons("[N/A]") == []
    st = burninjudge.judge_sustained(600.0, 689.0, doc)
    assert st[:2] == ("fail", "BRN001") or st[:2] == ("fail", "BRN006")


def test_slow_node_in_a_fleet_of_four() -> None:
    figs = {f"node0{i}": ("H100-SXM5-80GB", {"gemm_bf16_tflops": 689.0 + i, "hbm_copy_gbps": 3046.0})
            for i in range(1, 5)}
    figs["node03"] = ("H100-SXM5-80GB", {"gemm_bf16_tflops": 689.0 * 0.92, "hbm_copy_gbps": 3046.0})
    slow = burnin.slow_nodes(figs, fraction=0.05, min_sample=4)
    assert [(s.host, s.metric) for s in slow] == [("node03", "gemm_bf16_tflops")]
    assert 0.07 < slow[0].gap < 0.09 and "below the H100-SXM5-80GB fleet median" in slow[0].message
    three = {h: v for h, v in figs.items() if h != "node04"}
    assert burnin.slow_nodes(three, fraction=0.05, min_sample=4) == []
    # models are compared with their own kind only
    figs["node09"] = ("H200-SXM-141GB", {"gemm_bf16_tflops": 400.0})
    assert [s.host for s in burnin.slow_nodes(figs, fraction=0.05, min_sample=4)] == ["node03"]
    assert burnin.node_figure([689.0, 620.0, 700.0]) == 620.0


def test_quarantine_on_slow_is_off_by_default_and_acts_when_named() -> None:
    from provisioner.day2.policy import Facts, Health, Policy, decide, policy_of

    ok = Health(run=7, started=1000.0, outcome="ok", checks={"ecc": ("pass", None)})
    slow = "slow node: n2: gemm_bf16_tflops 640.8 is 7.0% below the H100-SXM5-80GB fleet median 689.0 (4 nodes)"
    f = Facts(host="n2", state="in-service", since=10.0, now=2000.0, health=ok, cluster="c1", slow=slow)
    default = policy_of({"remediation": ["reboot"]})
    assert default is not None and "slow" not in default.quarantine_on
    assert decide(f, default).kind == "hold"
    named = policy_of({"quarantine_on": ["ecc", "slow"]})
    assert named is not None and named.quarantine_on == ("ecc", "slow")
    a = decide(f, named)
    assert (a.kind, a.check, a.reason) == ("quarantine", "slow", slow)
    # quarantined for slowness: a passed health gate alone does not return it while it is still slow
    q = Facts(host="n2", state="quarantined", since=500.0, now=2000.0, health=ok, cluster="c1", slow=slow)
    assert decide(q, named).kind != "return"
    assert decide(Facts(host="n2", state="quarantined", since=500.0, now=2000.0, health=ok, cluster="c1"),
                  named).kind == "return"
    assert Policy().quarantine_on == ("ecc", "xid", "fabricmanager", "nvlink", "ib")
