"""`provision upgrade INVENTORY [-e K=V]...`: a rolling upgrade of the vLLM clusters, cluster by cluster through drain
and return, recorded in the ledger so that a rerun resumes where it stopped."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

import provisioner.probes  # noqa: F401  (keeps the SSH key variables in the fleet model)
from provisioner.commands.common import EXTRA_VARS_HELP, VAULT_HELP, Format, finding_line, unwrap, use_vault
from provisioner.errors import Exit, UsageError

HELP = unwrap("""Roll a change (driver, Fabric Manager, CUDA/NCCL, vLLM pin; inventory or -e) over the vLLM clusters.

Cluster by cluster, at most --max-unavailable out at a time and never the last one serving a model (unless --force):
drain (balancer, in flight, stop, mark: as provision drain); check that no process holds /dev/nvidia* on the members
(the process is named and the rollout stops, the cluster left drained); run playbooks/site.yml on the members
without the vLLM launch, with provision_allow_reboot=true (the driver role reboots only where the kernel module
package changed); return (health gate, mark, vLLM launch with the same -e, /health, balancer). A line after each
batch says the clusters done and left and what serves now.

Every step is in the ledger. A failure stops the rollout with its cluster drained and the step that failed; rerun
the same command (same inventory, same -e) to resume from there. A different change is refused while one is open:
--abort first, which returns the clusters the rollout took out (their vLLM launched with the -e given to --abort)
and closes it. Hosts outside any vLLM cluster are not touched (provision run --limit for those).

Exit codes: 0 done (or nothing to abort), 1 refused, stopped or a return failed, 2 usage.""")


def _with(xv: Any, **more: Any) -> Any:
    """-e values plus `more` (a vaulted -e @FILE stays a file for ansible-playbook: runner.ExtraVars)."""
    from provisioner.runner.config import copy_extra

    out = copy_extra(xv)
    out.update(more)
    return out


def _key(inventory: Path) -> str:
    return str(inventory.resolve())


def _models(fleet: Any) -> dict[str, str]:
    from provisioner.ledger.view import cluster_model

    return {n: cluster_model(c, n) for n, c in fleet.clusters.items()}


def _last_failure(ops: Any, default: str) -> str:
    bad = [ln["line"] for ln in ops.lines if not ln["ok"]]
    return bad[-1] if bad else default


def _upgrade_batch(ops: Any, ledger: Any, rid: int, fleet: Any, batch: list[str], statuses: dict[str, tuple[str, str]],
                   *, reason: str, force: bool, wait: float, wait_healthy: float, xv: dict[str, Any]) -> bool:
    """One batch: drain, holders, the roles, return. False (after recording the cluster failed) when a step fails."""
    from provisioner.commands.drain import drain_clusters, return_clusters
    from provisioner.drain import plan
    from provisioner.lifecycle import Refused
    from provisioner.runner import make_progress, run_playbook

    t0 = time.monotonic()
    full = [c for c in batch if statuses[c][0] != "returning" and statuses[c][1] != "returning"]
    step = "draining"

    def failed(what: str, clusters: list[str]) -> bool:
        ledger.rollout_step(rid, clusters, "failed", step=step, detail=what)
        return False

    try:
        if full:
            p = plan(fleet, full)
            members = list(p.hosts)
            ledger.rollout_step(rid, full, "draining")
            if not drain_clusters(ops, p, reason=reason, force=force, wait=wait):
                return failed(_last_failure(ops, "the drain failed"), full)
            step = "holders"
            if not ops.holders(members):
                return failed(_last_failure(ops, "a process holds /dev/nvidia*"), full)
            step = "upgrading"
            ledger.rollout_step(rid, full, "upgrading")
            t1 = time.monotonic()
            r = run_playbook(ops.inventory, command="upgrade", limit=",".join(members), skip_tags="vllm",
                             extravars=_with(xv, provision_allow_reboot=True), progress=make_progress("none"),
                             fleet=fleet)
            bad = r.failed_hosts + r.unreachable_hosts
            ok = not r.error and not bad and r.rc in (0, None)
            changed = sorted(n for n, h in r.hosts.items() if h.state == "changed")
            rebooted = sorted(n for n, h in r.hosts.items() if h.rebooted)
            ops.say("upgrade", f"{', '.join(full)}: roles applied on {', '.join(members)} in "
                    f"{time.monotonic() - t1:.1f} s (changed: {', '.join(changed) or 'none'}; rebooted: "
                    f"{', '.join(rebooted) or 'none'})" if ok else
                    f"{', '.join(full)}: the roles FAILED on {', '.join(bad) or 'the play'} "
                    f"({r.error or 'see the run'}; run dir {r.run_dir})", ok=ok,
                    seconds=round(time.monotonic() - t1, 1))
            if not ok:
                return failed(_last_failure(ops, "the roles failed"), full)
            from provisioner.tiers import record_run

            warning = record_run(fleet, r, skip_tags="vllm", extra={"provision_allow_reboot": True, **xv})
            if warning:
                ops.say("note", warning)
        step = "returning"
        ledger.rollout_step(rid, batch, "returning")
        if not return_clusters(ops, plan(fleet, batch), reason=reason, wait_healthy=wait_healthy):
            return failed(_last_failure(ops, "the return failed"), batch)
    except Refused as exc:
        ops.say("refused", f"refused: {exc}", ok=False)
        return failed(f"refused: {exc}", batch)
    ledger.rollout_step(rid, batch, "done", seconds=round(time.monotonic() - t0, 1))
    return True


def _abort(ops: Any, ledger: Any, fleet: Any, ro: Any, wait_healthy: float) -> bool:
    from provisioner.commands.drain import return_clusters
    from provisioner.drain import plan
    from provisioner.lifecycle import Refused

    out = [c.cluster for c in ro.clusters if c.status not in ("pending", "done") and c.cluster in fleet.clusters]
    ok = True
    if out:
        ops.say("abort", f"abort: returning {', '.join(out)}")
        try:
            ok = return_clusters(ops, plan(fleet, out), reason=f"rollout {ro.id} aborted", wait_healthy=wait_healthy)
        except Refused as exc:
            ops.say("refused", f"refused: {exc}", ok=False)
            ok = False
    done = [c.cluster for c in ro.clusters if c.status == "done"]
    ledger.rollout_ended(ro.id, "aborted", "aborted" + ("" if ok else f": {_last_failure(ops, 'a return failed')}"))
    ops.say("aborted", f"rollout {ro.id} aborted: {len(done)} cluster(s) had been upgraded "
            f"({', '.join(done) or 'none'})" + (f", {', '.join(out)} returned" if out and ok else "") +
            ("" if ok else "; what could not return stays drained (provision status)"), ok=ok)
    return ok


def run(inventory: Path, extra: list[str] | None = None, *, max_unavailable: int = 1, abort: bool = False,
        force: bool = False, reason: str | None = None, wait: float = 120.0, wait_healthy: float = 900.0,
        fmt: Format = Format.text) -> int:
    from provisioner.commands.common import extra_vars, validate
    from provisioner.commands.drain import _user
    from provisioner.inventory import load_fleet
    from provisioner.ledger import LedgerError
    from provisioner.ledger.view import open_ledger
    from provisioner.rollout import members_that_balance, spec_digest
    from provisioner.serving_ops import Ops, dumps
    from provisioner.tiers import host_inputs

    if max_unavailable < 1:
        raise UsageError("--max-unavailable must be >= 1")
    if wait < 0 or wait_healthy <= 0:
        raise UsageError("--wait must be >= 0 and --wait-healthy > 0")
    why = (reason or "").strip() or "rolling upgrade"
    xv = extra_vars(extra)
    fleet = load_fleet(inventory, extra_vars=xv)
    from provisioner import vault

    vault.require(fleet, sorted({m for c in fleet.clusters.values() for m in c.members}), xv, "provision upgrade")
    if not fleet.clusters:
        raise UsageError("no vLLM clusters in the inventory: nothing to roll (provision run applies a change)",
                         path=str(inventory))
    errors, _ = validate(fleet)
    if errors:
        for e in errors:
            sys.stderr.write(f"error {finding_line(e)}\n")
        sys.stderr.write(f"refusing to upgrade: {len(errors)} validation error(s) (see `provision validate "
                         f"{inventory}`)\n")
        return int(Exit.FAIL)
    models = _models(fleet)
    members = sorted({m for c in fleet.clusters.values() for m in c.members})
    ok = True
    try:
        with open_ledger(fleet) as ledger:
            key = ledger.digest_key()  # the ledger's one key (the spec digest is recorded there)
            digest = spec_digest(host_inputs(fleet, members, code=False, key=key), xv, key)
            ops = Ops(inventory, fleet, ledger, actor=_user(), quiet=fmt is Format.json, extravars=xv,
                      command="upgrade")
            rid: int | None = None
            order: list[str] = []
            with ledger.atomic():  # check and claim in one write transaction: of two starts at once, one is refused
                ro = ledger.open_rollout()  # the site's: a copy of the inventory (same provision_site) sees it too
                refusal = _refusal(ro, inventory, digest=digest, abort=abort, force=force, models=models)
                if refusal is None and not abort:
                    if ro is None:
                        order = list(fleet.clusters)
                        rid = ledger.rollout_started(_key(inventory), {"extra_keys": sorted(xv), "order": order,
                                                                       "max_unavailable": max_unavailable}, digest,
                                                     order)
                    else:
                        rid = ro.id
                        ledger.rollout_claimed(rid)
            if refusal is not None:
                sys.stderr.write(refusal + "\n")
                return int(Exit.FAIL)
            if abort:
                if ro is None:
                    ops.say("abort", f"no rollout of {inventory} to abort")
                    rid = None
                else:
                    ok = _abort(ops, ledger, fleet, ro, wait_healthy)
                    rid = ro.id
            else:
                if ro is None:
                    ops.say("rollout", f"rollout {rid}: {len(order)} cluster(s), at most {max_unavailable} out at a "
                            f"time: {', '.join(order)}", rollout=rid)
                    members_of = {name: cl.members for name, cl in fleet.clusters.items()}
                    for host, cluster in members_that_balance(members_of, ops.lbs()):
                        ops.say("rollout", f"note: {host} is also a balancer (group lb): the serving edge goes down "
                                f"with it while {cluster} is upgraded (give the balancer a host of its own)",
                                rollout=rid)
                else:
                    left = [f"{c.cluster} ({c.status}{', ' + c.step if c.step else ''})" for c in ro.clusters
                            if c.status != "done"]
                    ops.say("rollout", f"rollout {rid} resumed ({ro.status}): {len(ro.clusters) - len(left)} done, "
                            f"left: {', '.join(left)}", rollout=rid)
                assert rid is not None
                ok = _roll(ops, ledger, rid, fleet, models, max_unavailable=max_unavailable, force=force,
                           reason=f"upgrade: {why}", wait=wait, wait_healthy=wait_healthy, xv=xv)
    except LedgerError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return int(Exit.FAIL)
    if fmt is Format.json:
        sys.stdout.write(dumps(ops, rollout=rid))
    return int(Exit.OK if ok else Exit.FAIL)


def _refusal(ro: Any, inventory: Path, *, digest: str, abort: bool, force: bool, models: dict[str, str]) -> str | None:
    """Why this upgrade may not start or resume (one line), given the site's open rollout `ro`; None: it may. Pure."""
    from provisioner.hoststate import KEYED
    from provisioner.rollout import single_model_clusters

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


def _roll(ops: Any, ledger: Any, rid: int, fleet: Any, models: dict[str, str], *, max_unavailable: int, force: bool,
          reason: str, wait: float, wait_healthy: float, xv: dict[str, Any]) -> bool:
    """Batch after batch until every cluster is done (True) or a step fails or nothing may go out (False)."""
    from provisioner.ledger.view import serving_clusters as serving
    from provisioner.rollout import next_batch, progress

    t0 = time.monotonic()
    while True:
        ro = ledger.rollout(rid)
        statuses = {c.cluster: (c.status, c.step or "") for c in ro.clusters}
        pending = sorted((c for c in ro.clusters if c.status != "done"), key=lambda c: (c.status == "pending",
                                                                                        c.position))
        if not pending:
            ledger.rollout_ended(rid, "done")
            ops.say("done", f"rollout {rid} done: {len(statuses)} cluster(s) upgraded in "
                    f"{time.monotonic() - t0:.1f} s", seconds=round(time.monotonic() - t0, 1))
            return True
        batch, why = next_batch([c.cluster for c in pending], models, serving(fleet, ledger), max_unavailable,
                                force=force)
        if not batch:
            ledger.rollout_ended(rid, "stopped", why)
            ops.say("stopped", f"rollout {rid} stopped: {why}", ok=False)
            return False
        ops.say("batch", f"upgrading {', '.join(batch)}", clusters=batch)
        if not _upgrade_batch(ops, ledger, rid, fleet, batch, statuses, reason=reason, force=force, wait=wait,
                              wait_healthy=wait_healthy, xv=xv):
            detail = _last_failure(ops, "a step failed")
            ledger.rollout_ended(rid, "stopped", detail)
            ops.say("stopped", f"rollout {rid} stopped at {', '.join(batch)}: {detail}; the cluster stays out of "
                    "service: fix it and rerun the same command to resume, or --abort", ok=False)
            return False
        now = {c.cluster: c.status for c in ledger.rollout(rid).clusters}
        ops.say("progress", f"rollout {rid}: {progress(now, models, serving(fleet, ledger))}")


Inv = Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)]


def register(app: typer.Typer) -> None:
    @app.command("upgrade", help=HELP)
    def upgrade_cmd(
        inventory: Inv,
        extra: Annotated[list[str] | None, typer.Option("--extra-vars", "-e", help=EXTRA_VARS_HELP)] = None,
        max_unavailable: Annotated[int, typer.Option(
            "--max-unavailable", help="Clusters out of service at a time.")] = 1,
        abort: Annotated[bool, typer.Option("--abort", help="Return what the open rollout took out, close it.")
                         ] = False,
        force: Annotated[bool, typer.Option("--force", help="Take out even the last cluster serving a model.")] = False,
        reason: Annotated[str | None, typer.Option("--reason", "-r", help="Why (kept in the ledger).")] = None,
        wait: Annotated[float, typer.Option("--wait", help="Seconds to wait for in-flight requests.")] = 120.0,
        wait_healthy: Annotated[float, typer.Option(
            "--wait-healthy", help="Seconds to wait for each head's /health after the launch.")] = 900.0,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Text or JSON.")] = Format.text,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, extra, max_unavailable=max_unavailable, abort=abort, force=force,
                             reason=reason, wait=wait, wait_healthy=wait_healthy, fmt=fmt))
