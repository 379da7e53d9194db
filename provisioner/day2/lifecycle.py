"""A node's lifecycle as a pure state machine: the states, the allowed transitions, and the refusals (issue 25).

    new -> provisioning -> burn-in -> in-service -> draining -> maintenance | quarantined
    maintenance | quarantined -> burn-in -> in-service          (back into service: through the health gate)
    maintenance -> provisioning                                  (rebuild / re-image)
    provisioning | burn-in -> maintenance | quarantined          (it failed before it served)
    any state but in-service and draining -> retired             (retired is final)

Refusals (`Refused`, one line):
- a transition not in the table (e.g. in-service -> maintenance: drain first; anything out of retired);
- into in-service without a passed health gate (`Context.health_passed`), or, unless the site turns the burn-in gate
  off, without a passed burn-in since the node left service (`Context.burnin_passed`); `force` lifts neither;
- draining a node whose vLLM cluster is the last one serving its model, unless `force` (the fleet's clusters and
  models and every host's state come in the `Context` as plain data: this module reads nothing).
`adopt` records a node that served before the ledger saw it (health gate held, burn-in gate waived and said so).

No I/O here: the ledger records what `transition` allows (provisioner/ledger/), the commands gather the context.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

STATES: tuple[str, ...] = (
    "new", "provisioning", "burn-in", "in-service", "draining", "maintenance", "quarantined", "retired")

#: state -> the states it may move to
ALLOWED: Mapping[str, frozenset[str]] = {
    "new": frozenset({"provisioning", "retired"}),
    "provisioning": frozenset({"burn-in", "maintenance", "quarantined", "retired"}),
    "burn-in": frozenset({"in-service", "maintenance", "quarantined", "retired"}),
    "in-service": frozenset({"draining"}),
    "draining": frozenset({"maintenance", "quarantined"}),
    "maintenance": frozenset({"burn-in", "provisioning", "retired"}),
    "quarantined": frozenset({"burn-in", "retired"}),
    "retired": frozenset(),
}

#: the state in which a node serves (the launch gate's in-service mark belongs to it)
SERVING = "in-service"


class Refused(Exception):
    """A transition the rules refuse; str() is the one line to show."""


@dataclass(frozen=True)
class ClusterInfo:
    """A vLLM cluster as plain data: the model it serves and its member hosts."""

    model: str
    members: tuple[str, ...]


@dataclass(frozen=True)
class Context:
    """What the rules need to know beyond the two states (gathered by the caller from the inventory and ledger).

    health_passed: the node passed the health gate since it last left service (required into in-service).
    cluster: the node's vLLM cluster (None: not in one). clusters: every cluster of the fleet. states: every host's
    lifecycle state (hosts missing are `new`)."""

    health_passed: bool = False
    #: the burn-in gate (docs/burn-in.md; on unless the site sets `burnin_gate: false`): into in-service also needs
    #: a passed burn-in tier newer than the state the node comes from. inventory and burnin_tier only word the
    #: refusal (what to run).
    burnin_required: bool = False
    burnin_passed: bool = False
    inventory: str = "INVENTORY"
    burnin_tier: str = "quick"
    cluster: str | None = None
    clusters: Mapping[str, ClusterInfo] = field(default_factory=dict)
    states: Mapping[str, str] = field(default_factory=dict)

    def serving(self, cluster: str) -> bool:
        """Every member of `cluster` is in service."""
        c = self.clusters.get(cluster)
        return c is not None and bool(c.members) and all(self.states.get(m, "new") == SERVING for m in c.members)


@dataclass(frozen=True)
class Result:
    """An allowed transition, to record. notes: what the operator should know (a cluster drained as a whole, a
    refusal overridden by force)."""

    host: str
    from_state: str
    to_state: str
    reason: str
    forced: bool = False
    notes: tuple[str, ...] = ()


def burnin_gate_on(value: object = True) -> bool:
    """The inventory's `burnin_gate` (default on): only false/no/0/off turn it off; a misspelt value keeps it on."""
    return str(value).strip().lower() not in ("false", "no", "0", "off")


def check_state(state: str) -> str:
    if state not in STATES:
        raise Refused(f"unknown lifecycle state {state!r} (one of {', '.join(STATES)})")
    return state


def transition(current: str, target: str, *, reason: str, host: str = "", force: bool = False,
               context: Context | None = None) -> Result:
    """Allow `current` -> `target` for `host` (a Result) or raise Refused with the one-line reason."""
    ctx = context or Context()
    check_state(current)
    check_state(target)
    who = host or "the node"
    if not reason.strip():
        raise Refused(f"{who}: a transition needs a reason")
    if current == target:
        raise Refused(f"{who} is {current} already")
    if target not in ALLOWED[current]:
        nexts = ", ".join(s for s in STATES if s in ALLOWED[current]) or "nothing (final)"
        hint = " (drain it first)" if current in (SERVING, "draining") and target == "retired" \
            or current == SERVING and target in ("maintenance", "quarantined") else ""
        raise Refused(f"{who}: {current} -> {target} is not a lifecycle transition{hint}; from {current}: {nexts}")
    notes: list[str] = []
    forced = False
    if target == SERVING and not ctx.health_passed:
        raise Refused(f"{who}: {current} -> {SERVING} needs a passed health gate first (provision health)")
    if target == SERVING and ctx.burnin_required and not ctx.burnin_passed:
        raise Refused(f"{who}: {current} -> {SERVING} needs a passed burn-in since it left service (burnin_gate): "
                      f"run provision burn-in {ctx.inventory} {host or 'HOST'} --tier {ctx.burnin_tier}")
    if target == "draining" and ctx.cluster is not None:
        c = ctx.clusters.get(ctx.cluster)
        if c is not None:
            others = [m for m in c.members if m != host]
            if others:
                notes.append(f"cluster {ctx.cluster} drains as a whole (with {', '.join(others)})")
            serving_others = [n for n, o in ctx.clusters.items()
                              if n != ctx.cluster and o.model == c.model and ctx.serving(n)]
            if not serving_others:
                if not force:
                    raise Refused(f"{who}: cluster {ctx.cluster} is the last one serving {c.model}: draining it "
                                  f"stops the model (add --force to drain it anyway)")
                forced = True
                notes.append(f"forced: cluster {ctx.cluster} was the last one serving {c.model}")
    return Result(host=host, from_state=current, to_state=target, reason=reason.strip(), forced=forced,
                  notes=tuple(notes))


def adopt(current: str, *, seen: bool, reason: str, host: str = "", context: Context | None = None
          ) -> tuple[Result, ...]:
    """Record a node that served before the ledger knew it (`provision node ... --state in-service --adopt`): new ->
    provisioning -> burn-in -> in-service at once. The health gate holds; the burn-in gate is waived (the transition
    is `forced` and its reason says so), because a burn-in would take the GPUs from the vLLM serving on them; the
    node's first return runs its return tier as any other's. Only for a host the ledger never moved (`seen`: it has
    a transition): a node with a history comes back through `provision return`."""
    ctx = context or Context()
    check_state(current)
    who = host or "the node"
    if not reason.strip():
        raise Refused(f"{who}: a transition needs a reason")
    if seen or current != "new":
        raise Refused(f"{who}: --adopt is for a node the ledger has never seen; it is {current} with a history "
                      "(bring it back with provision return)")
    if not ctx.health_passed:
        raise Refused(f"{who}: adopting it needs a passed health gate first: run provision health {ctx.inventory} "
                      f"--limit {host or 'HOST'}")
    waived = ctx.burnin_required and not ctx.burnin_passed
    why = ("adopted, no burn-in on record: " if waived else "adopted: ") + reason.strip()
    notes = (f"burn-in gate waived: {who} serves already; its first return runs burnin_return_tier",) if waived \
        else ()
    return (Result(host, "new", "provisioning", why), Result(host, "provisioning", "burn-in", why),
            Result(host, "burn-in", SERVING, why, forced=waived, notes=notes))


def path_to(current: str, target: str) -> tuple[str, ...]:
    """The shortest chain of allowed transitions from `current` to `target` (the states after `current`, in order;
    empty when already there). Refused when no chain exists (out of retired, say)."""
    check_state(current)
    check_state(target)
    prev: dict[str, str] = {}
    frontier, seen = [current], {current}
    while frontier and target not in seen:
        nxt = []
        for s in frontier:
            for t in sorted(ALLOWED[s]):
                if t not in seen:
                    seen.add(t)
                    prev[t] = s
                    nxt.append(t)
        frontier = nxt
    if target not in seen:
        raise Refused(f"no lifecycle path from {current} to {target}")
    chain = []
    s = target
    while s != current:
        chain.append(s)
        s = prev[s]
    return tuple(reversed(chain))


def lifecycle_target(state: str, in_service: bool) -> str:
    """Where onboarding moves a node in the ledger: in-service when it passed; when it failed, provisioning from
    new, maintenance from in-service or draining (its mark was removed), else where it is. Pure."""
    if in_service:
        return "in-service"
    return {"new": "provisioning", "in-service": "maintenance", "draining": "maintenance"}.get(state, state)
