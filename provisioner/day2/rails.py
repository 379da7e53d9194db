"""The rails every automated day-2 action passes, whoever asks (operator, timer, alert): circuit breaker, capacity
floor per model, rate limit, cool-down per node, flap damping, and the mode (observe | recommend | act). Pure: the
caller gathers `Recent` from the ledger and the fleet's shape; `judge` says go, hold (and why) or open the breaker.

Settings: the inventory variable `remediation_rails` (group all, one value for the fleet), validated by RL001-RL003;
DEFAULTS here are their one home (docs/lifecycle.md#rails)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

VAR = "remediation_rails"
MODES = ("observe", "recommend", "act")
#: the actions that take a node or a cluster out of service: the rails hold these (steps on a node already out,
#: health gates and returns put nothing at risk and go on)
TAKE_OUT = ("quarantine", "replace", "restart_cluster")
#: hardware checks whose failure already makes the node's cluster unable to serve (the capacity floor does not
#: hold them: the cluster is broken anyway; its own cluster goes out, and nothing else)
FATAL = ("xid", "ecc", "fabricmanager", "nvlink")

DEFAULTS: Mapping[str, Any] = {
    "mode": "recommend",          # a new site records and recommends; `act` executes
    "breaker_share": 0.25,        # more than this share of the fleet's nodes taken out within the window: open
    "breaker_model_share": 0.5,   # more than this share of one model's clusters taken out within the window: open
    "breaker_window_s": 300,      # NVSentinel's 5 minutes
    "actions_per_hour": 3,        # automated take-outs per hour, fleet-wide (Meta GCM's 3)
    "cooldown_s": 3600,           # one take-out per node per cool-down window
    "soft_checks": ["ib"],        # signals that may flap: they must persist ...
    "persist": 3,                 # ... across this many consecutive health observations
    "min_serving_clusters": 1,    # per model: an int for all, or {model: n}
}
KEYS: tuple[str, ...] = tuple(DEFAULTS)


@dataclass(frozen=True)
class Rails:
    mode: str = DEFAULTS["mode"]
    breaker_share: float = DEFAULTS["breaker_share"]
    breaker_model_share: float = DEFAULTS["breaker_model_share"]
    breaker_window_s: float = DEFAULTS["breaker_window_s"]
    actions_per_hour: int = DEFAULTS["actions_per_hour"]
    cooldown_s: float = DEFAULTS["cooldown_s"]
    soft_checks: tuple[str, ...] = tuple(DEFAULTS["soft_checks"])
    persist: int = DEFAULTS["persist"]
    min_serving: int = DEFAULTS["min_serving_clusters"]
    min_serving_by_model: Mapping[str, int] = field(default_factory=dict)

    def floor(self, model: str) -> int:
        return self.min_serving_by_model.get(model, self.min_serving)


def _num(v: Any, default: float, *, lo: float = 0.0, hi: float | None = None, integer: bool = False) -> Any:
    ok = isinstance(v, int if integer else (int, float)) and not isinstance(v, bool) and v >= lo \
        and (hi is None or v <= hi)
    return v if ok else default


def rails_of(value: Any) -> Rails:
    """The Rails of a `remediation_rails` value (None or missing keys: the defaults). Assumes RL001-RL003 passed;
    whatever they would report falls back to the default here."""
    v: Mapping[str, Any] = value if isinstance(value, Mapping) else {}
    d = DEFAULTS
    mode = v.get("mode", d["mode"])
    soft = v.get("soft_checks", d["soft_checks"])
    mins = v.get("min_serving_clusters", d["min_serving_clusters"])
    by_model = {str(k): n for k, n in mins.items() if isinstance(n, int) and not isinstance(n, bool) and n >= 0} \
        if isinstance(mins, Mapping) else {}
    return Rails(
        mode=mode if mode in MODES else d["mode"],
        breaker_share=_num(v.get("breaker_share"), d["breaker_share"], hi=1.0),
        breaker_model_share=_num(v.get("breaker_model_share"), d["breaker_model_share"], hi=1.0),
        breaker_window_s=_num(v.get("breaker_window_s"), d["breaker_window_s"], lo=1),
        actions_per_hour=_num(v.get("actions_per_hour"), d["actions_per_hour"], lo=1, integer=True),
        cooldown_s=_num(v.get("cooldown_s"), d["cooldown_s"]),
        soft_checks=tuple(c for c in soft if isinstance(c, str)) if isinstance(soft, list) else tuple(d["soft_checks"]),
        persist=_num(v.get("persist"), d["persist"], lo=1, integer=True),
        min_serving=_num(mins, d["min_serving_clusters"], integer=True) if not isinstance(mins, Mapping)
        else d["min_serving_clusters"],
        min_serving_by_model=by_model)


@dataclass(frozen=True)
class TakeOut:
    """An automated take-out already done: when, the node, its cluster and model (None: in no cluster)."""

    at: float
    host: str
    cluster: str | None = None
    model: str | None = None


@dataclass(frozen=True)
class Recent:
    """What the rails need beyond the action, as plain data. nodes: the fleet's GPU nodes under the policy.
    clusters: {cluster: model} of the fleet. serving: the clusters serving now. done: the automated take-outs
    (newest last). breaker: why it is open (None: closed). closed_at: when an operator last closed it (take-outs
    before that do not count towards opening it again). streak: how many consecutive health observations, newest
    first, failed the action's check."""

    now: float
    nodes: int
    clusters: Mapping[str, str] = field(default_factory=dict)
    serving: frozenset[str] = frozenset()
    done: Sequence[TakeOut] = ()
    breaker: str | None = None
    closed_at: float = 0.0
    streak: int = 1


@dataclass(frozen=True)
class Verdict:
    """go: execute (in mode `act`) or record it as observed / recommended. rail: the rail that holds it (breaker,
    flap, cooldown, rate, floor) and why; opens: the breaker opens now, with this reason."""

    go: bool
    rail: str | None = None
    why: str = ""
    opens: str | None = None


def judge(kind: str, host: str, *, check: str | None, cluster: str | None, rails: Rails, recent: Recent) -> Verdict:
    """Whether an action of `kind` on `host` may go under `rails`. Actions that take nothing out always go."""
    if kind not in TAKE_OUT:
        return Verdict(True)
    if recent.breaker is not None:
        return Verdict(False, "breaker", f"breaker open ({recent.breaker}): automatic take-outs stopped until "
                                         "provision remediate --close-breaker")
    soft = kind != "restart_cluster" and (check is None or check in rails.soft_checks)
    if soft and check is not None and recent.streak < rails.persist:
        return Verdict(False, "flap", f"flap damping: {check} failed in {recent.streak} consecutive observation(s), "
                                      f"{rails.persist} needed")
    last_here = [t.at for t in recent.done if t.host == host]
    if last_here and recent.now - last_here[-1] < rails.cooldown_s:
        return Verdict(False, "cooldown", f"cool-down: {host} was taken out {recent.now - last_here[-1]:.0f} s ago "
                                          f"(cooldown_s {rails.cooldown_s:g})")
    model = recent.clusters.get(cluster) if cluster else None
    if soft and cluster in recent.serving and model is not None:
        left = sum(1 for c in recent.serving if recent.clusters.get(c) == model and c != cluster)
        if left < rails.floor(model):
            return Verdict(False, "floor", f"capacity floor: taking {cluster} out would leave {model} {left} serving "
                                           f"cluster(s), min_serving_clusters {rails.floor(model)} (a soft signal)")
    opens = _trips(host, cluster, model, rails, recent)
    if opens:
        return Verdict(False, "breaker", f"breaker opens: {opens}", opens=opens)
    hour = [t for t in recent.done if recent.now - t.at < 3600]
    if len(hour) >= rails.actions_per_hour:
        return Verdict(False, "rate", f"rate limit: {len(hour)} automated take-outs in the last hour "
                                      f"(actions_per_hour {rails.actions_per_hour})")
    return Verdict(True)


def _trips(host: str, cluster: str | None, model: str | None, rails: Rails, recent: Recent) -> str | None:
    """Why this take-out would open the breaker (None: it would not): more than max(1, share x N) nodes of the fleet,
    or clusters of the model, taken out within the window, this one counted. At least one always may go."""
    since = max(recent.now - rails.breaker_window_s, recent.closed_at)
    window = [t for t in recent.done if t.at >= since]
    hosts = {t.host for t in window} | {host}
    allowed = max(1, int(rails.breaker_share * recent.nodes))
    if len(hosts) > allowed:
        return (f"{len(hosts)} of {recent.nodes} nodes would be taken out within {rails.breaker_window_s:g} s "
                f"(breaker_share {rails.breaker_share:g}: at most {allowed})")
    if model is not None and cluster is not None:
        of_model = [c for c, m in recent.clusters.items() if m == model]
        out = {t.cluster for t in window if t.model == model and t.cluster} | {cluster}
        allowed_c = max(1, int(rails.breaker_model_share * len(of_model)))
        if len(out) > allowed_c:
            return (f"{len(out)} of {len(of_model)} clusters of {model} would be taken out within "
                    f"{rails.breaker_window_s:g} s (breaker_model_share {rails.breaker_model_share:g}: at most "
                    f"{allowed_c})")
    return None


def disposition(mode: str, verdict: Verdict, *, approved: bool = False) -> str:
    """What becomes of an action: blocked (a rail holds it), observed (mode observe), recommended (mode recommend,
    not approved) or act."""
    if not verdict.go:
        return "blocked"
    if mode == "observe":
        return "observed"
    if mode == "recommend" and not approved:
        return "recommended"
    return "act"
