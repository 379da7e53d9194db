"""Check a bundle directory: every artifact's size and sha256, the apt repositories' signatures (gpgv against the
key the bundle carries, whose fingerprint the manifest pins) and their Packages against the manifest; with needs,
completeness (provisioner.bundle.manifest.missing)."""

from __future__ import annotations

import hashlib
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from provisioner.bundle import manifest as mf
from provisioner.bundle.build import KEYRING, BundleError, key_fingerprints, sha256
from provisioner.bundle.needs import Need


def read(bundle: Path) -> tuple[dict, list[mf.Artifact]]:
    path = bundle / mf.MANIFEST
    try:
        return mf.load(path.read_text())
    except OSError as exc:
        raise BundleError(f"cannot read the manifest: {exc.strerror}", path=str(path)) from None
    except ValueError as exc:
        raise BundleError(f"not a bundle manifest: {exc}", path=str(path)) from None


def _inside(bundle: Path, rel: str) -> Path | None:
    p = (bundle / rel).resolve()
    return p if bundle.resolve() in p.parents else None


def check(bundle: Path, needs: Mapping[Need, Iterable[str]] | None = None) -> list[str]:
    """Problems found, one line each (empty: the bundle is intact and, with needs, complete)."""
    doc, arts = read(bundle)
    problems: list[str] = []
    for a in arts:
        p = _inside(bundle, a.path)
        if p is None:
            problems.append(f"{a.path}: path outside the bundle")
        elif not p.is_file():
            problems.append(f"{a.path}: missing ({a.kind} {a.name} {a.version})")
        elif p.stat().st_size != a.size or sha256(p) != a.sha256:
            problems.append(f"{a.path}: sha256 {sha256(p)[:16]}... is not the manifest's {a.sha256[:16]}...")
    fpr = str(doc.get("key_fingerprint", ""))
    for rel in doc.get("releases", []):
        repo = bundle / "apt" / str(rel)
        if not (repo / "InRelease").is_file():
            continue
        problems += _check_repo(repo, fpr, [a for a in arts if a.kind == "deb" and rel in a.releases])
    if needs is not None:
        problems += mf.missing(arts, needs)
    return problems


def _check_repo(repo: Path, fpr: str, debs: list[mf.Artifact]) -> list[str]:
    key = repo / KEYRING
    if not key.is_file():
        return [f"{repo.name}: no {KEYRING}"]
    found = key_fingerprints(key)
    if found != [fpr]:
        return [f"apt/{repo.name}/{KEYRING}: fingerprint {', '.join(found)} is not the manifest's {fpr}"]
    with tempfile.TemporaryDirectory() as _:
        res = subprocess.run(["gpgv", "--keyring", str(key), str(repo / "InRelease")], capture_output=True,
                             text=True, check=False)
    if res.returncode != 0:
        return [f"apt/{repo.name}/InRelease: bad signature ({res.stderr.strip().splitlines()[-1:]})"]
    signed = res.stdout if res.stdout else (repo / "InRelease").read_text()
    out = []
    m = re.search(r"^ ([0-9a-f]{64}) +\d+ Packages$", signed, re.M)
    pk = repo / "Packages"
    if not m or not pk.is_file() or hashlib.sha256(pk.read_bytes()).hexdigest() != m.group(1):
        out.append(f"apt/{repo.name}/Packages: not the one InRelease signs")
        return out
    listed = dict(re.findall(r"^Filename: (?:\./)?(\S+)\n(?:.*\n)*?SHA256: ([0-9a-f]{64})$", pk.read_text(), re.M))
    for a in debs:
        fname = a.path.rsplit("/", 1)[-1]
        if listed.get(fname) != a.sha256:
            out.append(f"{a.path}: the signed Packages index does not list it with the manifest's sha256")
    return out


def gaps(bundle: Path, fleet: object, hosts: Iterable[str], kernel: str = "") -> list[str]:
    """What the bundle lacks for `hosts` of `fleet` (completeness only: `provision run --bundle`, before any host)."""
    from provisioner.bundle.needs import fleet_needs

    doc, arts = read(bundle)
    wanted = set(hosts)
    needs = {n: hs for n, hs in fleet_needs(fleet, doc.get("releases") or ["debian12"], kernel).items()  # type: ignore[arg-type]
             if wanted.intersection(hs)}
    return mf.missing(arts, {n: [h for h in hs if h in wanted] for n, hs in needs.items()})
