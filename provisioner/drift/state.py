"""A host's recorded state for the two-tier drift: what the probe reads (files under the managed roots, packages,
units, the nftables ruleset, node facts), the input digest that says whether the record still applies, and the
comparison of a record with a fresh probe. Pure: no SSH, no files of the controller (provisioner/probes/state.py
runs the probe; provisioner/ledger keeps the records).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Format of a recorded state; a record of another version is treated as missing.
STATE_VERSION = 1

#: The managed roots: every file, directory and link under them is part of the recorded state. They cover every path
#: a role of this suite writes (tests/unit/test_hoststate.py checks the roles' path defaults against them). A change
#: here by anyone sends the host to tier 2, which decides whether it is drift.
ROOTS: tuple[str, ...] = (
    "/etc/apt", "/etc/nccl.conf", "/etc/systemd/system", "/etc/nftables.d", "/etc/nftables.conf",
    "/etc/security/limits.d", "/etc/modprobe.d", "/etc/modules-load.d", "/etc/sysctl.d", "/etc/ld.so.conf.d",
    "/etc/vllm", "/etc/provisioner", "/etc/nvidia-imex", "/etc/nginx", "/etc/prometheus", "/etc/default",
    "/etc/environment", "/etc/profile.d", "/etc/passwd", "/etc/group", "/etc/ssl/certs/ca-certificates.crt",
    "/usr/local/libexec/provisioner", "/usr/local/lib/provisioner", "/usr/local/sbin",
    "/usr/local/share/ca-certificates", "/opt/amazon", "/opt/provisioner",
    "/var/lib/vllm-lb",
)
#: Python virtual environments whose installed distributions (the `*.dist-info` names: name and version) are part of
#: the state, not their files (too many to hash nightly).
VENVS: tuple[str, ...] = ("/opt/vllm/venv",)
#: Files a node reports about its hardware and loaded driver (the simulated node's first, as the probes read them).
FACTS: tuple[str, ...] = ("/var/lib/hwsim/sys/module/nvidia/version", "/sys/module/nvidia/version")

#: The probe: one `python3 -I -S -c` on the host, reading ROOTS/VENVS/FACTS (argv), printing one JSON object.
#: Read-only. Cheap to start (it runs on every node every night): no site, no environment (`-I -S`: a PYTHONPATH on
#: the node cannot load modules into it), no subprocess/json/hashlib imports (posix_spawn, the C JSON string encoder
#: and the built-in sha256: 57 -> ~35 ms of node CPU per probe).
PROBE = r'''
import os, select, stat, sys, time
try:
    from _sha2 import sha256
except ImportError:
    try:
        from _sha256 import sha256
    except ImportError:
        from hashlib import sha256
try:
    from _json import encode_basestring_ascii as q
except ImportError:
    from json.encoder import encode_basestring_ascii as q
a = sys.argv[1:]
i = a.index("")
j = a.index("", i + 1)
roots, venvs, facts = a[:i], a[i + 1:j], a[j + 1:]
out = {}
def ent(p):
    try:
        st = os.lstat(p)
    except OSError:
        return
    own = "%o %d %d" % (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    if stat.S_ISLNK(st.st_mode):
        out["file:" + p] = "link " + os.readlink(p)
    elif stat.S_ISDIR(st.st_mode):
        out["file:" + p] = "dir " + own
        try:
            names = sorted(os.listdir(p))
        except OSError:
            return
        for n in names:
            ent(os.path.join(p, n))
    elif stat.S_ISREG(st.st_mode):
        h = sha256()
        try:
            with open(p, "rb") as f:
                for b in iter(lambda: f.read(1 << 20), b""):
                    h.update(b)
            out["file:" + p] = h.hexdigest() + " " + own
        except OSError as e:
            out["file:" + p] = "unreadable " + own
    else:
        out["file:" + p] = "special " + own
for r in roots:
    ent(r)
def run(cmd):
    """(exit status, stdout) of cmd, stdin and stderr /dev/null, 60 s at most; None when it cannot run."""
    env = {"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    exe = [os.path.join(d, cmd[0]) for d in env["PATH"].split(":") if os.access(os.path.join(d, cmd[0]), os.X_OK)]
    if not exe:
        return None
    try:
        r, w = os.pipe()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            pid = os.posix_spawn(exe[0], cmd, env, file_actions=[
                (os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, null, 2)])
        finally:
            os.close(w)
            os.close(null)
        buf, end = [], time.monotonic() + 60
        while True:
            left = end - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                os.close(r)
                return None
            b = os.read(r, 1 << 16)
            if not b:
                break
            buf.append(b)
        os.close(r)
        st = os.waitpid(pid, 0)[1]
        code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else -1
        return code, b"".join(buf).decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    except OSError:
        return None
p = run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\t${Status}\n"])
if p is None or p[0] != 0:
    out["error:dpkg"] = "dpkg-query failed"
else:
    for line in p[1].splitlines():
        f = line.split("\t")
        if len(f) == 4 and f[2].strip() not in ("un", "pn"):
            out["package:" + f[0]] = f[1] + " " + f[3]
units = set()
for base, dirs, files in os.walk("/etc/systemd/system"):
    for n in dirs + files:
        if n.endswith((".service", ".timer", ".socket")) and not n.startswith("-") and "@." not in n:
            units.add(n)
units = sorted(units)
if units:
    p = run(["systemctl", "show", "--property=Id,UnitFileState,ActiveState,SubState", "--"] + units)
    if p is not None and p[0] == 0:
        cur = {}
        for line in p[1].splitlines() + [""]:
            if not line.strip():
                if cur.get("Id"):
                    out["service:" + cur["Id"]] = "%s %s/%s" % (
                        cur.get("UnitFileState", ""), cur.get("ActiveState", ""), cur.get("SubState", ""))
                cur = {}
            elif "=" in line:
                k, v = line.split("=", 1)
                cur[k] = v
    else:
        out["error:systemctl"] = "systemctl show failed"
p = run(["nft", "-s", "list", "ruleset"])
if p is not None and p[0] == 0:
    out["other:nftables ruleset"] = sha256(p[1].encode()).hexdigest()
for v in venvs:
    sp = []
    for base, dirs, files in os.walk(v):
        sp += [d for d in dirs if d.endswith(".dist-info")]
        if base.count(os.sep) - v.count(os.sep) >= 4:
            dirs[:] = []
    if os.path.lexists(v):
        out["other:venv " + v] = sha256("\n".join(sorted(sp)).encode()).hexdigest() + " %d" % len(sp)
for f in facts:
    try:
        with open(f) as fh:
            out["other:fact " + f] = fh.read().strip()[:200]
    except OSError:
        pass
try:
    with open("/proc/sys/kernel/random/boot_id") as fh:
        boot = fh.read().strip()
except OSError:
    boot = ""
# json.dumps(..., sort_keys=True) byte for byte, without importing json (and re, enum...): every value is a str
sys.stdout.write('{"boot_id": ' + q(boot) + ', "state": {' + ", ".join(q(k) + ": " + q(out[k]) for k in sorted(out))
                 + '}, "version": @VERSION@}\n')
'''.replace("@VERSION@", str(STATE_VERSION))


def probe_command(roots: Iterable[str] = ROOTS, venvs: Iterable[str] = VENVS, facts: Iterable[str] = FACTS) -> str:
    """The shell command that runs the probe on a host (python3, the script inline; no file is written there)."""
    import shlex

    args = [*roots, "", *venvs, "", *facts]  # "" separates the three lists (no path is empty)
    return "python3 -I -S -c " + " ".join(shlex.quote(x) for x in (PROBE, *args))


class StateError(ValueError):
    """A probe's output or a record that cannot be read."""


def parse_probe(stdout: str) -> dict[str, str]:
    """The state map (`kind:resource` -> value) from the probe's stdout; StateError when it is not the probe's."""
    try:
        doc = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION or not isinstance(doc.get("state"), dict):
        raise StateError("the probe printed no state (is python3 on the host?)")
    state = {str(k): str(v) for k, v in doc["state"].items()}
    errors = [f"{k[6:]}: {v}" for k, v in state.items() if k.startswith("error:")]
    if errors:
        raise StateError("; ".join(errors))
    return state


_CONTENT = re.compile(r"([0-9a-f]{64})( .*)?", re.S)


def seal(state: Mapping[str, str], key: bytes) -> dict[str, str]:
    """A state map as the ledger records it: each file's content digest (the probe's sha256) replaced by its HMAC-SHA256
    under the ledger's key, so that no plain digest of a file that holds a secret (the vLLM env file and its API key)
    is kept, and a guess at the secret cannot be checked against a record without the key. Owner, mode, links,
    packages and facts are kept as they are. Applying it twice with one key gives the same map (compare needs that)."""
    out = {}
    digest = hmac.digest  # one-shot HMAC in C: a fleet's drift seals ~100 files per host
    for k, v in state.items():
        m = _CONTENT.fullmatch(v) if k.startswith("file:") else None
        out[k] = ("hmac-sha256:" + digest(key, m.group(1).encode(), "sha256").hex() + (m.group(2) or "")
                  if m else v)
    return out


def state_digest(state: Mapping[str, str]) -> str:
    """sha256 of a state map (stored beside it: a record that no longer matches it is corrupted)."""
    return hashlib.sha256(json.dumps(dict(state), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Change:
    """One difference between the recorded state and the probe: kind (file, package, service, other), resource,
    the recorded value and the one found (None: absent)."""

    kind: str
    resource: str
    recorded: str | None
    found: str | None

    @property
    def text(self) -> str:
        if self.found is None:
            return f"{self.kind} {self.resource}: gone"
        if self.recorded is None:
            return f"{self.kind} {self.resource}: new ({self.found})"
        return f"{self.kind} {self.resource}: {self.recorded} -> {self.found}"


def compare(recorded: Mapping[str, str], found: Mapping[str, str]) -> list[Change]:
    """Every key whose value differs, appeared or disappeared, sorted."""
    if recorded == found:  # the nightly case, compared in C
        return []
    out = []
    for key in sorted(set(recorded) | set(found)):
        a, b = recorded.get(key), found.get(key)
        if a != b:
            kind, _, resource = key.partition(":")
            out.append(Change(kind, resource, a, b))
    return out


# -- inputs ---------------------------------------------------------------------------------------------------------
#: Content that decides what a run does besides the inventory: a change to any of it is a change of every host's inputs.
CONTENT_DIRS = ("playbooks", "roles", "templates", "plugins")


def content_hash(root: Path, code: Path | None = None) -> str:
    """sha256 over the playbooks, roles, templates and plugins under `root` (paths and bytes) and the provisioner
    package's own Python files under `code` (the plan and the argument builders are code)."""
    h = hashlib.sha256()
    trees = [(root / d, d) for d in CONTENT_DIRS]
    if code is not None:
        trees.append((code, "provisioner"))
    for base, label in trees:
        if not base.is_dir():
            continue
        files = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".pytest_cache"))
            files += [Path(dirpath) / f for f in filenames if not f.endswith((".pyc", ".pyo"))]
        for f in sorted(files):
            try:
                data = f.read_bytes()
            except OSError:
                continue
            h.update(f"{label}/{f.relative_to(base)}\0{len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()


def _plain(value: Any) -> Any:
    """JSON-ready copy of resolved variables (Ansible's tagged strings and custom mappings become plain types)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        seq = [_plain(v) for v in value]
        return sorted(seq, key=repr) if isinstance(value, (set, frozenset)) else seq
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


def inputs_digest(*, host_vars: Mapping[str, Any], host_plan: Any, fleet_plan: Any, run_options: Mapping[str, Any],
                  content: str, version: str, key: bytes) -> str:
    """One host's input digest: its resolved variables (vaulted ones decrypted: a new secret is a new input), its
    plan (and the fleet-wide parts: clusters, targets), what the run was asked (playbook, tags, skip-tags, extra
    vars), the suite's content hash and version. An HMAC-SHA256 keyed with `key` (random, kept 0600 beside the
    ledger: Ledger.digest_key, the one key of its records): without it the digest gives no way to test guesses of a
    secret."""
    doc = {"vars": _plain(host_vars), "plan": _plain(host_plan), "fleet": _plain(fleet_plan),
           "run": _plain(run_options), "content": content, "version": version}
    return keyed_digest(key, doc)


#: Smallest digest key accepted (bytes): 256 bits.
KEY_BYTES = 32
#: How a keyed digest starts (the ledger's one key). Records written before it (a digest HMAC'd with `digest.key`
#: beside the ledger, then again with the ledger's key) start "hmac-sha256:" and match nothing: `tier2_reason` says so.
KEYED = "ledger-hmac:"
LEGACY = "hmac-sha256:"


def keyed_digest(key: bytes, doc: Any) -> str:
    """KEYED + HMAC-SHA256 of a JSON document (sorted keys) under `key`; ValueError for a key shorter than
    KEY_BYTES."""
    import hmac

    if len(key) < KEY_BYTES:
        raise ValueError(f"digest key too short ({len(key)} bytes, at least {KEY_BYTES})")
    return KEYED + hmac.digest(key, json.dumps(_plain(doc), sort_keys=True, default=str).encode(), "sha256").hex()


def plain_digest(doc: Any) -> str:
    """sha256 of a JSON document (sorted keys): what stands for a part shared by every host's inputs (the fleet-wide
    plan), digested once per fleet rather than once per host."""
    return "sha256:" + hashlib.sha256(json.dumps(_plain(doc), sort_keys=True, default=str).encode()).hexdigest()


# -- the tier decision ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    """A host's recorded state as the ledger returns it."""

    host: str
    run: int | None
    recorded: float
    inputs: str
    state: Mapping[str, str]
    digest: str
    roles: tuple[str, ...] = ()


def tier2_reason(record: Record | None, inputs: str) -> str | None:
    """Why a host cannot be checked by the probe alone (None: it can): no record, a corrupted one, or changed
    inputs. The probe's own verdict (reachable, drifted) comes after."""
    if record is None:
        return "no recorded state (no complete run since the ledger began, or its last run failed)"
    if state_digest(record.state) != record.digest:
        return "recorded state corrupted (its digest does not match)"
    if record.inputs.startswith(LEGACY):
        return ("recorded by an older provisioner (its input digest used a second key, digest.key): checked with "
                "Ansible once, then recorded under the ledger's key")
    if record.inputs != inputs:
        return "inputs changed since the last complete run (inventory, -e, tags, or the suite's content)"
    return None
