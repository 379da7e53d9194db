"""Cheaper forked workers in ansible-playbook's main process (called by runner/callback/awx_display.py).

Ansible forks one worker per host and task. `freeze()` at each play start moves the parsed playbook, inventory and
variables into the garbage collector's permanent generation, so the workers neither scan nor copy-on-write them.
`restore()`/`save()` keep the AnsiballZ module payloads between runs (Ansible builds each module's zip once per run in
a temporary directory), keyed by everything that shapes a payload. `PROVISION_FORKCOST=0` turns both off.
"""

from __future__ import annotations

import gc
import hashlib
import os
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

#: Environment variable naming the directory that keeps the payloads (RunConfig.ansible_env sets it; unset: none kept).
ENV = "PROVISION_ANSIBALLZ_CACHE"
#: Payloads kept: ansible-core's own modules and this collection's, without extensions (coverage, debugger). Another
#: collection's module can change without anything in the key changing, so its payload is rebuilt each run.
KEPT = re.compile(r"^(ansible\.modules|ansible_collections\.provisioner\.gpu\.plugins\.modules)\.[A-Za-z0-9_]+"
                  r"-ZIP_[A-Z]+-none$")
#: Key directories not used for this long are removed when a run saves into another one.
STALE_S = 30 * 86400


def freeze() -> None:
    """Move every object alive now into the permanent generation (what the forked workers then share untouched)."""
    gc.freeze()


def key(*, ansible_version: str, ansible_dir: str, python: str, module_path: Iterable[str], plugins_digest: str) -> str:
    """The cache directory's name: a payload is the module's code plus the module_utils it imports, so it depends on
    ansible-core (version and location), the Python, the library path that may shadow a builtin module, and this
    collection's plugins."""
    h = hashlib.sha256()
    for part in (ansible_version, ansible_dir, python, os.pathsep.join(module_path), plugins_digest):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:24]


def tree_digest(root: Path) -> str:
    """sha256 over the files under `root` (relative paths and bytes; caches of compiled Python left out)."""
    h = hashlib.sha256()
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        for f in files:
            h.update(f"{f.relative_to(root)}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def restore(store: Path, local: Path) -> int:
    """Copy the kept payloads from `store` into this run's AnsiballZ cache `local`; how many."""
    if not store.is_dir():
        return 0
    local.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in store.iterdir():
        if KEPT.match(f.name) and not (local / f.name).exists():
            shutil.copyfile(f, local / f.name)
            n += 1
    os.utime(store)
    return n


def save(local: Path, store: Path) -> int:
    """Copy the payloads this run built (kept names only, not in `store` yet) into `store`, each by an atomic rename;
    remove sibling key directories unused for STALE_S. How many were saved."""
    if not local.is_dir():
        return 0
    new = [f for f in local.iterdir() if KEPT.match(f.name) and not (store / f.name).exists()]
    if not new:
        return 0
    store.mkdir(parents=True, exist_ok=True, mode=0o700)
    for f in new:
        tmp = store / f".{f.name}.{os.getpid()}"
        shutil.copyfile(f, tmp)
        os.replace(tmp, store / f.name)
    cutoff = time.time() - STALE_S
    for d in store.parent.iterdir():
        if d != store and d.is_dir() and d.stat().st_mtime < cutoff:
            shutil.rmtree(d, ignore_errors=True)
    return len(new)


def store_dir() -> Path | None:
    """This run's store (`$PROVISION_ANSIBALLZ_CACHE/<key>`), or None when the variable is unset. Imports Ansible:
    call it in ansible-playbook's process."""
    base = os.environ.get(ENV)
    if not base:
        return None
    import sys

    import ansible
    from ansible import constants as C
    from ansible.release import __version__

    from provisioner import paths

    return Path(base) / key(ansible_version=__version__, ansible_dir=str(Path(ansible.__file__).parent),
                            python=sys.version, module_path=list(C.DEFAULT_MODULE_PATH or []),
                            plugins_digest=tree_digest(paths.DATA_ROOT / "plugins"))


def local_dir() -> Path:
    """This run's AnsiballZ cache (Ansible's own name for it, in its per-run temporary directory)."""
    from ansible import constants as C

    return Path(C.DEFAULT_LOCAL_TMP) / "ansiballz_cache"
