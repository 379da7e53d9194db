"""The rolling upgrade as pure data: the spec's digest (a rerun with the same one resumes), the clusters that may go
out next (at most --max-unavailable, never the last one serving a model), whether it may start or resume, and the
progress lines. No I/O: day2/executor.py acts on these (`upgrade`), provision upgrade calls it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: a cluster's statuses in a rollout, in the order it goes through them
STEPS = ("pending", "draining", "upgrading", "returning", "done")


def spec_digest(inputs: Mapping[str, str], extravars: Mapping[str, Any], key: bytes) -> str:
    """One digest of what the rollout applies: every member's input digest (inventory, roles, suite version) and the
    extra vars (a vaulted -e value included), keyed like the input digests (provisioner.drift.state.keyed_digest)."""
    from provisioner.drift.state import keyed_digest

    return keyed_digest(key, {"inputs": dict(sorted(inputs.items())), "extra": extravars})


def single_model_clusters(models: Mapping[str, str]) -> list[tuple[str, str]]:
    """(cluster, model) for every model served by one cluster only: upgrading it stops the model."""
    by: dict[str, list[str]] = {}
    for c, m in models.items():
        by.setdefault(m, []).append(c)
    return sorted((cs[0], m) for m, cs in by.items() if len(cs) == 1)


def members_that_balance(clusters: Mapping[str, Sequence[str]], balancers: Iterable[str]) -> list[tuple[str, str]]:
    """(host, cluster) for every balancer host (group `lb`) that is also a cluster member: the rollout reboots or
    restarts it with its cluster, and the serving edge goes down with it."""
    lb = set(balancers)
    return sorted((h, c) for c, members in clusters.items() for h in members if h in lb)


def next_batch(pending: Sequence[str], models: Mapping[str, str], serving: Iterable[str], max_unavailable: int, *,
               force: bool = False) -> tuple[list[str], str | None]:
    """The clusters to take out next, in rollout order: at most `max_unavailable`, and (unless `force`) never one
    whose model would be left with no serving cluster. A cluster not serving now costs no capacity. When nothing can
    go: ([], why)."""
    up = set(serving)
    batch: list[str] = []
    blocked: str | None = None
    for c in pending:
        if len(batch) >= max_unavailable:
            break
        if c in up and not force:
            left = [o for o in up if o != c and o not in batch and models.get(o) == models.get(c)]
            if not left:
                blocked = blocked or (f"cluster {c} is the last one serving {models.get(c)} now: the rollout does "
                                      f"not take it out (bring another cluster of the model back, or --force)")
                continue
        batch.append(c)
    return batch, (None if batch else blocked or "no cluster left to upgrade")


def progress(statuses: Mapping[str, str], models: Mapping[str, str], serving: Iterable[str]) -> str:
    """`N/M clusters done, K left; serving now: MODEL x of y clusters, ...`."""
    up = set(serving)
    done = sum(1 for s in statuses.values() if s == "done")
    per: dict[str, list[int]] = {}
    for c, m in sorted(models.items()):
        n = per.setdefault(m, [0, 0])
        n[0] += c in up
        n[1] += 1
    cap = ", ".join(f"{m} {a} of {b} cluster{'s' if b != 1 else ''}" for m, (a, b) in sorted(per.items()))
    return f"{done}/{len(statuses)} clusters done, {len(statuses) - done} left; serving now: {cap or 'nothing'}"


def refusal(ro: Any, inventory: object, *, digest: str, abort: bool, force: bool,
            models: Mapping[str, str]) -> str | None:
    """Why this upgrade may not start or resume (one line), given the site's open rollout `ro`; None: it may."""
    from provisioner.drift.state import KEYED

    if ro is not None and ro.status == "running":
        return f"refused: rollout {ro.id} of {inventory} is running (pid {ro.pid} on {ro.node})"
    if abort:
        return None
    if ro is not None and ro.digest != digest and not ro.digest.startswith(KEYED):
        return (f"refused: rollout {ro.id} was started by an older provisioner (its spec digest used digest.key, not "
                "the ledger's key): finish it with that version, or --abort it first")
    if ro is not None and ro.digest != digest:
        at = next((c for c in ro.clusters if c.status != "done"), None)
        return (f"refused: rollout {ro.id} of another change is {ro.status}"
                + (f" at cluster {at.cluster} ({at.status})" if at else "")
                + ": rerun it with its own inventory and -e to resume, or --abort it first")
    single = single_model_clusters(models) if ro is None else []
    if single and not force:
        c, m = single[0]
        return (f"refused: cluster {c} is the only one serving {m}: a rolling upgrade would stop the model (add "
                "--force to upgrade it anyway)")
    return None


def started_line(rid: int, order: Sequence[str], max_unavailable: int) -> str:
    """The line a new rollout starts with."""
    return f"rollout {rid}: {len(order)} cluster(s), at most {max_unavailable} out at a time: {', '.join(order)}"


def balancer_note(host: str, cluster: str) -> str:
    """The note for a balancer host that is also a member of a cluster the rollout takes out."""
    return (f"note: {host} is also a balancer (group lb): the serving edge goes down with it while {cluster} is "
            f"upgraded (give the balancer a host of its own)")


def resumed_line(ro: Any) -> str:
    """The line a resumed rollout starts with: what is done, what is left and where each one stopped."""
    left = [f"{c.cluster} ({c.status}{', ' + c.step if c.step else ''})" for c in ro.clusters if c.status != "done"]
    return f"rollout {ro.id} resumed ({ro.status}): {len(ro.clusters) - len(left)} done, left: {', '.join(left)}"
