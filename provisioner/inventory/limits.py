"""Resource limits on what an inventory (and an `-e @FILE`) can make the suite read, checked before ansible-core reads
anything: only regular files (a FIFO or a device in group_vars/ would block every command), and YAML aliases that
repeat at most MAX_ALIAS_VALUES values per file (an alias bomb grows 10x per level: the input digest, the rules and
the plan would walk a billion values). Each refusal is a UsageError naming the file (exit 2).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from provisioner.errors import UsageError

#: values YAML aliases may add to one file once expanded (`&a [...]` then `*a` N times adds N x len(a)); a real
#: inventory uses a handful of anchors for shared settings, far below this
MAX_ALIAS_VALUES = 100_000
#: a vars file larger than this is not an inventory (ansible-core would read it whole)
MAX_VARS_FILE_BYTES = 64 * 1024 * 1024
_VARS_DIRS = ("group_vars", "host_vars")
_YAML_SUFFIXES = ("", ".yml", ".yaml", ".json")  # what ansible-core's host_group_vars plugin reads


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _walk(top: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry under `top` (symlinks followed, as ansible-core does; dangling ones skipped), without descending
    into a directory twice."""
    seen: set[tuple[int, int]] = set()
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue  # unreadable: ansible-core names it
        for e in entries:
            if e.name.startswith("."):
                continue  # ansible-core skips hidden files and directories
            try:
                st = os.stat(e.path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                stack.append(Path(e.path))
            yield Path(e.path), st


def check_inventory(p: Path) -> None:
    """Refuse (UsageError, exit 2) an inventory source that is not a regular file or a directory (`/dev/null`, a
    FIFO), a non-regular file among the files ansible-core reads for it (the inventory directory, group_vars/ and
    host_vars/ beside it), and a YAML file there whose aliases expand past MAX_ALIAS_VALUES."""
    st = os.stat(p)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise UsageError(f"the inventory is {_kind(st.st_mode)}, not a file or directory of inventory sources",
                         path=str(p))
    base = p if p.is_dir() else p.parent
    tops = [p] if p.is_dir() else [p, *(base / d for d in _VARS_DIRS if (base / d).is_dir())]
    for top in tops:
        for f, fst in ([(p, st)] if top == p and not p.is_dir() else _walk(top)):
            if stat.S_ISDIR(fst.st_mode):
                continue
            if not stat.S_ISREG(fst.st_mode):
                raise UsageError(f"{_kind(fst.st_mode)} where ansible-core reads inventory files: every command "
                                 "would block on it; remove it", path=str(f))
            if f.suffix in _YAML_SUFFIXES or f == p:
                check_yaml_file(f, fst)


def check_yaml_file(f: Path, st: os.stat_result | None = None) -> None:
    """Refuse a YAML/JSON vars file that is not a regular file, is larger than MAX_VARS_FILE_BYTES, or whose aliases
    expand past MAX_ALIAS_VALUES (or refer to themselves). Vaulted files and files without aliases cost one read."""
    st = st or os.stat(f)
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{_kind(st.st_mode)}, not a file of variables", path=str(f))
    if st.st_size > MAX_VARS_FILE_BYTES:
        raise UsageError(f"{st.st_size} bytes: larger than {MAX_VARS_FILE_BYTES} bytes, not a file of variables",
                         path=str(f))
    try:
        data = f.read_bytes()
    except OSError:
        return  # the reader names it
    if b"*" not in data or b"&" not in data or data.lstrip().startswith(b"$ANSIBLE_VAULT"):
        return
    problem = alias_problem(data)
    if problem:
        raise UsageError(problem, path=str(f))


def alias_problem(data: bytes | str) -> str | None:
    """Why the YAML document(s) in `data` are an alias bomb (None: they are not). Counts the values each document
    holds once its aliases are expanded, on the composed node graph (each node counted once: linear time)."""
    import yaml

    loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        docs = list(yaml.compose_all(data, Loader=loader))
    except yaml.YAMLError:
        return None  # not YAML (an INI file) or broken: the inventory reader reports it with its line
    for doc in docs:
        if doc is None:
            continue
        sizes: dict[int, int] = {}
        unique: set[int] = set()
        try:
            expanded = _expanded(doc, sizes, unique, set())
        except _Recursive:
            return "a YAML alias refers to the value that holds it (a recursive structure): write the values out"
        except RecursionError:
            return "YAML values nested too deeply to read"
        added = expanded - len(unique)
        if added > MAX_ALIAS_VALUES:
            by = f"more than {_STOP:,}" if expanded > _STOP else f"{added:,}"
            return (f"YAML aliases expand this file by {by} values (the limit is {MAX_ALIAS_VALUES:,}: an alias "
                    "bomb, aliases of aliases); write the values out or anchor less")
    return None


class _Recursive(Exception):
    pass


_STOP = 100 * MAX_ALIAS_VALUES  # counting stops here: far past the limit already


def _expanded(node: Any, sizes: dict[int, int], unique: set[int], active: set[int]) -> int:
    """Values under `node` with every alias expanded; `unique` collects the distinct nodes (the written size)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in active:
        raise _Recursive
    unique.add(key)
    if isinstance(node.value, list):
        active.add(key)
        total = 1
        for item in node.value:
            if isinstance(item, tuple):  # a mapping's (key node, value node)
                total += _expanded(item[0], sizes, unique, active) + _expanded(item[1], sizes, unique, active)
            else:
                total += _expanded(item, sizes, unique, active)
            if total > _STOP:
                break
        active.discard(key)
    else:
        total = 1
    sizes[key] = total
    return total
