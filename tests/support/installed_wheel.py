"""The wheel of this checkout, installed into a fresh venv that cannot see the checkout: what `pip install` gives a
site. Shared by tests/unit/test_installed_package.py and tests/testbed/test_installed_rack.py (built once per pytest
session: `installed(base)` builds once per process).

- Build: `python -m pip wheel --no-deps -w DIST <repo>` (the real PEP 517 build, isolated, with hatchling).
- Install: `python -m venv` (no system site-packages) + `pip install DIST/provisioner-*.whl`. The dependencies come
  from a wheelhouse (`$PROVISIONER_TEST_WHEELHOUSE`, default `~/.cache/provisioner-tests/wheelhouse`), offline; when
  it lacks something, `pip download` fills it from the index as this machine's pip is configured, once.
- Use: `Installed.provision(*args, cwd=DIR)` runs the fresh venv's `provision` with the checkout's venv off PATH and
  no PYTHONPATH, from DIR (never the repository).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def wheelhouse() -> Path:
    env = os.environ.get("PROVISIONER_TEST_WHEELHOUSE")
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(env) if env else base / "provisioner-tests" / "wheelhouse"


@dataclass
class Installed:
    venv: Path
    wheel: Path
    site_packages: Path
    build_s: float
    install_s: float

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ without the checkout: no PYTHONPATH/VIRTUAL_ENV, the checkout venv's bin/ off PATH."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env = {k: v for k, v in env.items() if not k.startswith("PROVISION_")}
        ours = str(Path(sys.executable).parent)
        path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != ours]
        env["PATH"] = os.pathsep.join([str(self.venv / "bin"), *path])
        env.update(extra)
        return env

    def provision(self, *args: str, cwd: Path, env: dict[str, str] | None = None,
                  timeout: float = 600) -> subprocess.CompletedProcess[str]:
        assert REPO not in [cwd.resolve(), *cwd.resolve().parents], f"{cwd} is inside the repository"
        return subprocess.run([str(self.venv / "bin" / "provision"), *args], cwd=cwd, env=env or self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def probe(self, cwd: Path, env: dict[str, str] | None = None) -> dict:
        """Where the fresh venv's `provisioner` and its data come from, seen from `cwd`."""
        code = ("import json, sys, provisioner, provisioner.paths as p; "
                "print(json.dumps({'file': provisioner.__file__, 'checkout': p.CHECKOUT, "
                "'data_root': str(p.DATA_ROOT), 'runs': str(p.runs_dir()), 'facts': str(p.facts_dir()), "
                "'sys_path': sys.path}))")
        r = subprocess.run([str(self.python), "-c", code], cwd=cwd, env=env or self.env(), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)


def _pip(python: Path | str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd="/")


def _ok(r: subprocess.CompletedProcess[str], what: str) -> None:
    assert r.returncode == 0, f"{what} failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


_done: list[Installed] = []


def installed(base: Path) -> Installed:
    """Build and install once per process (the first caller's `base` holds the wheel and the venv)."""
    if not _done:
        _done.append(_install(base))
    return _done[0]


def _install(base: Path) -> Installed:
    wh = wheelhouse()
    wh.mkdir(parents=True, exist_ok=True)
    offline = ("--no-index", "--find-links", str(wh))
    dist = base / "dist"

    t0 = time.monotonic()
    r = _pip(sys.executable, "wheel", "--no-deps", "-q", *offline, "-w", str(dist), str(REPO))
    if r.returncode != 0:  # the wheelhouse lacks the build backend: fetch it as pip is configured, once
        _ok(_pip(sys.executable, "download", "-q", "-d", str(wh), "hatchling>=1.26"), "pip download hatchling")
        r = _pip(sys.executable, "wheel", "--no-deps", "-q", *offline, "-w", str(dist), str(REPO))
    _ok(r, "pip wheel")
    build_s = time.monotonic() - t0
    (wheel,) = dist.glob("provisioner-*.whl")

    venv = base / "venv"
    t0 = time.monotonic()
    _ok(subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300),
        "python -m venv")
    py = venv / "bin" / "python"
    r = _pip(py, "install", "-q", *offline, str(wheel))
    if r.returncode != 0:  # dependencies missing from the wheelhouse: fetch them as pip is configured, once
        _ok(_pip(py, "download", "-q", "-d", str(wh), str(wheel)), "pip download (dependencies)")
        for stale in wh.glob("provisioner-*.whl"):  # never install our own package from there
            stale.unlink()
        r = _pip(py, "install", "-q", *offline, str(wheel))
    _ok(r, "pip install (fresh venv)")
    install_s = time.monotonic() - t0
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, cwd="/").stdout.strip())
    return Installed(venv=venv, wheel=wheel, site_packages=site, build_s=build_s, install_s=install_s)
