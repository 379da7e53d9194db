"""One run sharded across execution nodes with ansible-runner's own streaming (`transmit` -> `worker` -> `process`,
the protocol AWX and Receptor use), SSH as the transport: each shard's job goes to `ansible-runner worker` on its
node, its events come back into the same `RunResult` a single-controller run produces."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner import paths
from provisioner.defaults import role_default
from provisioner.errors import UsageError, describe
from provisioner.results import RunResult
from provisioner.runner.config import RunConfig, fact_cache_dir, new_run_dir, size_forks
from provisioner.runner.events import EventFolder
from provisioner.runner.progress import NullProgress, Progress
from provisioner.runner.shards import Shard, connection

if TYPE_CHECKING:
    from provisioner.model import Fleet, Host

#: What of the data root a worker needs (the collection provisioner.gpu); the Python package is carried beside it.
PROJECT_PARTS = ("ansible.cfg", "galaxy.yml", "meta", "playbooks", "roles", "templates", "plugins")
#: Environment a worker may not inherit from the controller (paths of this machine).
_ENV_DROP = ("ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_CACHE_PLUGIN_CONNECTION", "PATH",
             "ANSIBLE_STRATEGY_PLUGINS", "ANSIBLE_STRATEGY", "AWX_LIB_DIRECTORY",
             # the controller's vault password files: the worker gets the secrets in its job (_carry_vault)
             "ANSIBLE_VAULT_IDENTITY_LIST", "ANSIBLE_VAULT_PASSWORD_FILE")
#: Where a job's vault passwords lie in its private data dir (0700 dir, 0600 files; the job's dir is removed after).
VAULT_DIR = "vault"


@dataclass
class ShardOutcome:
    """What one shard did, for the report (`result.json` "shards") and the exit code."""

    node: str
    hosts: tuple[str, ...]
    units: tuple[str, ...]
    shard: str = ""  # the node, or NODE-N when it runs several shards
    status: str = "unstarted"
    rc: int | None = None
    duration: float = 0.0
    error: str | None = None
    artifact_dir: str = ""
    events: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "shard": self.shard or self.node, "hosts": list(self.hosts),
                "units": list(self.units), "status": self.status, "rc": self.rc, "duration": round(self.duration, 2),
                "error": self.error, "artifact_dir": self.artifact_dir, "events": self.events}


def _node_setting(host: Host, key: str) -> str:
    v = host.get(key)
    return str(v) if v not in (None, "") else str(role_default("execution_node", key))


def ssh_command(node: Host, remote: list[str]) -> list[str]:
    """`ssh` to the execution node with its inventory connection variables; host keys checked (BatchMode: an unknown
    or changed key fails instead of asking)."""
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=30"]
    for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        if node.get(var):
            cmd += shlex.split(str(node.get(var)))
    if node.get("ansible_ssh_private_key_file"):
        cmd += ["-i", str(node.get("ansible_ssh_private_key_file"))]
    cmd += ["-p", str(node.ssh_port)]
    target = f"{node.ssh_user}@{node.address}" if node.ssh_user else node.address
    return [*cmd, target, "--", shlex.join(remote)]


def _copy_inventory(inventory: Path, dest: Path) -> str:
    """The inventory (a file with its group_vars/ and host_vars/ beside it, or a directory) under `dest`; returns the
    path the worker passes to ansible-playbook, relative to its private data dir."""
    from provisioner.inventory import inventory_source

    inv = inventory_source(inventory)  # group_vars/ beside the path given, as ansible-playbook reads them
    if inv.is_dir():
        shutil.copytree(inv, dest / "inventory" / inv.name, symlinks=False)
        return f"inventory/{inv.name}"
    (dest / "inventory").mkdir(parents=True)
    shutil.copy2(inv, dest / "inventory" / inv.name)
    for sub in ("group_vars", "host_vars"):
        if (inv.parent / sub).is_dir():
            shutil.copytree(inv.parent / sub, dest / "inventory" / sub, symlinks=False)
    return f"inventory/{inv.name}"


def _project(dest: Path, playbook: Path) -> str:
    """The collection (roles, playbooks, plugins...) and the provisioner package the plugins import, under
    `dest/project`, linked as provisioner.gpu in `dest/collections`; returns the playbook relative to the project."""
    proj = dest / "project"
    proj.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_data")
    for part in PROJECT_PARTS:
        src = paths.DATA_ROOT / part
        if src.is_dir():
            shutil.copytree(src, proj / part, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, proj / part)
    shutil.copytree(Path(__file__).resolve().parents[1], proj / "provisioner", ignore=ignore)
    ns = dest / "collections" / "ansible_collections" / "provisioner"
    ns.mkdir(parents=True)
    (ns / "gpu").symlink_to("../../../project", target_is_directory=True)  # relative: valid on the worker too
    pb = playbook.resolve()
    try:
        return str(pb.relative_to(paths.DATA_ROOT.resolve()))
    except ValueError:  # a playbook of the operator's own: beside ours, so roles and relative imports resolve
        shutil.copy2(pb, proj / "playbooks" / pb.name)
        return f"playbooks/{pb.name}"


def _worker_env(cfg: RunConfig, run_dir: Path, worker_dir: str, node: Host) -> dict[str, str]:
    env = {k: v for k, v in cfg.ansible_env(run_dir).items() if k not in _ENV_DROP}
    venv = _node_setting(node, "execution_node_venv")
    facts = fact_cache_dir(Path(cfg.inventory)).name
    env.update({
        "ANSIBLE_CONFIG": f"{worker_dir}/project/ansible.cfg",
        "ANSIBLE_COLLECTIONS_PATH": f"{worker_dir}/collections",
        # per inventory, on the node (kept across jobs): a nightly drift reuses the facts of the last one
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": f"{_node_setting(node, 'execution_node_dir')}/facts/{facts}",
        "PATH": f"{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        # the plugins import the controller's own provisioner package, carried in the project; its data (the roles'
        # defaults the plan reads) is the project itself (no pyproject.toml there to mark a checkout)
        "PYTHONPATH": f"{worker_dir}/project",
        "PROVISION_DATA_DIR": f"{worker_dir}/project",
    })
    return env


def _carry_vault(pdd: Path, worker_dir: str) -> dict[str, str]:
    """This controller's vault secrets written into the job's private data dir (a 0700 temp dir here; ansible-runner
    streams it over the SSH channel, the worker extracts it keeping the modes, in its 0700 jobs dir): the environment
    naming them for the worker's ansible-playbook, paths only. {} when no secret is loaded."""
    from provisioner import vault

    secrets = vault.worker_secrets()
    if not secrets:
        return {}
    (pdd / VAULT_DIR).mkdir(mode=0o700)
    ids = []
    for i, (vid, pw) in enumerate(secrets):
        fd = os.open(pdd / VAULT_DIR / str(i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, pw)
        finally:
            os.close(fd)
        ids.append(f"{vid}@{worker_dir}/{VAULT_DIR}/{i}")
    return {"ANSIBLE_VAULT_IDENTITY_LIST": ",".join(ids)}


def _carry_extra_files(cfg: RunConfig, pdd: Path, worker_dir: str) -> RunConfig:
    """`cfg` with its vaulted `-e @FILE` files (ansible-playbook reads them itself: RunConfig.ansible_cmdline)
    copied into the job's private data dir (still encrypted, 0600) and named by their path on the worker."""
    from provisioner.runner.config import copy_extra

    files = tuple(getattr(cfg.extravars, "files", ()))
    if not files:
        return cfg
    (pdd / "extravars").mkdir(mode=0o700)
    xv = copy_extra(cfg.extravars)
    moved = []
    for i, f in enumerate(files):
        dest = pdd / "extravars" / f"{i}-{Path(f).name}"
        shutil.copyfile(f, dest)
        os.chmod(dest, 0o600)
        moved.append(f"{worker_dir}/extravars/{dest.name}")
    xv.files = tuple(moved)  # type: ignore[attr-defined]
    return replace(cfg, extravars=xv)


def worker_command(venv: str, worker_dir: str) -> list[str]:
    """`ansible-runner worker` on the node, its job dir removed whatever way it ends (`--delete` cleans up at a normal
    exit only; a worker killed mid-way would leave the carried key and vault passwords behind)."""
    script = 'd=$1; shift; trap \'rm -rf -- "$d"\' EXIT; trap "exit 129" HUP; trap "exit 143" TERM; "$@"; exit "$?"'
    return ["sh", "-c", script, "sh", worker_dir, f"{venv}/bin/ansible-runner", "worker", "--private-data-dir",
            worker_dir, "--delete"]


class _Locked:
    """The run's progress display, for the shards' threads (play/task/host events; start and finish are the run's)."""

    def __init__(self, inner: Progress) -> None:
        self.inner, self.lock = inner, threading.Lock()

    def start(self, result: RunResult) -> None:
        pass

    def finish(self, result: RunResult) -> None:
        pass

    def play(self, name: str, batch: int) -> None:
        with self.lock:
            self.inner.play(name, batch)

    def task(self, name: str, role: str | None, handler: bool) -> None:
        with self.lock:
            self.inner.task(name, role, handler)

    def host_event(self, host: str, kind: str, message: str | None = None) -> None:
        with self.lock:
            self.inner.host_event(host, kind, message)

    def retry(self, host: str, subject: str, attempt: int, attempts: int) -> None:
        with self.lock:
            self.inner.retry(host, subject, attempt, attempts)

    def item_event(self, host: str, subject: str, kind: str) -> None:
        with self.lock:
            self.inner.item_event(host, subject, kind)


def run_shard(cfg: RunConfig, shard: Shard, fleet: Fleet, run_dir: Path, folder: EventFolder,
              outcome: ShardOutcome) -> None:
    """Transmit the shard's job to its node's worker over SSH and process the stream into `folder`."""
    import ansible_runner

    node = fleet.hosts[shard.node]
    job = f"{run_dir.name}-{shard.label}"
    worker_dir = f"{_node_setting(node, 'execution_node_dir')}/jobs/{job}"
    local = run_dir / "shards" / shard.label
    local.mkdir(parents=True)
    outcome.artifact_dir = str(local / "artifacts" / "ansible")
    conn = connection(fleet, shard.hosts, worker_dir)
    t0 = time.monotonic()
    # the job's private data dir lives only in a 0700 temp dir (it carries the shard's SSH key), never in the run dir
    with tempfile.TemporaryDirectory(prefix="provision-shard-") as tmp:
        pdd = Path(tmp)
        playbook = _project(pdd, Path(cfg.playbook or ""))
        inventory = _copy_inventory(Path(cfg.inventory), pdd)
        for rel, src in conn.files:
            (pdd / rel).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                shutil.copyfile(src, pdd / rel)
            except OSError as exc:
                raise UsageError(f"cannot carry {src} to execution node {shard.node}: {exc.strerror}",
                                 path=str(cfg.inventory)) from None
            os.chmod(pdd / rel, 0o600)
        jcfg = _carry_extra_files(cfg, pdd, worker_dir)
        extravars = {**jcfg.ansible_extravars(), **dict(conn.extravars)}
        envvars = {**_worker_env(cfg, run_dir, worker_dir, node), **_carry_vault(pdd, worker_dir)}
        remote = worker_command(_node_setting(node, "execution_node_venv"), worker_dir)
        proc = subprocess.Popen(ssh_command(node, remote), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        errs: list[bytes] = []
        drain = threading.Thread(target=lambda: errs.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
        drain.start()

        def transmit() -> None:
            try:
                ansible_runner.run(
                    # absolute paths inside the private data dir: ansible-runner sends them relative to it (a
                    # relative inventory path would be taken for inventory TEXT)
                    streamer="transmit", _output=proc.stdin, private_data_dir=str(pdd),
                    playbook=str(pdd / "project" / playbook), inventory=str(pdd / inventory),
                    limit=",".join(shard.hosts), tags=cfg.tags, skip_tags=cfg.ansible_skip_tags(),
                    forks=size_forks(len(shard.hosts)), extravars=extravars or None, cmdline=jcfg.ansible_cmdline(),
                    envvars=envvars, fact_cache_type="none", timeout=cfg.timeout,
                    ident="ansible",
                )
            except (BrokenPipeError, OSError):
                pass  # the worker side went away: its stderr says why
            finally:
                try:
                    proc.stdin.close()  # type: ignore[union-attr]
                except OSError:
                    pass

        sender = threading.Thread(target=transmit, daemon=True)
        sender.start()

        def on_event(event: dict[str, Any]) -> bool:
            outcome.events += 1
            return folder(event)

        processed = ansible_runner.run(
            streamer="process", _input=proc.stdout, private_data_dir=str(local), ident="ansible", quiet=True,
            event_handler=on_event,
        )
        sender.join()
        rc = proc.wait()
        drain.join(timeout=10)
    from provisioner.runner import scrub_command_artifact, scrub_run_inputs

    scrub_run_inputs(local)  # nothing of the job's inputs stays here (they went to the node, which deletes them)
    scrub_command_artifact(local / "artifacts" / "ansible")
    outcome.duration = time.monotonic() - t0
    outcome.status, outcome.rc = processed.status, processed.rc
    if rc != 0 and outcome.events == 0:
        tail = b"".join(errs).decode(errors="replace").strip().splitlines()
        outcome.status = "error"
        outcome.error = f"execution node {shard.node}: " + (tail[-1] if tail else f"ssh exited {rc}")
    (local / "shard.json").write_text(json.dumps(outcome.to_dict(), indent=2) + "\n")


def check_accelerate(accelerate: str | None) -> None:
    """Mitogen's strategy lives in this controller's Python environment, not on the execution nodes."""
    from provisioner.accelerate import mode

    if mode(accelerate) != "none":
        raise UsageError("--accelerate mitogen runs on this controller only: drop it, or drop --exec-node")


def execute_sharded(
    config: RunConfig,
    shards: list[Shard],
    fleet: Fleet,
    *,
    progress: Progress | None = None,
    on_run_dir: Callable[[Path], None] | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> RunResult:
    """Run `config` as `shards`, all at once, and fold every shard's events into one `RunResult` (the same report a
    single-controller run gives; `result.json` adds "shards"). A shard whose node cannot be reached leaves its hosts
    unreachable, naming the node. `on_event` sees every shard's events, from the shards' threads."""
    check_accelerate(config.accelerate)
    targeted = tuple(h for s in shards for h in s.hosts)
    cfg = replace(config, targeted=targeted).prepared(fleet)
    assert cfg.playbook is not None
    run_dir = new_run_dir(cfg.command, cfg.runs_dir)
    if on_run_dir:
        on_run_dir(run_dir)
    result = RunResult(
        command=cfg.command, inventory=str(cfg.inventory), playbook=str(cfg.playbook), run_dir=str(run_dir),
        artifact_dir=str(run_dir / "shards"), started=time.time(), check=cfg.check, limit=cfg.limit, tags=cfg.tags,
        skip_tags=cfg.skip_tags, serial=cfg.serial, max_fail_percent=cfg.max_fail_percent,
        forks=max(size_forks(len(s.hosts)) for s in shards), targeted=list(targeted),
    )
    for name in targeted:
        result.host(name)
    prog = progress or NullProgress()
    shared = _Locked(prog)
    outcomes = [ShardOutcome(node=s.node, hosts=s.hosts, units=s.units, shard=s.label) for s in shards]
    parts = [RunResult(command=cfg.command, inventory=result.inventory, playbook=result.playbook, run_dir=str(run_dir),
                       artifact_dir="", started=result.started, check=cfg.check) for _ in shards]
    folders = [EventFolder(part, shared, on_event) for part in parts]  # on_event: from the shards' threads
    prog.start(result)
    t0 = time.monotonic()

    def one(i: int) -> None:
        try:
            run_shard(cfg, shards[i], fleet, run_dir, folders[i], outcomes[i])
        except UsageError as exc:
            outcomes[i].status, outcomes[i].error = "error", str(exc)
        except Exception as exc:  # a broken stream must not take the other shards down
            outcomes[i].status, outcomes[i].error = "error", f"execution node {shards[i].node}: {describe(exc)}"

    threads = [threading.Thread(target=one, args=(i,), name=f"shard-{s.label}") for i, s in enumerate(shards)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.duration = time.monotonic() - t0
    for shard, part, folder, out in zip(shards, parts, folders, outcomes, strict=True):
        folder.finish(shard.hosts)
        for name in shard.hosts:
            h = part.hosts.get(name)
            if h is not None:
                result.hosts[name] = h
            if out.error and not result.hosts[name].seen:
                hr = result.hosts[name]
                hr.unreachable, hr.unreachable_message, hr.seen = 1, out.error, True
        result.batches.extend(part.batches)
        result.aborted = result.aborted or part.aborted
    worst = [o for o in outcomes if o.rc not in (0, None) or o.status not in ("successful",)]
    result.status = "successful" if not worst else (worst[0].status or "failed")
    result.rc = max((o.rc or 0) for o in outcomes) if not any(o.error for o in outcomes) else 1
    errors = [o.error for o in outcomes if o.error]
    if errors and not any(h.seen and not h.unreachable for h in result.hosts.values()):
        result.error = "; ".join(errors)
    prog.finish(result)
    if result.retry_hosts:
        rf = run_dir / "retry"
        rf.write_text("".join(h + "\n" for h in result.retry_hosts))
        result.retry_file = str(rf)
    result.shards = [o.to_dict() for o in outcomes]
    (run_dir / "result.json").write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    return result
