"""Burn-in verdicts, stdlib only: ships to nodes with node_burnin.py (roles/node_burnin/files/burninjudge.py is a
symlink to this file) and the CLI judges with the same functions, so the node and the controller cannot disagree.

A threshold document (what `provision burn-in` derives from provisioner/catalog/burnin.yaml for a GPU model):
    {"metrics": {"gemm_bf16_tflops": {"min": 620.0}, ...}, "pcie": {"gen": 5, "width": 16},
     "sustained_fraction": 0.9, "clock_fraction": 0.85}
"""

from __future__ import annotations

from typing import Any, Optional

#: Stable codes of failed burn-in checks (docs/burn-in.md lists them; the catalog test checks the list).
CODES = {
    "BRN001": "GEMM throughput below the model's threshold",
    "BRN002": "HBM (device copy) bandwidth below the threshold",
    "BRN003": "host<->device (pinned) bandwidth below the threshold",
    "BRN004": "PCIe link trained below the expected generation or width",
    "BRN005": "thermal or hardware slowdown active under load",
    "BRN006": "sustained GEMM or SM clock under load fell below its fraction of the burst/max",
    "BRN007": "ECC errors or row remaps appeared during the test",
    "BRN008": "an XID appeared during the test",
    "BRN009": "silent data corruption: a known-answer GEMM gave a wrong result",
    "BRN010": "silent data corruption: repeated GEMMs were not bit-identical",
    "BRN011": "silent data corruption: GPUs of one model disagree on the same GEMM",
    "BRN012": "NCCL all-reduce bandwidth below the threshold, or a wrong sum",
    "BRN013": "DCGM diagnostics failed",
    "BRN014": "a measurement could not run",
    "BRN015": "GPU-to-GPU (P2P) bandwidth below the threshold",
    "BRN016": "pairwise InfiniBand bandwidth below the threshold",
    "BRN017": "cross-node NCCL all-reduce below the threshold",
    "BRN018": "slow node: a figure at least the configured fraction below its GPU model's fleet median",
    "BRN019": "InfiniBand link not Active/LinkUp, or trained below the expected rate or width",
}

#: metric -> (check name, failure code). A check result names its metric; the ledger keeps both.
METRICS = {
    "gemm_bf16_tflops": ("gemm_bf16", "BRN001"),
    "gemm_fp8_tflops": ("gemm_fp8", "BRN001"),
    "hbm_copy_gbps": ("hbm", "BRN002"),
    "h2d_gbps": ("h2d", "BRN003"),
    "d2h_gbps": ("d2h", "BRN003"),
    "sustained_bf16_tflops": ("stress", "BRN006"),
    "nccl_allreduce_busbw_gbps": ("nccl", "BRN012"),
    "p2p_gbps": ("p2p", "BRN015"),
    "ib_pair_gbps": ("ib_pair", "BRN016"),
    "nccl_cluster_busbw_gbps": ("nccl_cluster", "BRN017"),
    "ib_link_rate_gbps": ("ib_link", "BRN019"),
}

#: nvidia-smi clocks_event_reasons (clocks_throttle_reasons before R535) bits.
REASON_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: Reasons that fail a GPU under load (the power cap is how a GPU at full load is meant to run: reported only).
BAD_REASONS = frozenset({"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"})


def decode_reasons(value: Optional[str]) -> list:
    """'0x0000000000000044' -> ['sw_power_cap', 'hw_thermal_slowdown']; [] for N/A or garbage."""
    try:
        bits = int(str(value).strip(), 16)
    except (TypeError, ValueError):
        return []
    return [name for bit, name in sorted(REASON_BITS.items()) if bits & bit]


def judge_metric(metric: str, value: Optional[float], thresholds: Optional[dict]) -> tuple:
    """(status, code, expected, message) of one measured figure against its threshold ({"min": x})."""
    check, code = METRICS.get(metric, (metric, "BRN014"))
    t = ((thresholds or {}).get("metrics") or {}).get(metric) or {}
    lo = t.get("min")
    if value is None:
        return "fail", "BRN014", t or None, "%s not measured" % metric
    if lo is None:
        return "pass", None, None, "%s %.1f (no threshold for this model: reported only)" % (metric, value)
    if value < float(lo):
        return "fail", code, {"min": lo}, "%s %.1f < %.1f (%.0f%% of the minimum)" % (
            metric, value, float(lo), 100.0 * value / float(lo))
    return "pass", None, {"min": lo}, "%s %.1f >= %.1f" % (metric, value, float(lo))


def judge_pcie(gen: Optional[int], width: Optional[int], thresholds: Optional[dict]) -> tuple:
    """(status, code, expected, message) of the PCIe link seen under load against {"gen": g, "width": w}."""
    exp = (thresholds or {}).get("pcie") or {}
    if gen is None or width is None:
        return "skip", None, exp or None, "PCIe link generation/width not reported (nvidia-smi says N/A)"
    low = []
    if exp.get("gen") and gen < int(exp["gen"]):
        low.append("gen %d < %d" % (gen, int(exp["gen"])))
    if exp.get("width") and width < int(exp["width"]):
        low.append("x%d < x%d" % (width, int(exp["width"])))
    if low:
        return "fail", "BRN004", exp, "PCIe link down-trained: %s" % ", ".join(low)
    if not exp:
        return "pass", None, None, "PCIe gen %d x%d (no expectation for this model: reported only)" % (gen, width)
    return "pass", None, exp, "PCIe gen %d x%d" % (gen, width)


def judge_load(watch: dict, thresholds: Optional[dict]) -> tuple:
    """(status, code, expected, message) of one GPU's watch under load: throttle reasons seen, SM clock vs max."""
    bad = sorted(set(watch.get("reasons") or []) & BAD_REASONS)
    if bad:
        return "fail", "BRN005", {"reasons": "none of " + ", ".join(sorted(BAD_REASONS))}, \
            "%s under load (max %s C, %s W)" % (", ".join(bad), watch.get("temp_max_c"), watch.get("power_max_w"))
    frac = (thresholds or {}).get("clock_fraction")
    med, mx = watch.get("sm_clock_median_mhz"), watch.get("sm_clock_max_mhz")
    if frac and med and mx and med < float(frac) * mx:
        return "fail", "BRN006", {"sm_clock_fraction": frac}, "SM clock under load %d MHz < %.0f%% of max %d MHz" % (
            med, 100 * float(frac), mx)
    return "pass", None, ({"sm_clock_fraction": frac} if frac else None), \
        "clocks under load: median %s MHz of max %s, %s C max, %s W max%s" % (
            med, mx, watch.get("temp_max_c"), watch.get("power_max_w"),
            ", power capped" if "sw_power_cap" in (watch.get("reasons") or []) else "")


def judge_sustained(sustained: Optional[float], burst: Optional[float], thresholds: Optional[dict]) -> tuple:
    """Sustained bf16 GEMM under load (all GPUs at once) vs the GPU's own burst figure and the model's minimum."""
    st, code, exp, msg = judge_metric("sustained_bf16_tflops", sustained, thresholds)
    frac = (thresholds or {}).get("sustained_fraction")
    if st == "pass" and frac and burst and sustained is not None and sustained < float(frac) * burst:
        return "fail", "BRN006", {"fraction_of_burst": frac}, \
            "sustained GEMM %.1f < %.0f%% of this GPU's burst %.1f TFLOP/s (slows down under load)" % (
                sustained, 100 * float(frac), burst)
    return st, code, exp, msg


def summarize(results: list) -> dict[str, Any]:
    failed = sorted({"%s%s" % (r["check"], "[%s]" % r["link"] if r.get("link") else
                               "" if r.get("gpu") is None else "[gpu%s]" % r["gpu"])
                     for r in results if r.get("status") == "fail"})
    return {"check": "summary", "status": "fail" if failed else "pass", "failed": failed}
