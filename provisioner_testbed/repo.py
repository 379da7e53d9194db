"""The simulated rack's stand-in NVIDIA apt repository: built from `provisioner_testbed/packages/`, signed, cached.

`ensure_repo(cache)` returns the directory the testbed serves as `http://198.18.0.1:8090/nvidia/`: a flat apt
repository (like NVIDIA's CUDA repo: `deb [signed-by=KEYRING] URL /`) holding the .debs, `Packages(.gz)`,
`Release`, `InRelease`, `Release.gpg` and the public key `testbed-archive-keyring.gpg` (binary, for `signed-by=`)
plus `testbed-archive-keyring.asc`. The signing key is generated once into `cache/nvidia-repo/gnupg/` (never
served). A build is keyed by a hash of the package sources, this module and the key: unchanged sources reuse it.

Needs (Debian packages): dpkg (dpkg-deb), apt-utils (apt-ftparchive), gnupg (gpg, gpgconf).
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from provisioner.errors import UsageError

SOURCES = Path(__file__).resolve().parent / "packages"
KEYRING = "testbed-archive-keyring.gpg"
KEY_UID = "provisioner testbed archive <testbed-archive@provisioner.invalid>"
SOURCE_DATE_EPOCH = 1_767_225_600  # fixed file times: identical sources give identical .debs
_TOOLS = {"dpkg-deb": "dpkg", "apt-ftparchive": "apt-utils", "gpg": "gnupg", "gpgconf": "gnupg"}
_EXECUTABLE_DIRS = ("usr/bin/", "usr/sbin/", "bin/", "sbin/", "opt/amazon/efa/bin/")
#: Where the stand-in EFA installer tarball lands in the served directory (`<repo URL>efa/<name>`).
EFA_DIR = "efa"
_MAINTAINER_SCRIPTS = {"preinst", "postinst", "prerm", "postrm", "config"}


class RepoError(UsageError):
    """The repository cannot be built (missing tool, bad package source); the message says what to fix."""


@dataclass(frozen=True)
class PackageDef:
    """One stand-in package build, as listed in `packages/packages.toml`."""

    name: str
    version: str  # Debian version, epoch and revision included
    source: str  # directory under packages/ with DEBIAN/ and root/
    runtime: bool = False  # ship common/hwsimrt.py for the simulators
    links: Mapping[str, str] = field(default_factory=dict)
    empty: tuple[str, ...] = ()

    @property
    def upstream(self) -> str:
        v = self.version.split(":", 1)[-1]
        return v.rsplit("-", 1)[0] if "-" in v else v

    def subst(self, text: str) -> str:
        return text.replace("@PACKAGE@", self.name).replace("@VERSION@", self.version).replace(
            "@UPSTREAM@", self.upstream)


def _manifest(sources: Path) -> dict:
    path = sources / "packages.toml"
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RepoError(f"cannot read the package manifest: {exc}", path=str(path)) from exc


def load_manifest(sources: Path = SOURCES, *, items: list | None = None) -> list[PackageDef]:
    path = sources / "packages.toml"
    out = []
    for n, item in enumerate(_manifest(sources).get("package", []) if items is None else items):
        unknown = set(item) - {"name", "version", "source", "runtime", "links", "empty"}
        if unknown or not all(isinstance(item.get(k), str) for k in ("name", "version", "source")):
            raise RepoError(f"package[{n}]: needs name, version, source (strings); unknown keys {sorted(unknown)}",
                            path=str(path))
        if not (sources / item["source"] / "DEBIAN" / "control").is_file():
            raise RepoError(f"package[{n}] {item['name']}: no {item['source']}/DEBIAN/control", path=str(path))
        out.append(PackageDef(item["name"], item["version"], item["source"], bool(item.get("runtime", False)),
                              dict(item.get("links", {})), tuple(item.get("empty", ()))))
    return out


def source_hash(sources: Path = SOURCES) -> str:
    """Hash of every package source file (path, mode, content) and of this module."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for p in sorted(sources.rglob("*")):
        if "__pycache__" in p.parts:
            continue
        rel = p.relative_to(sources).as_posix()
        if p.is_symlink():
            h.update(f"L {rel} {os.readlink(p)}\n".encode())
        elif p.is_file():
            h.update(f"F {rel} {os.access(p, os.X_OK)}\n".encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _run(cmd: list[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> str:
    try:
        res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise RepoError(f"{cmd[0]} not found: install the Debian package {_TOOLS.get(cmd[0], cmd[0])}") from exc
    if res.returncode != 0:
        raise RepoError(f"{' '.join(cmd)} failed (exit {res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


def check_tools() -> None:
    missing = sorted({pkg for tool, pkg in _TOOLS.items() if shutil.which(tool) is None})
    if missing:
        raise RepoError(f"building the stand-in NVIDIA repo needs: apt-get install {' '.join(missing)}")


# --- building one package ---------------------------------------------------------------------------------------
def stage(pkg: PackageDef, dest: Path, sources: Path = SOURCES) -> Path:
    """Lay out the package's file tree (with DEBIAN/) under `dest`, templates substituted. Returns `dest`."""
    src = sources / pkg.source
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    conffiles: set[str] = set()
    for part in ("root", "DEBIAN"):
        base = src / part
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            rel = pkg.subst(p.relative_to(base).as_posix())
            target = dest / rel if part == "root" else dest / "DEBIAN" / rel
            if p.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            data = p.read_bytes()
            try:
                data = pkg.subst(data.decode()).encode()
            except UnicodeDecodeError:
                pass
            target.write_bytes(data)
            executable = (part == "DEBIAN" and rel in _MAINTAINER_SCRIPTS) or (
                part == "root" and rel.startswith(_EXECUTABLE_DIRS))
            target.chmod(0o755 if executable else 0o644)
            if part == "DEBIAN" and rel == "conffiles":
                conffiles = {line.strip().lstrip("/") for line in data.decode().splitlines() if line.strip()}
    if pkg.runtime:
        lib = dest / "usr/lib/nvidia-hwsim" / pkg.name
        lib.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sources / "common" / "hwsimrt.py", lib / "hwsimrt.py")
        (lib / "hwsimrt.py").chmod(0o644)
    for rel in pkg.empty:
        f = dest / pkg.subst(rel)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"")
        f.chmod(0o644)
    for rel, target in pkg.links.items():
        link = dest / pkg.subst(rel)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(pkg.subst(target))

    files = [p for p in sorted(dest.rglob("*")) if "DEBIAN" not in p.relative_to(dest).parts[:1]]
    md5 = []
    size = 0
    for p in files:
        rel = p.relative_to(dest).as_posix()
        if p.is_file() and not p.is_symlink():
            size += (p.stat().st_size + 1023) // 1024
            if rel not in conffiles:
                md5.append(f"{hashlib.md5(p.read_bytes()).hexdigest()}  {rel}\n")
        else:
            size += 1
    if md5:
        (dest / "DEBIAN" / "md5sums").write_text("".join(md5))
        (dest / "DEBIAN" / "md5sums").chmod(0o644)
    control = dest / "DEBIAN" / "control"
    text = control.read_text()
    if not re.search(r"^Package: \S+$", text, re.M) or re.search(r"@[A-Z]+@", text):
        raise RepoError(f"{pkg.source}/DEBIAN/control: bad template for {pkg.name}")
    control.write_text(text.replace("\nDescription:", f"\nInstalled-Size: {max(size, 1)}\nDescription:", 1))
    for p in [dest, *dest.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
        os.utime(p, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
    return dest


def architecture(staged: Path) -> str:
    m = re.search(r"^Architecture: (\S+)$", (staged / "DEBIAN" / "control").read_text(), re.M)
    if not m:
        raise RepoError(f"{staged}/DEBIAN/control has no Architecture")
    return m.group(1)


def build_deb(pkg: PackageDef, workdir: Path, outdir: Path, sources: Path = SOURCES) -> Path:
    staged = stage(pkg, workdir / f"{pkg.name}_{pkg.upstream}", sources)
    version = pkg.version.split(":", 1)[-1]
    out = outdir / f"{pkg.name}_{version}_{architecture(staged)}.deb"
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
    _run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(staged), str(out)], env=env)
    return out


# --- the stand-in EFA installer tarball -------------------------------------------------------------------------
def efa_installer(sources: Path = SOURCES) -> tuple[str, str, list[PackageDef]]:
    """(version, installer source dir, the .debs it carries) from `[efa_installer]` of packages.toml."""
    section = _manifest(sources).get("efa_installer") or {}
    if not isinstance(section.get("version"), str) or not isinstance(section.get("source"), str):
        raise RepoError("[efa_installer] needs version and source (strings)", path=str(sources / "packages.toml"))
    return section["version"], section["source"], load_manifest(sources, items=section.get("package", []))


def efa_tarball_name(version: str) -> str:
    return f"aws-efa-installer-{version}.tar.gz"


def build_efa_installer(out: Path, work: Path, sources: Path = SOURCES) -> Path:
    """`out/efa/aws-efa-installer-<version>.tar.gz` (+ `.sha256`): aws-efa-installer/efa_installer.sh, README and
    DEBS/*.deb, the real tarball's layout, with fixed times and owners so identical sources give identical bytes."""
    import tarfile

    version, source, debs = efa_installer(sources)
    tree = work / "aws-efa-installer"
    shutil.rmtree(tree, ignore_errors=True)
    (tree / "DEBS").mkdir(parents=True)
    for pkg in debs:
        build_deb(pkg, work / "efa-stage", tree / "DEBS", sources)
    for p in sorted((sources / source).iterdir()):
        text = p.read_text().replace("@UPSTREAM@", version)
        (tree / p.name).write_text(text)
        (tree / p.name).chmod(0o755 if p.suffix == ".sh" else 0o644)
    dest = out / EFA_DIR
    dest.mkdir(parents=True, exist_ok=True)
    tarball = dest / efa_tarball_name(version)

    def norm(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = "root"
        ti.mtime = SOURCE_DATE_EPOCH
        return ti

    with open(tarball, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        tar.add(tree, arcname="aws-efa-installer", filter=norm, recursive=False)
        for p in sorted(tree.rglob("*")):
            tar.add(p, arcname=f"aws-efa-installer/{p.relative_to(tree).as_posix()}", filter=norm, recursive=False)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    (dest / (tarball.name + ".sha256")).write_text(f"{digest}  {tarball.name}\n")
    return tarball


# --- signing key -----------------------------------------------------------------------------------------------
def _gpg(home: Path, *args: str) -> str:
    return _run(["gpg", "--homedir", str(home), "--batch", "--yes", "--pinentry-mode", "loopback",
                 "--passphrase", "", *args])


def ensure_key(home: Path) -> str:
    """Generate the testbed archive key once; returns its fingerprint."""
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    listing = _run(["gpg", "--homedir", str(home), "--batch", "--with-colons", "--list-secret-keys"])
    if "fpr:" not in listing:
        _gpg(home, "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
        listing = _run(["gpg", "--homedir", str(home), "--batch", "--with-colons", "--list-secret-keys"])
    for line in listing.splitlines():
        if line.startswith("fpr:"):
            return line.split(":")[9]
    raise RepoError(f"no signing key in {home}")


def _stop_agent(home: Path) -> None:
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)


# --- the repository --------------------------------------------------------------------------------------------
def build_repo(out: Path, key_home: Path, fingerprint: str, sources: Path = SOURCES) -> Path:
    """Build every package of the manifest into `out` and write the signed flat-repo index."""
    out.mkdir(parents=True)
    work = out.parent / (out.name + ".stage")
    try:
        for pkg in load_manifest(sources):
            build_deb(pkg, work, out, sources)
        build_efa_installer(out, work, sources)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    packages = _run(["apt-ftparchive", "packages", "."], cwd=out)
    (out / "Packages").write_text(packages)
    with gzip.GzipFile(out / "Packages.gz", "wb", mtime=0) as gz:
        gz.write(packages.encode())
    release = _run(["apt-ftparchive",
                    "-o", "APT::FTPArchive::Release::Origin=provisioner-testbed",
                    "-o", "APT::FTPArchive::Release::Label=NVIDIA stand-in (simulated rack)",
                    "-o", "APT::FTPArchive::Release::Architectures=amd64 all",
                    "-o", "APT::FTPArchive::Release::Description=Stand-in NVIDIA packages for the simulated rack",
                    "release", "."], cwd=out)
    (out / "Release").write_text(release)
    _gpg(key_home, "--local-user", fingerprint, "--digest-algo", "SHA512", "--clearsign",
         "--output", str(out / "InRelease"), str(out / "Release"))
    _gpg(key_home, "--local-user", fingerprint, "--digest-algo", "SHA512", "--armor", "--detach-sign",
         "--output", str(out / "Release.gpg"), str(out / "Release"))
    _gpg(key_home, "--output", str(out / KEYRING), "--export", fingerprint)
    _gpg(key_home, "--armor", "--output", str(out / "testbed-archive-keyring.asc"), "--export", fingerprint)
    for p in [out, *out.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return out


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


#: Builds other than the current one are kept this long after their last use: racks started from another checkout
#: (other package sources) keep serving their own build while this one builds and serves its own.
KEEP_OTHER_BUILDS_S = 24 * 3600


def ensure_repo(cache: Path) -> Path:
    """Build the stand-in repo under `cache/nvidia-repo/` unless an identical build exists; return the served dir.

    The returned path is the build's own directory (`cache/nvidia-repo/builds/<id>`, keyed by the package sources),
    so a rack keeps serving the packages it was started with when another checkout with other sources builds and
    serves its own build from the same cache. `cache/nvidia-repo/nvidia` is a symlink switched atomically to the
    latest build; builds unused for KEEP_OTHER_BUILDS_S are removed. Safe to call from several processes at once.
    """
    root = Path(cache) / "nvidia-repo"
    served = root / "nvidia"
    with _locked(root / ".lock"):
        check_tools()
        try:
            fingerprint = ensure_key(root / "gnupg")
            build_id = hashlib.sha256(f"{source_hash()}:{fingerprint}".encode()).hexdigest()[:20]
            builds = root / "builds"
            current = builds / build_id
            if not (current / "InRelease").is_file():
                tmp = builds / f".{build_id}.tmp{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.rmtree(current, ignore_errors=True)
                build_repo(tmp, root / "gnupg", fingerprint)
                tmp.rename(current)
        finally:
            _stop_agent(root / "gnupg")  # gpg starts an agent for secret-key operations: leave none running
        os.utime(current)  # last use: keeps it from the pruning below in other processes
        if not served.is_symlink() or os.readlink(served) != f"builds/{build_id}":
            link = root / f".nvidia.{os.getpid()}"
            link.unlink(missing_ok=True)
            link.symlink_to(f"builds/{build_id}")
            os.replace(link, served)
        now = time.time()
        for old in builds.iterdir():
            if old.name != build_id and now - old.stat().st_mtime > KEEP_OTHER_BUILDS_S:
                shutil.rmtree(old, ignore_errors=True)
    return current
