"""The installed package provisions a rack: the wheel of this checkout in a fresh venv (tests/support/installed_wheel.py),
run from a directory that holds only a copy of the rack's generated inventory.

Rack PROVISIONER_PACKAGE_RACK (default `pkg`, 2 plain hosts; PROVISIONER_TESTBED_TEARDOWN=1 removes it at the end
when this session created it). site.yml without the vLLM area (`--skip-tags vllm`: no vLLM layer on a plain rack).
1. `provision run` converges both hosts (exit 0), with the playbooks, roles and ansible.cfg from the installed
   package, run directories and facts in PROVISION_STATE_DIR (nothing written into site-packages);
2. `provision run --check` on the converged rack connects, completes with exit 0 and changes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from installed_wheel import Installed, installed  # noqa: E402  (tests/support, on pytest's pythonpath)

pytestmark = pytest.mark.testbed

NODES = 2


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Installed, Path, Path, Any]]:
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root")
    from provisioner_testbed import rack

    pkg = installed(tmp_path_factory.mktemp("wheel"))
    name = os.environ.get("PROVISIONER_PACKAGE_RACK", "pkg")
    existed = rack.RackState.load(name) is not None
    h = rack.ensure(name, NODES, log=lambda m: print(f"testbed: {m}"))
    site = tmp_path_factory.mktemp("site")
    shutil.copytree(Path(h.inventory).parent, site / "inventory")  # hosts.ini + group_vars/, absolute key paths
    state = tmp_path_factory.mktemp("state")
    yield pkg, site, state, h
    if not existed and os.environ.get("PROVISIONER_TESTBED_TEARDOWN") == "1":
        rack.down(name)


def _run(pkg: Installed, site: Path, state: Path, *args: str) -> tuple[Any, dict[str, Any]]:
    p = pkg.provision("run", "inventory/hosts.ini", "--skip-tags", "vllm", "--json", *args, cwd=site,
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
    p, first = _run(pkg, site, state)
    assert p.returncode == 0, p.stderr[-4000:] + json.dumps(first.get("failures"), indent=1)
    assert first["succeeded"] and sorted(first["hosts"]) == sorted(h.hosts)
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
    assert sorted(check["hosts"]) == sorted(h.hosts)
    assert all(x["unreachable"] == 0 and x["failed"] == 0 and x["ok"] > 0 for x in check["hosts"].values()), check
    assert all(x["changed"] == 0 for x in check["hosts"].values()), json.dumps(check["hosts"], indent=1)
