"""The cached Debian 12 base root every testbed host boots from (one read-only overlayfs lower layer).

Built once with debootstrap into a temporary directory next to its final place and renamed atomically, so an
interrupted build never leaves a half root that later runs would trust. Rebuilt when missing or when the recipe
(package list, tweaks) changes: the recipe's hash is part of the directory name.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_CACHE = Path("/var/cache/provisioner-testbed")
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"

#: What every host gets. python3-apt: Ansible's apt module needs it and would otherwise install it on every host
#: through the proxy on the first run.
PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "openssh-server",
    "python3",
    "python3-apt",
    "iproute2",
    "sudo",
    "dbus",
    "ca-certificates",
    "gnupg",
    "kmod",
    "procps",
)

#: Units that only cost boot time and memory in a container host.
MASKED_UNITS: tuple[str, ...] = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "console-getty.service",
    "getty@.service",
    "systemd-networkd-wait-online.service",
    "systemd-journald-audit.socket",
)

#: Bump when the tweaks below change in a way that needs a rebuild.
RECIPE_VERSION = 1


def cache_dir() -> Path:
    """The testbed cache (`PROVISIONER_TESTBED_CACHE` or /var/cache/provisioner-testbed)."""
    return Path(os.environ.get("PROVISIONER_TESTBED_CACHE", str(DEFAULT_CACHE)))


def recipe_hash() -> str:
    text = f"{RECIPE_VERSION}|{SUITE}|{','.join(PACKAGES)}|{','.join(MASKED_UNITS)}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def base_path(cache: Path) -> Path:
    return cache / f"base-{SUITE}-{recipe_hash()}"


def is_ready(cache: Path) -> bool:
    return (base_path(cache) / ".provisioner-base").is_file()


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (created), held for the block: serializes builders across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


#: Programs the rack needs on this machine (Debian packages in .ci/install-deps.sh, `make deps`).
TOOLS = ("debootstrap", "systemd-nspawn", "tinyproxy", "ip", "unshare", "dpkg-deb", "apt-ftparchive", "gpg",
         "fakeroot", "ssh", "ssh-keygen")


def require_tools() -> None:
    """Fail with one line naming what is missing, before anything is built (not a traceback halfway)."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise RuntimeError(f"missing on this machine: {', '.join(missing)} (install them with `make deps`, as root: "
                           ".ci/install-deps.sh)")


def ensure_base(cache: Path | None = None, *, log: Callable[[str], None] | None = None) -> Path:
    """Return the base root, building it first when missing (cold: ~1.5 min from Debian's mirror)."""
    require_tools()
    cache = cache or cache_dir()
    final = base_path(cache)
    if is_ready(cache):
        return final
    with locked(cache / ".base.lock"):
        if is_ready(cache):
            return final
        _sweep_partial(cache)
        tmp = cache / f".tmp-{final.name}-{os.getpid()}"
        started = time.monotonic()
        if log:
            log(f"building the Debian 12 base root in {final} (debootstrap, once)")
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(tmp),
            MIRROR,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            raise RuntimeError("debootstrap failed: " + " | ".join(tail))
        customize(tmp)
        (tmp / ".provisioner-base").write_text(
            f"recipe={recipe_hash()}\nbuilt_s={time.monotonic() - started:.1f}\n"
        )
        if final.exists():  # a stale, unmarked tree
            shutil.rmtree(final)
        os.rename(tmp, final)
        return final


def _sweep_partial(cache: Path) -> None:
    """Remove temp trees of builds that died (we hold the lock, so none is in progress)."""
    if not cache.is_dir():
        return
    for child in cache.iterdir():
        if child.name.startswith(".tmp-base-"):
            shutil.rmtree(child, ignore_errors=True)


def customize(root: Path) -> None:
    """Host-independent tweaks (pure file edits, no chroot). Per-host identity lives in each host's upper dir."""
    etc = root / "etc"
    # Identity is per host: drop what debootstrap generated so no two hosts share it.
    for key in (etc / "ssh").glob("ssh_host_*"):
        key.unlink()
    (etc / "machine-id").write_text("")
    dbus_id = root / "var/lib/dbus/machine-id"
    if dbus_id.is_symlink() or dbus_id.exists():
        dbus_id.unlink()
    # systemd-networkd configures host0; resolved is not installed (hosts have no DNS by design).
    wants = etc / "systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    _symlink(wants / "systemd-networkd.service", "/lib/systemd/system/systemd-networkd.service")
    sockets = etc / "systemd/system/sockets.target.wants"
    sockets.mkdir(parents=True, exist_ok=True)
    _symlink(sockets / "systemd-networkd.socket", "/lib/systemd/system/systemd-networkd.socket")
    for unit in MASKED_UNITS:
        _symlink(etc / "systemd/system" / unit, "/dev/null")
    # sshd: keys only, quick.
    conf_d = etc / "ssh/sshd_config.d"
    conf_d.mkdir(parents=True, exist_ok=True)
    (conf_d / "10-testbed.conf").write_text(
        "# provisioner testbed: key-only root login, no DNS lookups (hosts have no resolver)\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\nMaxStartups 100:30:200\n"
    )
    # journald: small and volatile.
    jd = etc / "systemd/journald.conf.d"
    jd.mkdir(parents=True, exist_ok=True)
    (jd / "10-testbed.conf").write_text("[Journal]\nStorage=volatile\nRuntimeMaxUse=16M\n")
    # apt: no recommends by default would change role behavior; only drop translations to speed updates.
    (etc / "apt/apt.conf.d/90testbed-no-languages").write_text('Acquire::Languages "none";\n')
    # Drop the downloaded .debs (the base is a cache; hosts fetch through the proxy).
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()


def _symlink(link: Path, target: str) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def remove_stale_bases(cache: Path, keep: Path) -> list[Path]:
    """Delete base roots of older recipes (callers make sure none is mounted)."""
    removed = []
    for child in cache.glob(f"base-{SUITE}-*"):
        if child != keep and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed
