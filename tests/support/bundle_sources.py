"""Local, offline stand-ins for a site's upstreams, for the bundle tests: a signed flat apt repository of small real
.debs named like the Debian packages the roles install (with a dependency chain, so closure is exercised), and a
directory of small real wheels (a `vllm` and its one dependency). Built with dpkg-deb, apt-ftparchive, gpg: no root,
no network.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import subprocess
import zipfile
from pathlib import Path

#: name -> (version, Depends)
DEBIAN_STUBS: dict[str, tuple[str, str]] = {
    "python3": ("3.11.2-1+b1", "libpython3-stub"),
    "libpython3-stub": ("3.11.2-1", ""),
    "passwd": ("1:4.13+dfsg1-1+b1", ""),
    "python3-venv": ("3.11.2-1+b1", "python3.11-venv"),
    "python3.11-venv": ("3.11.2-6+deb12u6", "python3"),
    "libnuma1": ("2.0.16-1", ""),
    "nftables": ("1.0.6-2+deb12u2", "libnftables1"),
    "libnftables1": ("1.0.6-2+deb12u2", ""),
    "rdma-core": ("44.0-2", ""),
    "ibverbs-utils": ("44.0-2", "rdma-core"),
    "infiniband-diags": ("44.0-2", ""),
    "perftest": ("4.5.0.20-1", ""),
    "nginx": ("1.22.1-9+deb12u3", ""),
    "libnginx-mod-http-js": ("0.7.10-1", "nginx"),
    "prometheus": ("2.42.0+ds-5+b5", ""),
}


def _run(*cmd: str, cwd: Path | None = None, env: dict | None = None) -> str:
    return subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def gpg_key(home: Path, uid: str) -> str:
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    base = ["gpg", "--homedir", str(home), "--batch", "--yes", "--pinentry-mode", "loopback", "--passphrase", ""]
    _run(*base, "--quick-gen-key", uid, "ed25519", "sign", "never")
    out = _run(*base, "--with-colons", "--list-secret-keys")
    return next(line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:"))


def debian_repo(d: Path, stubs: dict[str, tuple[str, str]] = DEBIAN_STUBS) -> tuple[Path, Path]:
    """A signed flat repository of stub .debs in `d/repo`; returns (repo, binary keyring)."""
    repo, stage = d / "repo", d / "stage"
    repo.mkdir(parents=True)
    for name, (version, depends) in sorted(stubs.items()):
        root = stage / name
        (root / "DEBIAN").mkdir(parents=True)
        (root / "usr/share/doc" / name).mkdir(parents=True)
        (root / "usr/share/doc" / name / "README").write_text(f"stand-in for Debian's {name} {version}\n")
        control = f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: tests <t@invalid>\n"
        control += (f"Depends: {depends}\n" if depends else "") + f"Description: stand-in {name}\n"
        (root / "DEBIAN/control").write_text(control)
        _run("dpkg-deb", "--root-owner-group", "--build", str(root),
             str(repo / f"{name}_{version.split(':')[-1]}_all.deb"), env={"SOURCE_DATE_EPOCH": "1767225600",
                                                                            "PATH": "/usr/bin:/bin"})
    packages = _run("apt-ftparchive", "packages", ".", cwd=repo)
    (repo / "Packages").write_text(packages)
    with gzip.GzipFile(repo / "Packages.gz", "wb", mtime=0) as gz:
        gz.write(packages.encode())
    (repo / "Release").write_text(_run("apt-ftparchive", "release", ".", cwd=repo))
    home = d / "gnupg"
    fpr = gpg_key(home, "site debian stand-in <debian@site.invalid>")
    base = ["gpg", "--homedir", str(home), "--batch", "--yes", "--pinentry-mode", "loopback", "--passphrase", ""]
    _run(*base, "--local-user", fpr, "--clearsign", "--output", str(repo / "InRelease"), str(repo / "Release"))
    _run(*base, "--output", str(d / "debian-keyring.gpg"), "--export", fpr)
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)
    return repo, d / "debian-keyring.gpg"


def _record(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(d: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """`<name>-<version>-py3-none-any.whl` with module `<name>`, reproducible bytes."""
    d.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{name}/__init__.py": f'VERSION = "{version}"\n'.encode(), f"{dist}/METADATA": meta.encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = ("".join(f"{p},{_record(b)},{len(b)}\n" for p, b in files.items())
                               + f"{dist}/RECORD,,\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p, b in files.items():
            z.writestr(zipfile.ZipInfo(p, date_time=(2026, 1, 1, 0, 0, 0)), b)
    out = d / f"{name}-{version}-py3-none-any.whl"
    out.write_bytes(buf.getvalue())
    return out
