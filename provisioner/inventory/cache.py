"""A parsed inventory kept between commands, so a 10,000-host fleet is not parsed by Ansible on every `status`.

`load_fleet` asks `lookup(source, extra_vars)` first and `store(...)` after a fresh parse. The key is a sha256 over
everything the parse read: the inventory file's bytes, every file under the group_vars/ and host_vars/ beside it,
the ansible.cfg in force, the ANSIBLE_* environment, the -e vars, ansible-core's version and the provisioner code that
builds the model. Any change is a miss and a fresh parse: the cache never answers with a stale fleet. Only a plain
file is cached: a directory, an executable (dynamic) inventory or an inventory plugin config (`plugin:`) are parsed
every time, and so are fleets under `MIN_HOSTS` (their parse is cheap).

The entry is a pickle (the model holds ansible-core's tagged values, whose origins the error messages name), written
0600 in a 0700 directory owned by the user, and read only when it still is: as trusted as the code itself. Vaulted
values are written as their ciphertext only, never a decrypted plaintext. One entry per inventory path (a changed
inventory replaces it). `PROVISION_INVENTORY_CACHE=0` turns it off.
"""

from __future__ import annotations

import copyreg
import gc
import hashlib
import io
import json
import os
import pickle
import re
import stat
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

FORMAT = b"provisioner-inventory-cache-1"
MIN_HOSTS = 500
_PLUGIN_CONFIG = re.compile(rb"(?m)^plugin\s*:")


def enabled() -> bool:
    return os.environ.get("PROVISION_INVENTORY_CACHE", "1").strip().lower() not in ("0", "off", "no", "false")


def cache_dir() -> Path:
    from provisioner import paths

    return paths.state_dir() / (".cache/inventory" if paths.CHECKOUT and not os.environ.get("PROVISION_STATE_DIR")
                                else "inventory-cache")


@contextmanager
def no_gc() -> Iterator[None]:
    """Cyclic GC paused while a fleet is built: the parse allocates millions of objects that all stay alive, and
    every collection re-walks the growing heap (a third of a 10,000-host load; 5x of unpickling it)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def keep(fleet_hosts: int) -> None:
    """A big fleet is read once and kept for the life of the process (every command, the receiver): move what is
    alive now out of the collector's reach (`gc.freeze`), or the next collections walk its million objects again
    (0.4 s of a 10,000-host `status`). Small fleets (tests load hundreds) are left to the collector."""
    if fleet_hosts >= MIN_HOSTS:
        gc.freeze()


def _files(root: str) -> Iterator[str] | None:
    """Every file under group_vars/ and host_vars/ in `root`, sorted; None when one is not a regular file (the full
    load's `check_inventory` names it)."""
    out: list[str] = []
    stack = [os.path.join(root, d) for d in ("host_vars", "group_vars")]
    while stack:
        top = stack.pop()
        try:
            st = os.stat(top)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            with os.scandir(top) as it:
                stack.extend(sorted((e.path for e in it), reverse=True))
        elif stat.S_ISREG(st.st_mode):
            out.append(top)
        else:
            return None
    return iter(out)


def key(source: Path, extra_vars: Mapping[str, Any] | None) -> str | None:
    """The entry's key, or None when this source is never cached (see the module docstring)."""
    if not enabled():
        return None
    try:
        st = source.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o111:
            return None
        data = source.read_bytes()
        if _PLUGIN_CONFIG.search(data):
            return None
        h = hashlib.sha256(FORMAT)

        def part(label: str, blob: bytes) -> None:
            h.update(b"\0%s\0%d\0" % (label.encode(), len(blob)))
            h.update(blob)

        part("source", os.fsencode(source))
        part("inventory", data)
        files = _files(str(source.parent))
        if files is None:
            return None
        for f in files:
            with open(f, "rb") as fh:
                part("vars " + f, fh.read())
        from ansible import constants as C
        from ansible.release import __version__ as ansible_version

        cfg = getattr(C, "CONFIG_FILE", None)
        part("ansible.cfg " + str(cfg), Path(cfg).read_bytes() if cfg and os.path.isfile(cfg) else b"")
        part("ansible", ansible_version.encode())
        part("python", sys.version.encode())
        env = sorted((k, v) for k, v in os.environ.items() if k.startswith("ANSIBLE_"))
        part("env", json.dumps(env).encode())
        part("extra", json.dumps(dict(extra_vars or {}), sort_keys=True, default=repr).encode())
        code = Path(__file__).parents[1]
        for name in ("inventory/__init__.py", "inventory/cache.py", "inventory/origin.py", "model.py", "plan.py",
                     "defaults.py"):
            part("code " + name, (code / name).read_bytes())
        return h.hexdigest()
    except (OSError, UnicodeError, ValueError):
        return None


def _entry(source: Path) -> Path:
    return cache_dir() / (hashlib.sha256(os.fsencode(source)).hexdigest()[:32] + ".pickle")


def _freeze(d: dict[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(d)


def _vaulted(ciphertext: str) -> Any:
    from ansible.parsing.vault import EncryptedString

    from provisioner.inventory.origin import tag_like

    return tag_like(ciphertext, EncryptedString(ciphertext=str.__str__(ciphertext)))  # plain str in, tags copied


def _origin(path: str | None, description: str | None, line_num: int | None, col_num: int | None) -> Any:
    from provisioner.inventory.origin import make_origin

    return make_origin(path, description, line_num, col_num)


def _dispatch() -> dict[Any, Any]:
    from provisioner.inventory.origin import origin_type

    table = copyreg.dispatch_table.copy()
    table[MappingProxyType] = lambda mp: (_freeze, (dict(mp),))
    origin = origin_type()
    if origin is not None:  # one origin tag per value of every vars file: rebuilt by its constructor, 4x faster
        table[origin] = lambda o: (_origin, (o.path, o.description, o.line_num, o.col_num))
    return table


class _Pickler(pickle.Pickler):
    dispatch_table = _dispatch()

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) in (MappingProxyType, type, int, float, str, bytes, dict, list, tuple):
            return NotImplemented
        from ansible.parsing.vault import VaultHelper

        ciphertext = VaultHelper.get_ciphertext(obj, with_tags=True)
        if ciphertext is not None:  # an encrypted or a decrypted vaulted value: its ciphertext only
            return (_vaulted, (ciphertext,))
        return NotImplemented


def lookup(source: Path, digest: str | None) -> tuple[dict, dict, dict, dict] | None:
    """(hosts, clusters, group_vars, groups) of a fresh entry for `digest`, or None."""
    if digest is None:
        return None
    path = _entry(source)
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            dst = os.stat(path.parent)
            if st.st_uid != os.geteuid() or st.st_mode & 0o077 or dst.st_uid != os.geteuid() or dst.st_mode & 0o077:
                return None  # not ours alone: never unpickle it
            head = fh.readline()
            if head.rstrip(b"\n") != digest.encode():
                return None
            with no_gc():
                parts = pickle.load(fh)
        return parts if isinstance(parts, tuple) and len(parts) == 4 else None
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError):
        return None


def store(source: Path, digest: str | None, hosts: Mapping[str, Any], clusters: Mapping[str, Any],
          group_vars: Mapping[str, Any], groups: Mapping[str, Any]) -> None:
    """Write the entry (best effort: a cache that cannot be written is only slower)."""
    if digest is None or len(hosts) < MIN_HOSTS:
        return
    path = _entry(source)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path.parent, 0o700)
        buf = io.BytesIO()
        buf.write(digest.encode() + b"\n")
        _Pickler(buf, protocol=5).dump((dict(hosts), dict(clusters), dict(group_vars), dict(groups)))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(buf.getvalue())
        os.replace(tmp, path)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        try:
            tmp.unlink()
        except OSError:
            pass
