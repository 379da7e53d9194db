"""Recording runs into the ledger, best effort: a ledger that cannot be written prints one warning line on stderr
and never fails the run (the run directory stays the artifact of record).

- `Recorder`: the runner's hook (`run_playbook`): opens the run's row (in the inventory's site) when its run directory
  is made, with every targeted host `running` (the inventory and --limit resolved when the caller did not name them,
  so a CLI killed mid-run leaves a row, and an outcome per host, that read `interrupted`), and closes it with the
  RunResult's per-host outcomes and drift items.
- `record_result(ledger, result)`: a finished RunResult in one go. `record_health(...)`: a `provision health` pass.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from provisioner.ledger.store import Ledger, LedgerError


def warn(exc: BaseException, where: Any = None) -> None:
    what = str(exc) if isinstance(exc, LedgerError) else f"{type(exc).__name__}: {exc}"
    if where is not None:  # a driver's own message may echo the URL or a piece of its password
        from provisioner.ledger import pg

        what = pg.scrub(what, str(where))
    sys.stderr.write(f"warning: ledger not updated: {what} (the run itself is unaffected)\n")


def run_status(result: Any) -> str:
    """A RunResult's outcome in one word: ok, drift (a check run that found some), failed, or error."""
    if result.error or result.status in ("timeout", "canceled", "error"):
        return "error"
    if result.failed_hosts or result.unreachable_hosts or result.rc not in (0, None) or not result.succeeded:
        return "failed"
    if result.check and result.drift:
        return "drift"
    return "ok"


def outcome_rows(result: Any) -> list[dict[str, Any]]:
    return [{"host": name, "status": h.state, "changed": h.changed, "failed": h.failed}
            for name, h in sorted(result.hosts.items())]


def record_result(ledger: Ledger, result: Any, run: int | None = None) -> int:
    """Write a finished RunResult (its row, per-host outcomes, drift items); `run`: the row opened at its start."""
    if run is None:
        run = ledger.run_started(result.command, result.inventory, run_dir=result.run_dir, started=result.started)
    ledger.run_finished(run, run_status(result), hosts=outcome_rows(result),
                        drift=[(d.host, d.key) for d in result.drift],
                        ended=result.started + result.duration if result.duration else None)
    return run


def _path() -> Path:
    from provisioner.paths import ledger_path

    return ledger_path()


class Recorder:
    """The runner's hook: `on_run_dir` (wraps the caller's) opens the run's row, `finish(result)` closes it and
    hands the result back. Any ledger failure: one warning, then the recorder stays quiet."""

    def __init__(self, command: str, inventory: Any, on_run_dir: Callable[[Path], None] | None = None,
                 targeted: Iterable[str] | None = None, path: Path | None = None, *, fleet: Any = None,
                 limit: str | None = None, site: str | None = None) -> None:
        self.command, self.inventory, self.inner, self.path = command, str(inventory), on_run_dir, path
        self.targeted = list(targeted) if targeted is not None else None
        self.fleet, self.limit, self.site = fleet, limit, site
        self.run: int | None = None
        self.broken = False

    def _resolve(self) -> None:
        """The site and the targeted hosts, from the inventory when the caller did not give them."""
        if self.site is not None and self.targeted is not None:
            return
        from provisioner.errors import UsageError
        from provisioner.ledger.site import path_site, site_of

        if self.fleet is None:
            from provisioner.inventory import load_fleet

            try:
                self.fleet = load_fleet(self.inventory)
            except UsageError:  # the run itself reports an unreadable inventory; its record goes to the path's site
                self.site = path_site(self.inventory) if self.site is None else self.site
                self.targeted = self.targeted or []
                return
        if self.site is None:
            self.site = site_of(self.fleet)
        if self.targeted is None:
            from provisioner.runner.config import target_hosts

            self.targeted = target_hosts(self.fleet, self.limit)

    def _do(self, fn: Callable[[Ledger], Any]) -> Any:
        if self.broken:
            return None
        try:
            self._resolve()
            with Ledger.open(self.path or _path(), site=self.site or "") as ledger:
                return fn(ledger)
        except Exception as exc:  # noqa: BLE001 (best effort: nothing of the ledger may fail a run)
            self.broken = True
            warn(exc, self.path or _path())
            return None

    def on_run_dir(self, run_dir: Path) -> None:
        if self.path is None:  # beside the run directories it indexes (a run_playbook(runs_dir=...) included)
            from provisioner.paths import ledger_path

            self.path = ledger_path(run_dir.parent)
        self.run = self._do(lambda lg: lg.run_started(self.command, self.inventory, run_dir=str(run_dir),
                                                      hosts=self.targeted or ()))
        if self.inner:
            self.inner(run_dir)

    def finish(self, result: Any) -> Any:
        self._do(lambda lg: record_result(lg, result, self.run))
        return result


def record_health(results: Mapping[str, Any], inventory: Any, started: float, seconds: float,
                  path: Path | None = None, *, site: str | None = None, fleet: Any = None) -> int | None:
    """A `provision health` pass (HostHealth per host): a run `health` in the inventory's site (`site`, else that of
    `fleet`, else of the inventory read here) with an outcome per host (ok / failed / unreachable) and every check's
    result. Best effort, like the runner's hook."""
    hosts, checks = [], []
    for name, h in sorted(results.items()):
        status = "ok" if h.ok else ("unreachable" if not h.reachable else "failed")
        hosts.append({"host": name, "status": status, "failed": 0 if h.ok else 1})
        for c in h.checks:
            checks.append((name, str(c.get("check")), str(c.get("status")), c.get("message")))
        if h.error:
            checks.append((name, "error", "fail", h.error))
    try:
        if site is None:
            from provisioner.errors import UsageError
            from provisioner.ledger.site import path_site, site_for

            try:
                site = site_for(inventory, fleet)
            except UsageError:
                site = path_site(inventory)
        with Ledger.open(path or _path(), site=site) as ledger:
            run = ledger.run_started("health", str(inventory), started=started)
            ledger.run_finished(run, "ok" if all(h.ok for h in results.values()) else "failed", hosts=hosts,
                                health=checks, ended=started + seconds)
            return run
    except Exception as exc:  # noqa: BLE001 (best effort, as above)
        warn(exc, path or _path())
        return None


def record_burnin(results: Mapping[str, Any], tier: str, inventory: Any, started: float, seconds: float,
                  path: Path | None = None, *, fleet: Any = None) -> int | None:
    """A `provision burn-in` pass (HostBurnin per host): a run `burn-in` with an outcome per host and one
    burnin_results row per check per GPU. Best effort, like record_health."""
    hosts, rows = [], []
    for name, h in sorted(results.items()):
        status = "ok" if h.ok else ("unreachable" if not h.reachable else "failed")
        hosts.append({"host": name, "status": status, "failed": 0 if h.ok else 1})
        rows += [(name, r) for r in h.results]
        if h.error:
            rows.append((name, {"check": "error", "status": "fail", "code": "BRN014", "message": h.error}))
    try:
        from provisioner.errors import UsageError
        from provisioner.ledger.site import path_site, site_for

        try:
            site = site_for(inventory, fleet)
        except UsageError:
            site = path_site(inventory)
        with Ledger.open(path or _path(), site=site) as ledger, ledger.atomic():
            run = ledger.run_started("burn-in", str(inventory), started=started)
            ledger.burnin_recorded(run, tier, rows)
            ledger.run_finished(run, "ok" if all(h.ok for h in results.values()) else "failed", hosts=hosts,
                                ended=started + seconds)
            return run
    except Exception as exc:  # noqa: BLE001 (best effort, as above)
        warn(exc, path or _path())
        return None
