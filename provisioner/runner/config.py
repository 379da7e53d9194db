"""What one playbook run is (`RunConfig`) and the checks and paths around it: run directories, `--limit` and
`--serial` checks, the hosts a limit selects, forks, the fact cache of an inventory."""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner import paths
from provisioner.accelerate import env as accelerate_env
from provisioner.errors import UsageError

if TYPE_CHECKING:
    from provisioner.model import Fleet

ANSIBLE_CFG = paths.ANSIBLE_CFG
#: Run directories kept per command; older ones are pruned (override: PROVISION_KEEP_RUNS).
KEEP_RUNS = 50
#: Upper bound for forks sized to the inventory (override: PROVISION_MAX_FORKS).
MAX_FORKS = 50

def _now_stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def new_run_dir(command: str, runs_dir: str | os.PathLike[str] | None = None) -> Path:
    """A fresh, empty directory `<runs>/<UTC timestamp>-<command>[-n]/`; prunes old ones of the same command."""
    # <repo>/.runs in a checkout, the per-user state directory when installed; PROVISION_RUNS_DIR overrides
    base = Path(runs_dir) if runs_dir else paths.runs_dir()
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the run directory: {exc.strerror} (set PROVISION_STATE_DIR or "
                         "PROVISION_RUNS_DIR to a writable directory)", path=str(base)) from None
    stamp = _now_stamp()
    for n in range(1, 1000):
        d = base / (f"{stamp}-{command}" if n == 1 else f"{stamp}-{command}-{n}")
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue
        _prune(base, command, keep=int(os.environ.get("PROVISION_KEEP_RUNS", KEEP_RUNS)))
        return d
    raise RuntimeError(f"cannot create a run directory under {base}")


def _prune(base: Path, command: str, keep: int) -> None:
    if keep <= 0:
        return
    pat = re.compile(rf"\d{{8}}T\d{{6}}Z-{re.escape(command)}(-\d+)?")
    dirs = sorted(p for p in base.iterdir() if p.is_dir() and pat.fullmatch(p.name))
    for old in dirs[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def resolve_limit(limit: str | None) -> str | None:
    """Make `@file` parts of a --limit absolute (ansible-runner runs from its own directory)."""
    if not limit:
        return limit
    parts = []
    for part in limit.split(","):
        if part.startswith("@"):
            p = Path(part[1:]).expanduser()
            if not p.is_file():
                raise UsageError("retry/limit file not found", path=str(p))
            part = "@" + str(p.resolve())
        parts.append(part)
    return ",".join(parts)


def target_hosts(inventory: str | os.PathLike[str] | Fleet, limit: str | None) -> list[str]:
    """The hosts the inventory + --limit select, as ansible-playbook will see them. A `Fleet` from `load_fleet`
    is resolved on the inventory it was read from (no second parse)."""
    from provisioner.inventory import limit_hosts, load_fleet

    fleet = inventory if not isinstance(inventory, (str, os.PathLike)) else load_fleet(inventory)
    return limit_hosts(fleet, limit)


def fact_cache_dir(inventory: Path) -> Path:
    """The jsonfile fact cache of one inventory: `.cache/facts.d/<inventory dir name>-<hash of its path>` (in a
    checkout; `facts.d/` of the per-user state directory when installed: provisioner/paths.py).

    Ansible keys cached facts by inventory hostname only; two inventories that both name a host `node01` (two racks,
    two sites) must not read each other's facts."""
    import hashlib

    inv = inventory.resolve()
    digest = hashlib.sha256(str(inv).encode()).hexdigest()[:12]
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{inv.parent.name}-{inv.stem}")[:60]
    return paths.facts_dir() / f"{label}-{digest}"


def size_forks(n_hosts: int) -> int:
    cap = int(os.environ.get("PROVISION_MAX_FORKS", MAX_FORKS))
    return max(1, min(n_hosts, cap))

def validate_serial(serial: str | int | None) -> str | None:
    if serial is None or serial == "":
        return None
    s = str(serial).strip()
    if re.fullmatch(r"[1-9]\d*", s) or re.fullmatch(r"([1-9]\d?|100)%", s):
        return s
    raise UsageError(f"--serial must be a positive number or a percentage like 25%, got {serial!r}")




class ExtraVars(dict[str, Any]):
    """-e values merged (later wins), remembering the `-e @FILE` files that hold vaulted values: ansible-playbook
    reads those itself (`-e @/abs/file` on its command line, before the other values), so their secrets never reach
    argv or the run directory; `from_files` are the keys whose final value such a file gives."""

    files: tuple[str, ...] = ()
    from_files: frozenset[str] = frozenset()


def copy_extra(values: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of -e values that keeps ExtraVars' files."""
    if isinstance(values, ExtraVars):
        out = ExtraVars(values)
        out.files, out.from_files = values.files, values.from_files
        return out
    return dict(values or {})


@dataclass(frozen=True)
class RunConfig:
    """One playbook run, as `provision run|drift|onboard` asks for it (the options of `run_playbook`).

    `prepared()` checks it and fills in what the run needs (absolute paths and limit, the targeted hosts, forks);
    the `ansible_*` methods give what ansible-runner receives."""

    inventory: Path
    command: str = "run"  # run | drift | onboard | ... : names the run directory
    playbook: Path | None = None  # default: playbooks/site.yml of the data root
    limit: str | None = None  # host pattern; `@FILE` parts are made absolute
    tags: str | None = None
    skip_tags: str | None = None
    check: bool = False
    diff: bool | None = None  # default: with check
    serial: str | None = None  # N or N% (extra var provision_serial)
    max_fail_percent: int | None = None  # 0..100 (extra var provision_max_fail_percent)
    extravars: dict[str, Any] = field(default_factory=dict)  # -e, highest precedence
    forks: int | None = None  # default: sized to the targeted hosts
    runs_dir: Path | None = None  # parent of the run directory (default: paths.runs_dir())
    envvars: dict[str, str] = field(default_factory=dict)  # on top of ours
    timeout: int | None = None  # seconds for the whole run
    targeted: tuple[str, ...] | None = None  # the hosts `limit` selects, when the caller resolved them already
    accelerate: str | None = None  # none | mitogen (provisioner/accelerate.py); default $PROVISION_ACCELERATE, none
    idle_roles: tuple[str, ...] = ()  # role tags to skip: they act on no targeted host (provisioner/role_gates.py)

    def prepared(self, fleet: Fleet | None = None) -> RunConfig:
        """This config checked and completed; UsageError for bad input. With `fleet` (loaded from the same
        inventory), the limit is resolved on its already parsed inventory instead of parsing it again."""
        inv = Path(self.inventory)
        if not inv.exists():
            raise UsageError("inventory not found", path=str(inv))
        pb = Path(self.playbook) if self.playbook else paths.data_file(paths.PLAYBOOKS / "site.yml")
        if not pb.is_file():
            raise UsageError("playbook not found", path=str(pb))
        paths.data_file(ANSIBLE_CFG)
        limit = resolve_limit(self.limit)
        targeted = self.targeted if self.targeted is not None else tuple(target_hosts(fleet or inv, limit))
        if not targeted:
            raise UsageError(f"no hosts match{' --limit ' + limit if limit else ''}", path=str(inv))
        serial = validate_serial(self.serial)
        accelerate_env(self.accelerate)  # an unknown or uninstalled accelerator: UsageError before the run starts
        if self.max_fail_percent is not None and not 0 <= self.max_fail_percent <= 100:
            raise UsageError(f"--max-fail-percent must be 0..100, got {self.max_fail_percent}")
        return replace(self, inventory=inv, playbook=pb, limit=limit, serial=serial, targeted=tuple(targeted),
                       forks=self.forks or size_forks(len(targeted)))

    def ansible_skip_tags(self) -> str | None:
        skip = [self.skip_tags, *self.idle_roles]
        if self.command in ("run", "drift") and "validate" not in (self.tags or "").split(","):
            # `provision run/drift` already ran the same rules in Python (provisioner.rules): skip the validate.yml
            # plays, which cost a third of a no-op run's controller CPU (benchmarks/README.md).
            skip.append("validate")
        return ",".join(filter(None, skip)) or None

    def ansible_extravars(self) -> dict[str, Any]:
        # ansible-playbook reads these from the file
        skip: frozenset[str] = getattr(self.extravars, "from_files", frozenset())
        xv: dict[str, Any] = {k: v for k, v in self.extravars.items() if k not in skip}
        if self.serial is not None:
            xv["provision_serial"] = self.serial
        if self.max_fail_percent is not None:
            xv["provision_max_fail_percent"] = self.max_fail_percent
        return xv

    def ansible_cmdline(self) -> str | None:
        import shlex

        args = [f"-e @{shlex.quote(f)}" for f in getattr(self.extravars, "files", ())]
        if self.check:
            args.append("--check")
        if self.diff if self.diff is not None else self.check:
            args.append("--diff")
        return " ".join(args) or None

    def ansible_env(self, run_dir: Path) -> dict[str, str]:
        """ansible-playbook's environment: our ansible.cfg, the collection linked in `run_dir`, host key checking on,
        our fact cache; then `envvars`."""
        # the roles call provisioner.gpu.* (module, filters): the data root, linked as that collection in the run
        # directory (a checkout and an installed wheel alike), ahead of the collections the site has installed
        user_collections = os.environ.get("ANSIBLE_COLLECTIONS_PATH") or os.pathsep.join(
            [str(Path("~/.ansible/collections").expanduser()), "/usr/share/ansible/collections"])
        env = {
            "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
            "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join([str(paths.link_collection(run_dir)), user_collections]),
            # ansible-runner sets host key checking off unless told; ours stays on (ansible.cfg says so too)
            "ANSIBLE_HOST_KEY_CHECKING": os.environ.get("ANSIBLE_HOST_KEY_CHECKING", "True"),
            "ANSIBLE_FORCE_COLOR": "False",
            "ANSIBLE_CACHE_PLUGIN_CONNECTION": os.environ.get("ANSIBLE_CACHE_PLUGIN_CONNECTION",
                                                              str(fact_cache_dir(Path(self.inventory)))),
            # the ansible-playbook of the Python running us (a venv's bin/ need not be on PATH)
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "ANSIBLE_NOCOLOR": "True",
            # ansible-runner's event callback, naming the host's path of changed file results (runner/callback/)
            "AWX_LIB_DIRECTORY": str(Path(__file__).resolve().parent / "callback"),
            # AnsiballZ payloads kept between runs (runner/forkcost.py, run by that callback)
            "PROVISION_ANSIBALLZ_CACHE": os.environ.get("PROVISION_ANSIBALLZ_CACHE", str(paths.ansiballz_dir())),
        }
        env = {k: v for k, v in env.items() if v}
        env.update(accelerate_env(self.accelerate))  # the strategy: linear (ansible.cfg) or mitogen_linear
        from provisioner import vault

        env.update(vault.runner_env())  # the vault secrets' sources (paths, never a password)
        env.update(self.envvars)
        return env
