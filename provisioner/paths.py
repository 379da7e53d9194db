"""Where provisioner finds its Ansible side and where it writes its state: the one place that decides.

Data root (`ansible.cfg`, `playbooks/`, `roles/`, `templates/`, `plugins/`, `galaxy.yml`, `meta/`: the Ansible
collection provisioner.gpu):
- a checkout (running from the repository, or an editable install `pip install -e .`): the repository root, the
  parent of this package, so edits to roles/ take effect at once;
- an installed package (a wheel, `pip install .`): `provisioner/_data/` inside the package (hatch_build.py copies
  the repository's directories there when the wheel is built);
- `PROVISION_DATA_DIR` overrides both (a directory with the same layout).

State (run directories, the fact cache, the kept AnsiballZ payloads):
- a checkout: `<repo>/.runs/`, `<repo>/.cache/facts.d/` and `<repo>/.cache/ansiballz/` (tests read `.runs/` there);
- installed: `$PROVISION_STATE_DIR`, else `$XDG_STATE_HOME/provisioner`, else `~/.local/state/provisioner`, with
  `runs/`, `facts.d/` and `ansiballz/` in it (`PROVISION_STATE_DIR` works in a checkout too). `PROVISION_RUNS_DIR`
  still overrides the runs directory alone.

The ledger (provisioner/ledger/): `ledger.sqlite3` in the runs directory it indexes (so whatever moves the runs
moves their index with them); `PROVISION_LEDGER` overrides (a file path).

Only the standard library here: the CLI's fast path imports it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from provisioner.errors import UsageError

#: The `provisioner` package directory.
PACKAGE_DIR = Path(__file__).resolve().parent
#: Where a wheel carries the Ansible side.
PACKAGED_DATA = PACKAGE_DIR / "_data"

#: True when running from the repository (a checkout or an editable install), False when installed.
CHECKOUT = not PACKAGED_DATA.is_dir() and (PACKAGE_DIR.parent / "pyproject.toml").is_file()

#: The directory holding ansible.cfg, playbooks/, roles/, templates/, plugins/ (the collection provisioner.gpu).
DATA_ROOT = Path(os.environ["PROVISION_DATA_DIR"]).resolve() if os.environ.get("PROVISION_DATA_DIR") else (
    PACKAGE_DIR.parent if CHECKOUT else PACKAGED_DATA)
ANSIBLE_CFG = DATA_ROOT / "ansible.cfg"
PLAYBOOKS = DATA_ROOT / "playbooks"
ROLES = DATA_ROOT / "roles"
TEMPLATES = DATA_ROOT / "templates"
PLUGINS = DATA_ROOT / "plugins"
#: The Ansible collection the data root is (galaxy.yml): roles and plugins are `provisioner.gpu.NAME`.
COLLECTION_NAMESPACE, COLLECTION_NAME = "provisioner", "gpu"

#: Inventories: the repository's in a checkout; `./inventories` of the working directory when installed (where
#: `provision testbed up` writes a rack's inventory).
INVENTORIES = (PACKAGE_DIR.parent if CHECKOUT else Path.cwd()) / "inventories"


def state_dir() -> Path:
    """The writable directory for run directories and the fact cache (see the module docstring)."""
    if os.environ.get("PROVISION_STATE_DIR"):
        return Path(os.environ["PROVISION_STATE_DIR"]).expanduser()
    if CHECKOUT:
        return PACKAGE_DIR.parent
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "provisioner"


def runs_dir() -> Path:
    """The parent of the per-run directories (`PROVISION_RUNS_DIR` overrides)."""
    if os.environ.get("PROVISION_RUNS_DIR"):
        return Path(os.environ["PROVISION_RUNS_DIR"])
    return state_dir() / (".runs" if _in_repo() else "runs")


class LedgerUrl(type(Path())):  # type: ignore[misc]
    """A `postgresql://` ledger where a path is expected: str() is the URL itself (a Path would fold its `//`); it
    always "exists" (the server is asked when it is opened)."""

    def __init__(self, url: str) -> None:
        super().__init__("/postgresql-ledger")
        self._url = url

    def __str__(self) -> str:
        return self._url

    def __fspath__(self) -> str:
        return self._url

    def exists(self, *, follow_symlinks: bool = True) -> bool:
        return True

    @property
    def parent(self) -> Path:
        return Path("/")


def ledger_path(runs: Path | None = None) -> Path:
    """The ledger: `PROVISION_LEDGER` (a file, or a `postgresql://` URL: a `LedgerUrl`), else `ledger.sqlite3` in
    `runs` (default `runs_dir()`)."""
    value = os.environ.get("PROVISION_LEDGER")
    if value and value.startswith(("postgresql://", "postgres://")):
        return LedgerUrl(value)
    if value:
        return Path(value).expanduser()
    return (runs or runs_dir()) / "ledger.sqlite3"


def facts_dir() -> Path:
    """The parent of the per-inventory fact caches."""
    return state_dir() / (".cache/facts.d" if _in_repo() else "facts.d")


def ansiballz_dir() -> Path:
    """The parent of the kept AnsiballZ module payloads (provisioner/runner/forkcost.py), next to the fact caches."""
    return state_dir() / (".cache/ansiballz" if _in_repo() else "ansiballz")


def _in_repo() -> bool:
    return CHECKOUT and not os.environ.get("PROVISION_STATE_DIR")


def link_collection(parent: Path) -> Path:
    """Make `parent/collections` an Ansible collections path whose provisioner.gpu is the data root (a symlink
    `collections/ansible_collections/provisioner/gpu` -> DATA_ROOT), and return it.

    The roles call the collection's module and filters by FQCN; a wheel cannot carry the repository's own link
    (`<repo>/collections/...`, symlinks become files), so each run links the data root it uses (`provision run`
    does it in its run directory, ANSIBLE_COLLECTIONS_PATH points there)."""
    ns = parent / "collections" / "ansible_collections" / COLLECTION_NAMESPACE
    ns.mkdir(parents=True, exist_ok=True)
    link = ns / COLLECTION_NAME
    target = DATA_ROOT.resolve()
    if not (link.is_symlink() and link.resolve() == target):
        # made under a private name and renamed over: callers racing on one run dir (a sharded run's threads) each
        # put the same link in place, where a check-then-symlink raised FileExistsError for the later one
        tmp = ns / f".{COLLECTION_NAME}.{os.getpid()}.{threading.get_ident()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target, target_is_directory=True)
        try:
            os.replace(tmp, link)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
    return parent / "collections"


def data_file(path: Path) -> Path:
    """`path` (a file or directory under the data root) when it exists; else a UsageError naming it (exit 2)."""
    if not path.exists():
        raise UsageError(
            "provisioner data missing (incomplete installation: reinstall provisioner, or set PROVISION_DATA_DIR to "
            "a directory holding ansible.cfg, playbooks/, roles/, templates/, plugins/)", path=str(path))
    return path
