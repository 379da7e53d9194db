"""The vLLM layer's wheelhouse, filled ON THE CONTROLLER with the controller's own pip configuration.

Why here and not inside the build root: a chroot made from a plain Debian root trusts only Debian's CA store and
sees none of this machine's pip settings. Behind a TLS-inspecting proxy or with a site mirror (a real datacenter,
and the CI machines) every request from inside it fails (`SSLCertVerificationError`). The controller's pip already
knows the way out: its CA bundle (`PIP_CERT`, pip config `cert`, `REQUESTS_CA_BUNDLE`, the system trust store),
proxy variables, index/extra-index/find-links and constraints. So the controller's pip downloads wheels for the
TARGET interpreter (Debian 12's CPython 3.11 on x86_64, manylinux up to the base root's glibc), binaries only, and
the build root only installs them offline (`pip install --no-index --find-links`).

pip's `--python-version` picks wheels by tag and checks `Requires-Python`, but it evaluates dependency MARKERS
(`numpy<2.4; python_version <= "3.12"`) for the interpreter pip runs on (the controller's 3.12/3.13), so the
wheelhouse would miss what 3.11 needs (seen: mistral-common's numpy pin; the offline install then fails with
ResolutionImpossible). So pip runs through `PIP_AS_TARGET`: the controller's own pip, with packaging's marker
environment set to the target's values (`target_markers`, from the base root's dpkg database); everything else
(network, config, trust) is untouched.

Pure parts (argument building, target platform tags, effective CA discovery, the one-line error) are unit-tested in
tests/unit/test_vllm_wheelhouse.py; `fill()` runs pip.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from provisioner.bundle.build import PIP_FOR_TARGET
from provisioner.bundle.build import target_markers as bundle_markers
from provisioner_testbed.progress import Phases, count_wheels, run_logged

#: The golden layer's interpreter: the base root's Debian 12 python3.11.
TARGET_PYTHON = "3.11"
TARGET_ARCH = "x86_64"
#: pip's own network knobs for the download: a few quick retries, not minutes of them.
RETRIES = 2
TIMEOUT_S = 30
DEFAULT_INDEX = "https://pypi.org/simple"
#: How to point the suite elsewhere (docs/testbed.md, "Wheels for the vLLM layer").
HINT = ("point pip elsewhere with PIP_CERT=/path/ca.pem (your site's CA), PIP_INDEX_URL=URL (a mirror) or "
        "HTTPS_PROXY=URL (docs/testbed.md)")


class DownloadError(RuntimeError):
    """The wheelhouse could not be filled; str() is one line for the CLI."""


# ---------------------------------------------------------------------------------------------------------------
# target


def glibc_version(dpkg_status: str) -> tuple[int, int]:
    """(major, minor) of libc6 in a Debian dpkg status file (Debian 12: 2.36)."""
    m = re.match(r"(?:\d+:)?(\d+)\.(\d+)", _dpkg_version(dpkg_status, "libc6") or "")
    if not m:
        raise ValueError("no installed libc6 in the dpkg status")
    return int(m.group(1)), int(m.group(2))


def platform_tags(glibc: tuple[int, int], arch: str = TARGET_ARCH) -> list[str]:
    """Every manylinux tag a host with that glibc runs, newest first, with the legacy aliases.

    pip expands a custom `--platform` only for the legacy names, so the list is spelled out (a wheel tagged only
    `manylinux2014_x86_64` needs that exact name in the list)."""
    major, minor = glibc
    if major != 2 or minor < 5:
        raise ValueError(f"unsupported glibc {major}.{minor}")
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
    for legacy, since in (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)):
        if minor >= since:
            tags.append(f"{legacy}_{arch}")
    return tags


def _dpkg_version(dpkg_status: str, package: str) -> str | None:
    for para in dpkg_status.split("\n\n"):
        fields = dict(ln.split(": ", 1) for ln in para.splitlines() if ": " in ln and not ln.startswith(" "))
        if fields.get("Package") == package and fields.get("Status", "install ok installed").endswith(" installed"):
            return fields.get("Version")
    return None


def target_markers(dpkg_status: str, python_version: str = TARGET_PYTHON) -> dict[str, str]:
    """The PEP 508 marker environment of the base root's CPython (platform_release/version: the hosts run the
    controller's kernel, so pip's own values are right for those)."""
    deb = _dpkg_version(dpkg_status, f"python{python_version}-minimal") or _dpkg_version(
        dpkg_status, f"python{python_version}")
    m = re.match(r"(?:\d+:)?(\d+\.\d+\.\d+)", deb or "")
    if not m or not m.group(1).startswith(python_version + "."):
        raise ValueError(f"no installed python{python_version} in the dpkg status")
    return bundle_markers(python_version, m.group(1), TARGET_ARCH)


#: `python -c PIP_AS_TARGET MARKERS_JSON download ...`: the running pip, evaluating dependency markers for the
#: target interpreter (the bundle build's shim: one copy).
PIP_AS_TARGET = PIP_FOR_TARGET


def download_argv(python: str, wheelhouse: Path, packages: Sequence[str], platforms: Sequence[str], *,
                  markers: Mapping[str, str], offline: bool = False,
                  find_links: Sequence[Path] = ()) -> list[str]:
    """`pip download` of binary wheels for the target interpreter into the wheelhouse.

    offline: only what the wheelhouse already holds (a complete wheelhouse succeeds without any network).
    Everything else (index, extra indexes, find-links, constraints, CA, proxy) is the controller's pip config."""
    python_version = markers["python_version"]
    nodot = python_version.replace(".", "")
    argv = [python, "-c", PIP_AS_TARGET, json.dumps(dict(markers), sort_keys=True),
            "download", "--dest", str(wheelhouse), "--only-binary=:all:",
            "--python-version", python_version, "--implementation", "cp", "--abi", f"cp{nodot}",
            "--progress-bar", "off", "--retries", str(RETRIES), "--timeout", str(TIMEOUT_S)]
    for p in platforms:
        argv += ["--platform", p]
    if offline:
        argv += ["--no-index", "--find-links", str(wheelhouse)]
    for d in find_links:
        argv += ["--find-links", str(d)]
    return argv + list(packages)


# ---------------------------------------------------------------------------------------------------------------
# what pip would trust


def parse_pip_config(text: str) -> dict[str, str]:
    """`pip config list` output (`section.key='value'`, `:env:.key='value'` for PIP_* variables) -> dict."""
    out: dict[str, str] = {}
    for ln in text.splitlines():
        m = re.match(r"^(\S+?)=(['\"])(.*)\2\s*$", ln.strip())
        if m:
            out[m.group(1)] = m.group(3)
    return out


def pip_setting(config: Mapping[str, str], key: str, command: str = "download") -> tuple[str, str] | None:
    """(value, where) of a pip option as pip resolves it: PIP_* variable, then [download], then [global]."""
    for section, where in ((":env:", f"PIP_{key.upper().replace('-', '_')}"),
                           (command, f"pip config {command}.{key}"), ("global", f"pip config global.{key}")):
        v = config.get(f"{section}.{key}")
        if v:
            return v, where
    return None


def effective_ca(config: Mapping[str, str], environ: Mapping[str, str],
                 default: tuple[str, str] | None = None) -> tuple[str, str]:
    """(CA file, where it comes from) for pip's HTTPS requests.

    Order as pip 24+/requests apply it: `REQUESTS_CA_BUNDLE`/`CURL_CA_BUNDLE` (requests merges them into each
    request and they win over the session's setting), then pip's `cert` (PIP_CERT, pip config), then the system
    trust store pip uses through truststore (OpenSSL's default file, `SSL_CERT_FILE` when set) plus certifi."""
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        if environ.get(var):
            return environ[var], var
    got = pip_setting(config, "cert")
    if got:
        return got
    return default or system_ca(environ)


def system_ca(environ: Mapping[str, str]) -> tuple[str, str]:
    """What pip's truststore context verifies with when nothing names a bundle: OpenSSL's default file."""
    paths = ssl.get_default_verify_paths()
    if environ.get("SSL_CERT_FILE"):
        return environ["SSL_CERT_FILE"], "SSL_CERT_FILE (system trust store)"
    where = "the system trust store"
    ca = paths.cafile or paths.openssl_cafile or paths.capath or "?"
    try:
        from pip._vendor import certifi  # type: ignore[import-untyped]

        where += f" + certifi {certifi.where()}"
    except ImportError:
        pass
    return ca, where


def index_urls(config: Mapping[str, str]) -> list[str]:
    got = pip_setting(config, "index-url")
    urls = [got[0] if got else DEFAULT_INDEX]
    extra = pip_setting(config, "extra-index-url")
    if extra:
        urls += extra[0].split()
    return urls


# ---------------------------------------------------------------------------------------------------------------
# pip's output -> one line

_CAUSES = (
    (re.compile(r"CERTIFICATE_VERIFY_FAILED|SSLCertVerificationError|certificate verify failed"),
     "TLS certificate not trusted"),
    (re.compile(r"ProxyError|Cannot connect to proxy|Tunnel connection failed"), "the proxy refused"),
    (re.compile(r"SSLError|SSL:"), "TLS error"),
    (re.compile(r"Name or service not known|Temporary failure in name resolution|nodename nor servname|"
                r"getaddrinfo failed"), "name resolution failed"),
    (re.compile(r"Connection refused|Network is unreachable|NewConnectionError|Failed to establish"),
     "cannot connect"),
    (re.compile(r"ReadTimeoutError|ConnectTimeoutError|timed out"), "timed out"),
)
_URL_PATTERNS = (
    re.compile(r"Could not fetch URL (\S+?): "),
    re.compile(r"HTTP error \d+ while getting (\S+)"),
    re.compile(r"for url: (\S+)"),
)
_POOL = re.compile(r"HTTP(S?)ConnectionPool\(host='([^']+)', port=(\d+)\): Max retries exceeded with url: (\S+)")
# pip's retry warning:
#   "... after connection broken by 'NewConnectionError("HTTPConnection(host='H', port=P): ...")': /simple/x/"
_RETRY = re.compile(r"after connection broken by .*?HTTP(S?)Connection(?:Pool)?\(host='([^']+)', port=(\d+)\)"
                    r".*': (/\S*)$", re.M)
_RETRY_PATH = re.compile(r"after connection broken by .*': (/\S*)$", re.M)


def failure_line(output: str, *, ca: tuple[str, str], indexes: Sequence[str], log: Path | None = None) -> str:
    """One line for a failed `pip download`: what failed where, which CA was used, how to point pip elsewhere."""
    cause = next((text for rx, text in _CAUSES if rx.search(output)), None)
    url = None
    for rx in _URL_PATTERNS:  # the last one: pip's final attempt, for the requirement it then gives up on
        found = rx.findall(output)
        if found:
            url = found[-1].rstrip(".,;)'\"")
            break
    if url is None:
        found = _POOL.findall(output) or _RETRY.findall(output)
        if found:
            tls, host, port, path = found[-1]
            default = "443" if tls else "80"
            url = f"http{tls and 's'}://{host}{'' if port == default else ':' + port}{path}"
        elif _RETRY_PATH.search(output) and indexes:
            url = indexes[0].rstrip("/").rsplit("/simple", 1)[0] + _RETRY_PATH.findall(output)[-1]
    errors = [ln.removeprefix("ERROR: ").strip() for ln in output.splitlines() if ln.startswith("ERROR: ")]
    if cause is None:
        m = re.search(r"No matching distribution found for (.+)", output)
        if m:
            cause = f"no index offers {m.group(1).strip()}"
        elif errors:
            cause = errors[-1]
        else:
            tail = [ln.strip() for ln in output.splitlines() if ln.strip()]
            cause = tail[-1] if tail else "pip failed without output"
    where = f"at {url}" if url else "from " + ", ".join(indexes)
    line = (f"wheel download for the vLLM layer failed: {cause} {where} (CA bundle {ca[0]}, from {ca[1]}); "
            f"{HINT}")
    if log is not None:
        line += f"; pip's output: {log}"
    return " ".join(line.split())  # one line whatever pip put in the pieces


# ---------------------------------------------------------------------------------------------------------------
# doing it


@dataclass
class FillResult:
    downloaded: bool  # False: the wheelhouse already had everything
    seconds: float


def _pip_config(python: str, env: Mapping[str, str]) -> dict[str, str]:
    try:
        p = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, env=dict(env),
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_pip_config(p.stdout)


def fill(wheelhouse: Path, packages: Sequence[str], *, base_root: Path, log_file: Path,
         find_links: Sequence[Path] = (), python: str | None = None,
         log=None, label: str = "vLLM layer") -> FillResult:
    """Make the wheelhouse hold `packages` and all their dependencies for the base root's Python.

    Checks offline first (a complete wheelhouse: no network at all), then downloads with the controller's pip.
    Appends pip's output to log_file. With `log`, one line per phase (`LABEL: ...`, `... done in N s`) and a heartbeat
    while pip runs (provisioner_testbed/progress.py). Raises DownloadError (one line) when pip cannot get them."""
    python = python or sys.executable
    wheelhouse.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    status = (base_root / "var/lib/dpkg/status").read_text(errors="replace")
    platforms, markers = platform_tags(glibc_version(status)), target_markers(status)
    env = dict(os.environ)
    env.update({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"})
    phases = Phases(label, started, detail=lambda: f"{count_wheels(wheelhouse)} wheels in the wheelhouse")

    def say(lines: Sequence[str | None]) -> None:
        for ln in lines:
            if ln and log:
                log(ln)

    def run(argv: list[str], title: str) -> subprocess.CompletedProcess[str]:
        with open(log_file, "a") as fh:
            shown = [a for a in argv if a != PIP_AS_TARGET]  # the marker shim is in wheelhouse.py
            fh.write(f"== [{time.strftime('%T')}] {title}\n$ {' '.join(shown)}\n")
            fh.flush()
            p = run_logged(argv, fh, env=env, keep_output=True, on_tick=lambda: say([phases.tick(time.monotonic())]))
            fh.write(f"== exit {p.rc}\n")
        return subprocess.CompletedProcess(argv, p.rc, p.output)

    say(phases.start("checking the wheelhouse offline", time.monotonic(), f"({count_wheels(wheelhouse)} wheels)"))
    check = run(download_argv(python, wheelhouse, packages, platforms, markers=markers, offline=True,
                              find_links=find_links),
                "wheelhouse complete? (offline)")
    phases.finish(time.monotonic())  # ensure_layer says what it found
    if check.returncode == 0:
        return FillResult(False, time.monotonic() - started)
    say(phases.start("downloading wheels", time.monotonic(),
                     f"for {' '.join(packages)} (controller pip, target CPython {TARGET_PYTHON} {platforms[0]}) "
                     f"into {wheelhouse}"))
    p = run(download_argv(python, wheelhouse, packages, platforms, markers=markers, find_links=find_links),
            "pip download (controller pip config)")
    if p.returncode == 0:
        say([f"{ln} ({count_wheels(wheelhouse)} wheels)" for ln in phases.finish(time.monotonic())])
    if p.returncode != 0:
        config = _pip_config(python, env)
        raise DownloadError(failure_line(p.stdout, ca=effective_ca(config, env), indexes=index_urls(config),
                                         log=log_file))
    return FillResult(True, time.monotonic() - started)
