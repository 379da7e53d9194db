"""Run playbooks through ansible-runner's Python API; the thin entry point, in the shape of ansible-runner's own
`interface.py`: keyword options (`run_playbook`) or a config object (`execute(RunConfig(...))`), events streamed to
callbacks (a `Progress` display, `on_event`), a folded `RunResult` back.

- A fresh run directory per execution (`.runs/<UTC timestamp>-<command>/` in a checkout, `runs/` of the per-user
  state directory when installed: provisioner/paths.py) is ansible-runner's private data dir, so options
  ansible-runner writes into `env/` are never reused by a later run; artifacts (`artifacts/ansible/`) stay there, with
  our `result.json` and `retry` file beside.
- The project's `ansible.cfg` is used explicitly (`ANSIBLE_CONFIG`), and the two settings ansible-runner would
  override silently are put back: host key checking stays on, and the fact cache stays ours (one per inventory).
- The data root is the Ansible collection provisioner.gpu: the run directory gets `collections/` linking it
  (`paths.link_collection`), first on ANSIBLE_COLLECTIONS_PATH.

Modules: `config` (RunConfig, run directories, limits), `events` (event folding), `progress` (displays).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner import paths
from provisioner.results import RunResult
from provisioner.runner.config import (
    ExtraVars,
    RunConfig,
    copy_extra,
    fact_cache_dir,
    new_run_dir,
    resolve_limit,
    size_forks,
    target_hosts,
    validate_serial,
)
from provisioner.runner.events import CENSORED, EventFolder, failure_message, render_diff, resources_of
from provisioner.runner.progress import LineProgress, LiveProgress, NullProgress, Progress, make_progress

if TYPE_CHECKING:
    from provisioner.model import Fleet


__all__ = [
    "CENSORED", "EventFolder", "ExtraVars", "LineProgress", "LiveProgress", "NullProgress", "Progress", "RunConfig",
    "execute", "fact_cache_dir", "failure_message", "make_progress", "new_run_dir", "render_diff", "resolve_limit",
    "resources_of", "run_playbook", "size_forks", "target_hosts", "validate_serial",
]


_ENV_KEEP = re.compile(r"^(ANSIBLE_|RUNNER_|AWX_|PATH$|HOME$|LANG$|LC_|PWD$|USER$|SHELL$|TERM$)")
#: ...but never a secret of those families (ANSIBLE_BECOME_PASS, ANSIBLE_SSH_PASSWORD, a *_TOKEN); a path to one
#: (ANSIBLE_VAULT_PASSWORD_FILE, ANSIBLE_PRIVATE_KEY_FILE) stays
_ENV_SECRET = re.compile(r"(?i)(PASS|SECRET|TOKEN|CREDENTIAL|API_?KEY|PRIVATE_KEY|KEY_DATA)(?!.*_(FILE|PATH|DIR)$)")


def _keep_env(name: str) -> bool:
    return bool(_ENV_KEEP.match(name)) and not _ENV_SECRET.search(name)


def scrub_run_inputs(run_dir: Path) -> None:
    """ansible-runner dumps its inputs into `<private data dir>/env/`: `extravars` (every -e value, a vaulted one
    decrypted), `envvars`, `ssh_key`, `passwords`. ansible-playbook has read them once the run ends, so they go then
    (interrupted runs included); the run directory keeps the artifacts, which say what ran."""
    shutil.rmtree(run_dir / "env", ignore_errors=True)


def scrub_command_artifact(artifact_dir: Path) -> None:
    """ansible-runner writes the whole process environment into `artifacts/<ident>/command`; keep only what
    explains the run (ANSIBLE_*, PATH, ...) so tokens living in the operator's environment never land in artifacts."""
    f = artifact_dir / "command"
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        return
    env = data.get("env") or {}
    data["env"] = {k: v for k, v in env.items() if _keep_env(k)}
    data["env_scrubbed"] = sorted(k for k in env if not _keep_env(k))
    f.write_text(json.dumps(data, ensure_ascii=False))


def _error_tail(stdout: Path, lines: int = 8) -> str | None:
    try:
        text = stdout.read_text(errors="replace")
    except OSError:
        return None
    from provisioner.reports.untrusted import terminal_safe

    text = terminal_safe(re.sub(r"\x1b\[[0-9;]*m", "", text))  # Ansible's colours dropped, anything else shown
    keep = [ln for ln in text.strip().splitlines() if ln.strip()]
    errs = [i for i, ln in enumerate(keep) if ln.startswith("ERROR!") or "[ERROR]" in ln]
    if errs:
        keep = keep[errs[0]:]
    return "\n".join(keep[:lines]) or None


def execute(
    config: RunConfig,
    *,
    progress: Progress | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    on_run_dir: Callable[[Path], None] | None = None,
    fleet: Fleet | None = None,
) -> RunResult:
    """Run `config` and return the folded result. Callbacks: `progress` (display), `on_event` (every
    ansible-runner event, after folding), `on_run_dir` (the fresh run directory, before Ansible starts). `fleet`: the
    inventory as `load_fleet` read it, so the limit is resolved without parsing it again.

    Raises UsageError for bad input (missing playbook/inventory, a --limit matching nothing). Ansible-side problems
    (syntax errors, failed/unreachable hosts) are in the result, never raised."""
    import ansible_runner

    from provisioner.inventory import inventory_source

    cfg = config.prepared(fleet)
    assert cfg.targeted is not None and cfg.playbook is not None
    run_dir = new_run_dir(cfg.command, cfg.runs_dir)
    if on_run_dir:
        on_run_dir(run_dir)
    artifacts_root = run_dir / "artifacts"
    ident = "ansible"
    targeted = list(cfg.targeted)
    result = RunResult(
        command=cfg.command, inventory=str(cfg.inventory), playbook=str(cfg.playbook), run_dir=str(run_dir),
        artifact_dir=str(artifacts_root / ident), started=time.time(), check=cfg.check, limit=cfg.limit,
        tags=cfg.tags, skip_tags=cfg.skip_tags, serial=cfg.serial, max_fail_percent=cfg.max_fail_percent,
        forks=cfg.forks, targeted=targeted,
    )
    for name in targeted:
        result.host(name)

    prog = progress or NullProgress()
    folder = EventFolder(result, prog, on_event)
    prog.start(result)
    t0 = time.monotonic()
    runner = None
    try:
        runner = ansible_runner.run(
            private_data_dir=str(run_dir),
            artifact_dir=str(artifacts_root),
            ident=ident,
            project_dir=str(paths.DATA_ROOT),
            playbook=str(cfg.playbook.resolve()),
            inventory=str(inventory_source(cfg.inventory)),  # as `ansible-playbook -i` resolves it (and load_fleet)
            limit=cfg.limit,
            tags=cfg.tags,
            skip_tags=cfg.ansible_skip_tags(),
            forks=cfg.forks,
            extravars=cfg.ansible_extravars() or None,
            cmdline=cfg.ansible_cmdline(),
            envvars=cfg.ansible_env(run_dir),
            event_handler=folder,
            quiet=True,
            fact_cache_type="none",  # keep ansible.cfg's persistent fact cache (runner would use a per-run one)
            timeout=cfg.timeout,
        )
    finally:
        scrub_run_inputs(run_dir)
        scrub_command_artifact(Path(result.artifact_dir))
        result.duration = time.monotonic() - t0
        if runner is not None:
            result.status = runner.status
            result.rc = runner.rc
        prog.finish(result)

    folder.finish(targeted)
    if runner is not None and runner.rc not in (0, None) and not any(h.seen for h in result.hosts.values()):
        result.error = _error_tail(Path(result.artifact_dir) / "stdout") or f"ansible-playbook exited {runner.rc}"
    elif runner is not None and runner.status in ("timeout", "canceled", "error") and result.error is None:
        result.error = f"ansible-runner status {runner.status}"
    if result.retry_hosts:
        rf = run_dir / "retry"
        rf.write_text("".join(h + "\n" for h in result.retry_hosts))
        result.retry_file = str(rf)
    (run_dir / "result.json").write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    return result


def run_playbook(
    inventory: str | os.PathLike[str],
    *,
    command: str = "run",
    playbook: str | os.PathLike[str] | None = None,
    limit: str | None = None,
    tags: str | None = None,
    skip_tags: str | None = None,
    check: bool = False,
    diff: bool | None = None,
    serial: str | None = None,
    max_fail_percent: int | None = None,
    extravars: dict[str, Any] | None = None,
    forks: int | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
    envvars: dict[str, str] | None = None,
    timeout: int | None = None,
    targeted: list[str] | None = None,
    progress: Progress | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    on_run_dir: Callable[[Path], None] | None = None,
    fleet: Fleet | None = None,
    accelerate: str | None = None,
    exec_nodes: list[str] | None = None,
    amend: Callable[[RunResult], None] | None = None,
    idle_roles: tuple[str, ...] = (),
    ledger_site: str | None = None,
) -> RunResult:
    """Run `playbook` (default playbooks/site.yml) on `inventory`: `execute(RunConfig(...))` with these options
    (RunConfig documents them) and callbacks. With `exec_nodes` (and the `fleet`), the targeted hosts are sharded
    across those execution nodes (provisioner/runner/stream.py) and folded into the same result. `amend(result)` runs
    before the ledger records it. `ledger_site`: the inventory's ledger site (provisioner/ledger/site.py) when the
    caller knows it (else read from the inventory)."""
    config = RunConfig(
        inventory=Path(inventory), command=command, playbook=Path(playbook) if playbook else None, limit=limit,
        tags=tags, skip_tags=skip_tags, check=check, diff=diff, serial=serial, max_fail_percent=max_fail_percent,
        extravars=copy_extra(extravars), forks=forks, runs_dir=Path(runs_dir) if runs_dir else None,
        envvars=dict(envvars or {}), timeout=timeout, targeted=tuple(targeted) if targeted is not None else None,
        accelerate=accelerate, idle_roles=tuple(idle_roles),
    )
    from provisioner.ledger.record import Recorder

    # indexes the run in the ledger (best effort), in the inventory's site, every targeted host `running` until it ends
    rec = Recorder(command, inventory, on_run_dir, targeted, fleet=fleet, limit=limit, site=ledger_site)
    on_run_dir = rec.on_run_dir
    if exec_nodes:
        from provisioner.inventory import load_fleet
        from provisioner.runner.shards import plan
        from provisioner.runner.stream import execute_sharded

        fleet = fleet or load_fleet(inventory, extra_vars=extravars)
        hosts = list(targeted) if targeted is not None else target_hosts(fleet, config.limit)
        result = execute_sharded(config, plan(fleet, hosts, exec_nodes), fleet, progress=progress,
                                 on_run_dir=on_run_dir, on_event=on_event)
    else:
        result = execute(config, progress=progress, on_event=on_event, on_run_dir=on_run_dir, fleet=fleet)
    if amend is not None:  # the caller completes the result before the ledger indexes it (drift's tier-1 hosts)
        amend(result)
    return rec.finish(result)
