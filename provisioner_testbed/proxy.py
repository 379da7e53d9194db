"""The rack's forward proxy (tinyproxy) on the bridge address: the hosts' only way to Debian's mirror.

Like an air-gapped site's mirror proxy: no NAT, no route out; apt in the hosts is pointed at it (inventory var
`apt_proxy`, and the hosts' own apt config). A domain allow-list keeps it to Debian's archive.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from provisioner_testbed.state import Proc

PORT = 3128
#: Domains the hosts may reach through the proxy (tinyproxy filter: extended regular expressions on the host).
ALLOWED_DOMAINS: tuple[str, ...] = ("deb.debian.org", "security.debian.org")


def render_config(listen: str, allow_cidr: str, workdir: Path, allowed: tuple[str, ...] = ALLOWED_DOMAINS) -> str:
    """tinyproxy.conf for one rack (pure)."""
    filt = workdir / "filter"
    return "\n".join(
        [
            "# provisioner testbed forward proxy (generated)",
            "User nobody",
            "Group nogroup",
            f"Port {PORT}",
            f"Listen {listen}",
            "Timeout 120",
            f'LogFile "{workdir / "tinyproxy.log"}"',
            "LogLevel Warning",
            "MaxClients 200",
            f"Allow {allow_cidr}",
            "DisableViaHeader Yes",
            f'Filter "{filt}"',
            "FilterType ere",
            "FilterURLs Off",
            "FilterDefaultDeny Yes",
            "ConnectPort 443",
            "",
        ]
    )


def render_filter(allowed: tuple[str, ...] = ALLOWED_DOMAINS) -> str:
    return "".join("^" + d.replace(".", r"\.") + "$\n" for d in allowed)


def start(listen: str, allow_cidr: str, workdir: Path) -> Proc:
    """Write the config and start tinyproxy in the foreground mode as our own detached child; return it."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "filter").write_text(render_filter())
    conf = workdir / "tinyproxy.conf"
    conf.write_text(render_config(listen, allow_cidr, workdir))
    log = workdir / "tinyproxy.log"
    log.touch()
    import os
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
        os.chown(log, nobody.pw_uid, nobody.pw_gid)
    except KeyError:
        pass
    with open(workdir / "stderr.log", "ab") as err:
        p = subprocess.Popen(
            ["tinyproxy", "-d", "-c", str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            start_new_session=True,
        )
    proc = Proc.of(p.pid)
    if proc is None:
        raise RuntimeError(f"tinyproxy exited at once: see {workdir / 'stderr.log'}")
    return proc
