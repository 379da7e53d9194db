"""The bundle's manifest (manifest.json), its difference from an earlier build, and completeness (pure).

Every artifact: path (under the bundle), kind (deb, wheel, file, collection), name, version, sha256, size, origin
(the URL it came from, or `built`), the roles and releases that need it. Sorted, no times: the same inputs give the
same bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from provisioner.bundle.needs import Need

FORMAT = 1
MANIFEST = "manifest.json"


@dataclass(frozen=True, order=True)
class Artifact:
    path: str
    kind: str
    name: str
    version: str
    sha256: str
    size: int
    origin: str
    roles: tuple[str, ...] = field(default=())
    releases: tuple[str, ...] = field(default=())


def normalize(name: str) -> str:
    """A Python project name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dump(artifacts: Iterable[Artifact], needs: Mapping[Need, Iterable[str]], fingerprint: str,
         releases: Iterable[str]) -> str:
    doc = {
        "format": FORMAT,
        "key_fingerprint": fingerprint,
        "releases": sorted(releases),
        "needs": [{**asdict(n), "hosts": sorted(hs)} for n, hs in sorted(needs.items())],
        "artifacts": [asdict(a) for a in sorted(artifacts)],
    }
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def load(text: str) -> tuple[dict[str, Any], list[Artifact]]:
    """(the document, its artifacts); ValueError when it is not a manifest of this format."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("artifacts"), list):
        raise ValueError(f"not a bundle manifest of format {FORMAT}")
    arts = []
    for a in doc["artifacts"]:
        a = dict(a)
        a["roles"], a["releases"] = tuple(a.get("roles", ())), tuple(a.get("releases", ()))
        arts.append(Artifact(**a))
    return doc, arts


def diff(old: Iterable[Artifact], new: Iterable[Artifact]) -> list[str]:
    """Lines `+ path`, `- path`, `~ path (old sha -> new sha)` by (kind, name, release set)."""
    before = {a.path: a for a in old}
    after = {a.path: a for a in new}
    lines = []
    for p in sorted(set(before) | set(after)):
        if p not in before:
            lines.append(f"+ {p} ({after[p].kind} {after[p].name} {after[p].version})")
        elif p not in after:
            lines.append(f"- {p} ({before[p].kind} {before[p].name} {before[p].version})")
        elif before[p].sha256 != after[p].sha256:
            lines.append(f"~ {p} (sha256 {before[p].sha256[:12]} -> {after[p].sha256[:12]})")
    return lines


def _hosts(hs: Iterable[str]) -> str:
    hs = sorted(hs)
    return ", ".join(hs[:3]) + (f" and {len(hs) - 3} more" if len(hs) > 3 else "")


def pip_pin_matches(pin: str, version: str) -> bool:
    """Whether a wheel's `version` satisfies `==pin` as pip decides it for these cases: the same version, or the
    same public version with a local label when the pin has none (`==0.32.0` takes `0.32.0+cpu`, PEP 440)."""
    return version == pin or ("+" not in pin and version.split("+", 1)[0] == pin)


def missing(artifacts: Iterable[Artifact], needs: Mapping[Need, Iterable[str]]) -> list[str]:
    """One line per need the bundle cannot satisfy, naming the package, version, role, release and hosts."""
    arts = list(artifacts)
    out = []
    for n, hs in sorted(needs.items()):
        if n.kind == "apt":
            have = [a for a in arts if a.kind == "deb" and a.name == n.name and n.release in a.releases]
            ok = any(not n.version or a.version == n.version for a in have)
            what = f"apt package {n.name}" + (f"={n.version}" if n.version else "")
        elif n.kind == "pip":
            have = [a for a in arts if a.kind == "wheel" and normalize(a.name) == normalize(n.name)]
            ok = any(not n.version or pip_pin_matches(n.version, a.version) for a in have)
            what = f"Python package {n.name}" + (f"=={n.version}" if n.version else "")
        else:
            have = [a for a in arts if a.kind == "file" and a.name == n.name]
            ok = any(not n.sha256 or a.sha256 == n.sha256 for a in have)
            what = f"file {n.name}" + (f" (sha256 {n.sha256[:12]}...)" if n.sha256 else "")
        if not ok:
            has = sorted({a.version or a.sha256[:12] for a in have})
            out.append(f"{what} is not in the bundle (role {n.role}, release {n.release}, hosts {_hosts(hs)}"
                       + (f"; the bundle has {', '.join(has)})" if has else ")"))
    return out
