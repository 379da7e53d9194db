"""The installed package provisions a rack: the wheel of this checkout in a fresh venv (tests/support/installed_wheel.py),
run from a directory that holds only a copy of the rack's generated inventory.

On the session rack `rack` (`make demo`'s plain rack: tests/testbed/test_demo.py converges it first in its lane; alone,
this module converges it from bare), node01 and node02 only:
1. node01 is broken by hand (/etc/nccl.conf removed, nvidia-persistenced stopped and disabled); the installed
   package's `provision run --limit node01,node02` heals it (exit 0, changes on node01), with the playbooks, roles
   and ansible.cfg from the installed package, run directories and facts in PROVISION_STATE_DIR (nothing written into
   site-packages); node01's /etc/nccl.conf is what the installed package's `render` gives;
2. `provision run --check` then connects, completes with exit 0 and changes nothing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from installed_wheel import Installed, installed  # noqa: E402  (tests/support, on pytest's pythonpath)

pytestmark = pytest.mark.testbed

HOSTS = ("node01", "node02")


@pytest.fixture(scope="module")
def rig(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Installed, Path, Path, Any]]:
    pkg = installed(tmp_path_factory.mktemp("wheel"))
    h = testbed
    site = tmp_path_factory.mktemp("site")
    shutil.copytree(Path(h.inventory).parent, site / "inventory")  # hosts.ini + group_vars/, absolute key paths
    state = tmp_path_factory.mktemp("state")
    yield pkg, site, state, h


def _run(pkg: Installed, site: Path, state: Path, *args: str) -> tuple[Any, dict[str, Any]]:
    p = pkg.provision("run", "inventory/hosts.ini", "--limit", ",".join(HOSTS), "--json", *args, cwd=site,
                      env=pkg.env(PROVISION_STATE_DIR=str(state)), timeout=1800)
    assert "Traceback" not in p.stderr, p.stderr
    assert "playbook not found" not in p.stdout + p.stderr and "data missing" not in p.stderr, p.stderr
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        raise AssertionError(f"no JSON from provision run (rc {p.returncode}): {p.stdout}\n{p.stderr}") from None
    return p, doc


def test_installed_run_then_check(rig: tuple[Installed, Path, Path, Any]) -> None:
    pkg, site, state, h = rig
    broken = h.ssh("node01", "rm -f /etc/nccl.conf; systemctl disable --now nvidia-persistenced 2>/dev/null; true")
    assert broken.returncode == 0, broken.stderr
    p, first = _run(pkg, site, state)
    assert p.returncode == 0, p.stderr[-4000:] + json.dumps(first.get("failures"), indent=1)
    assert first["succeeded"] and sorted(first["hosts"]) == sorted(HOSTS)
    assert first["hosts"]["node01"]["changed"] > 0, first["hosts"]["node01"]
    assert h.ssh("node01", "systemctl is-enabled nvidia-persistenced && systemctl is-active nvidia-persistenced"
                 ).returncode == 0
    data = pkg.site_packages / "provisioner" / "_data"
    assert Path(first["playbook"]).resolve() == (data / "playbooks" / "site.yml").resolve()
    run_dir = Path(first["run_dir"])
    assert run_dir.parent.resolve() == (state / "runs").resolve() and (run_dir / "result.json").is_file()
    assert any((state / "facts.d").iterdir()), "no fact cache in the state directory"
    assert not list(pkg.site_packages.glob("provisioner/**/.runs")) and not (data / ".cache").exists()
    # the nccl.conf on the host is what the installed package's render gives
    r = pkg.provision("render", "inventory/hosts.ini", "--host", "node01", cwd=site)
    assert r.returncode == 0, r.stderr
    want = r.stdout.split("# ==> /etc/nccl.conf", 1)[1].split("\n", 1)[1].split("\n# ==> ", 1)[0]
    got = h.ssh("node01", "cat /etc/nccl.conf").stdout
    assert got.rstrip("\n") == want.rstrip("\n")

    p, check = _run(pkg, site, state, "--check")
    assert p.returncode == 0, p.stderr[-4000:] + json.dumps(check.get("failures"), indent=1)
    assert check["check"] is True and check["succeeded"]
    assert sorted(check["hosts"]) == sorted(HOSTS)
    assert all(x["unreachable"] == 0 and x["failed"] == 0 and x["ok"] > 0 for x in check["hosts"].values()), check
    assert all(x["changed"] == 0 for x in check["hosts"].values()), json.dumps(check["hosts"], indent=1)
