"""OpenSSH's host key checking, for the paramiko probes (provisioner.probes.ssh): which known-hosts files count
(`UserKnownHostsFile` replaces only the user's files; the global ones, `GlobalKnownHostsFile`, are always read), how a
presented key is judged against them (ok, changed, revoked, unknown: hostfile.c's rules) and what
`StrictHostKeyChecking` lets through (`verdict`): only `no` lets a changed key through, only `no` and `accept-new` an
unknown one, nothing a revoked one.
"""

from __future__ import annotations

import base64
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: OpenSSH's defaults (ssh_config(5)): the user's files and the system-wide ("global") files.
USER_FILES = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_FILES = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")

#: StrictHostKeyChecking values as ssh(1) reads them (readconf.c multistate_strict_hostkey) -> the mode.
MODES = {"yes": "yes", "true": "yes", "ask": "ask", "accept-new": "accept-new", "no": "no", "off": "no",
         "false": "no"}
#: The mode when the option is absent: OpenSSH's default, `ask`; a probe cannot ask, so an unknown key is refused.
DEFAULT_MODE = "ask"


def mode_of(value: str) -> str:
    """The StrictHostKeyChecking mode of an option value; a value ssh(1) would not accept counts as `yes` (ssh itself
    refuses to start), never as a relaxation."""
    return MODES.get(value.strip().lower(), "yes")


def verdict(mode: str, status: str) -> tuple[bool, bool]:
    """(connect?, warn?) for a key of `status` (ok | changed | revoked | unknown) under StrictHostKeyChecking `mode`.

    As ssh(1): a known key connects quietly; a revoked key never connects; a changed key connects only with `no`
    (OpenSSH then proceeds "subject to some restrictions": no password auth, no forwarding; the probes use neither);
    an unknown key connects with `accept-new` and `no` (and is added to the user's file); `yes` and `ask` (no one to
    ask) refuse it. Every relaxed connection warns."""
    if status == "ok":
        return True, False
    if status == "revoked":
        return False, False
    if status == "changed":
        return (True, True) if mode == "no" else (False, False)
    return (True, True) if mode in ("no", "accept-new") else (False, False)


@dataclass(frozen=True)
class Entry:
    """One known-hosts line: its host patterns, key (a paramiko PKey), marker (`` or `@revoked`) and place."""

    patterns: tuple[str, ...]
    key: Any
    marker: str
    where: str  # FILE:LINE


#: a host field item that is a plain name (no pattern, negation or hash): matched by a dict lookup
_PLAIN = re.compile(r"[^*?!|]+")


def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern))


def host_matches(name: str, patterns: Iterable[str]) -> bool:
    """OpenSSH's match_hostname for a known-hosts host field: comma-separated patterns with `*`/`?`, `!` negates
    (a negated match excludes the line), case-insensitive; a hashed entry (`|1|salt|hash`) matches by its HMAC."""
    from provisioner.probes.ssh import _import_paramiko

    name = name.lower()
    hit = False
    for raw in patterns:
        neg = raw.startswith("!")
        p = raw[1:] if neg else raw
        if p.startswith("|1|"):
            try:
                m = _import_paramiko().HostKeys.hash_host(name, p) == p
            except Exception:  # noqa: BLE001 (a malformed hash matches nothing)
                m = False
        else:
            m = _glob(p.lower()).fullmatch(name) is not None
        if m and neg:
            return False
        hit = hit or m
    return hit


def parse_file(path: str) -> list[Entry]:
    """The entries of one known-hosts file. Comments, blank lines, `@cert-authority` lines (paramiko cannot verify
    host certificates: such a host is unknown, so refused unless relaxed) and malformed lines are skipped one by one;
    a missing or unreadable file has none."""
    paramiko = _paramiko()
    try:
        with open(os.path.expanduser(path), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out: list[Entry] = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        marker = ""
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            if marker != "@revoked":
                continue
        fields = line.split()
        if len(fields) < 3:
            continue
        try:
            key = paramiko.PKey.from_type_string(fields[1], base64.b64decode(fields[2], validate=True))
        except Exception:  # noqa: BLE001 (unknown type, bad base64, bad key: this line only)
            continue
        out.append(Entry(tuple(fields[0].split(",")), key, marker, f"{path}:{n}"))
    return out


def _paramiko() -> Any:
    from provisioner.probes.ssh import _import_paramiko

    return _import_paramiko()


@dataclass(frozen=True)
class Lookup:
    status: str  # ok | changed | revoked | unknown
    where: str | None = None  # the line that decided it (changed, revoked)


class KnownHosts:
    """Known-hosts files parsed ONCE per fan-out and shared read-only by every connection (O(lines) per file, not per
    host); a key added under accept-new/no is appended to the user's file and to the parsed copy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, list[Entry]] = {}
        # per file list: plain names -> their lines, and the lines with patterns or hashes (matched one by one), so
        # a fleet's lookups stay O(pattern lines) each, not O(all lines)
        self._index: dict[tuple[str, ...], tuple[dict[str, list[tuple[int, Entry]]], list[tuple[int, Entry]]]] = {}

    def entries(self, files: Iterable[str]) -> list[Entry]:
        out: list[Entry] = []
        with self._lock:
            for f in files:
                p = os.path.expanduser(f)
                if p not in self._files:
                    self._files[p] = parse_file(p)
                out.extend(self._files[p])
        return out

    def matching(self, name: str, files: Iterable[str]) -> list[Entry]:
        """The lines of `files` whose host field matches `name`, in file order."""
        files = tuple(files)
        with self._lock:
            idx = self._index.get(files)
        if idx is None:
            exact: dict[str, list[tuple[int, Entry]]] = {}
            other: list[tuple[int, Entry]] = []
            for i, e in enumerate(self.entries(files)):
                if all(_PLAIN.fullmatch(p) for p in e.patterns):
                    for p in dict.fromkeys(p.lower() for p in e.patterns):
                        exact.setdefault(p, []).append((i, e))
                else:
                    other.append((i, e))
            idx = (exact, other)
            with self._lock:
                self._index[files] = idx
        exact, other = idx
        found = exact.get(name.lower(), []) + [(i, e) for i, e in other if host_matches(name, e.patterns)]
        return [e for _, e in sorted(found, key=lambda x: x[0])]

    def lookup(self, name: str, key: Any, files: Iterable[str]) -> Lookup:
        """hostfile.c's check_hostkeys_by_key_or_type: revoked wins; an equal key is ok; another key for the host
        (any type) is changed; no line for the host is unknown."""
        mine = self.matching(name, files)
        for e in mine:
            if e.marker == "@revoked" and e.key == key:
                return Lookup("revoked", e.where)
        plain = [e for e in mine if not e.marker]
        if any(e.key == key for e in plain):
            return Lookup("ok")
        if plain:
            return Lookup("changed", plain[0].where)
        return Lookup("unknown")

    def known_types(self, name: str, files: Iterable[str]) -> list[str]:
        """Key types known for `name` (to offer first, as ssh(1) orders its host key algorithms)."""
        out: list[str] = []
        for e in self.matching(name, files):
            if not e.marker and e.key.get_name() not in out:
                out.append(e.key.get_name())
        return out

    def add(self, path: str, name: str, key: Any) -> str | None:
        """Append `name key` to the user's file `path` as ssh(1) does for a new host (~/.ssh created 0700 when the
        file is under it); None, or why it could not be written."""
        p = os.path.expanduser(path)
        line = f"{name.lower()} {key.get_name()} {key.get_base64()}\n"
        with self._lock:
            try:
                ssh_dir = os.path.expanduser("~/.ssh")
                if os.path.dirname(p) == ssh_dir and not os.path.isdir(ssh_dir):
                    os.mkdir(ssh_dir, 0o700)
                fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with os.fdopen(fd, "a", encoding="utf-8") as f:
                    f.write(line)
            except OSError as exc:
                return f"{path}: {exc.strerror or exc}"
            self._files.setdefault(p, []).append(Entry((name.lower(),), key, "", f"{path}:+"))
            self._index.clear()
        return None
