"""The repository is the Ansible collection provisioner.gpu (galaxy.yml at the root, roles/ and playbooks/ in place).

- `ansible-galaxy collection build` packs roles, playbooks, plugins and metadata, and none of the Python package,
  the tests or the local state.
- Installed into a clean collections path, it is used by FQCN from a playbook outside the repository, with a minimal
  ansible.cfg and the repository's roles NOT on roles_path: a real role run (nccl_tuning, connection local, into a
  temporary directory), the collection's filters and its module (check mode), and its playbooks' syntax.
- The execution environment definition gives `ansible-builder create` a build context that installs the provisioner
  wheel and the collection tarball (building the image needs a registry: not done here).
- The checkout is its own collection (collections/ansible_collections/provisioner/gpu -> the root, ansible.cfg).
"""

from __future__ import annotations

import getpass
import grp
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml

from provisioner import PROJECT_ROOT

REPO = PROJECT_ROOT
BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
FILTERS = ["provisioner_addresses.py", "provisioner_vllm.py", "provisioner_vllm_gate.py"]


def _env(**extra: str) -> dict[str, str]:
    """The environment without any ANSIBLE_* setting of the caller (nothing of the checkout leaks in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", ANSIBLE_NOCOLOR="1", **extra)
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert REPO not in [cwd.resolve(), *cwd.resolve().parents], f"{cwd} is inside the repository"
    return subprocess.run(cmd, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("collection-build")
    r = _run([str(BIN / "ansible-galaxy"), "collection", "build", str(REPO), "--output-path", str(out)], cwd=out)
    assert r.returncode == 0, r.stdout + r.stderr
    path = out / f"provisioner-gpu-{VERSION}.tar.gz"
    assert path.is_file(), sorted(p.name for p in out.iterdir())
    return path


@pytest.fixture(scope="module")
def collections(tarball: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean collections path with only the built collection installed."""
    dest = tmp_path_factory.mktemp("collections")
    r = _run([str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(dest)], cwd=dest)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (dest / "ansible_collections/provisioner/gpu/MANIFEST.json").is_file()
    return dest


def test_metadata_names_the_collection_and_the_package_version() -> None:
    assert (GALAXY["namespace"], GALAXY["name"]) == ("provisioner", "gpu")
    assert GALAXY["version"] == VERSION, "galaxy.yml and pyproject.toml disagree on the version"
    assert GALAXY["license"] == ["Apache-2.0"]
    runtime = yaml.safe_load((REPO / "meta/runtime.yml").read_text())
    assert runtime["requires_ansible"] == ">=2.20,<2.22"
    # the EE files name the built files by version
    assert f"provisioner-{VERSION}-py3-none-any.whl" in (REPO / "requirements.txt").read_text()
    assert f"provisioner-gpu-{VERSION}.tar.gz" in (REPO / "requirements.yml").read_text()


def test_the_checkout_is_its_own_collection() -> None:
    link = REPO / "collections/ansible_collections/provisioner/gpu"
    assert link.is_symlink() and os.readlink(link) == "../../..", "a relative link, so every clone has it"
    assert link.resolve() == REPO.resolve()
    r = _run([str(BIN / "ansible-galaxy"), "collection", "list", "provisioner.gpu", "--format", "json"],
             cwd=Path("/"), env=_env(ANSIBLE_CONFIG=str(REPO / "ansible.cfg")))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "provisioner.gpu" in json.dumps(json.loads(r.stdout)), r.stdout


def test_tarball_carries_the_collection_and_nothing_else(tarball: Path) -> None:
    with tarfile.open(tarball) as tar:
        members = {m.name: m for m in tar.getmembers()}
        manifest = json.load(tar.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
    names = set(members)
    info = manifest["collection_info"]
    assert (info["namespace"], info["name"], info["version"]) == ("provisioner", "gpu", VERSION)
    assert {"MANIFEST.json", "FILES.json", "meta/runtime.yml", "README.md", "playbooks/site.yml",
            "plugins/modules/provisioner_apt.py", "plugins/action/provisioner_plan.py", "templates/nccl.conf.j2"} <= names
    assert {f"plugins/filter/{f}" for f in FILTERS} <= names
    roles = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks/main.yml").is_file())
    assert len(roles) >= 12
    missing = [r for r in roles if f"roles/{r}/tasks/main.yml" not in names]
    assert not missing, missing
    # the Python package is a dependency, not content: only the node parser the node_health role ships (its
    # files/nodeparse.py links to it, and stays a link inside the collection)
    assert sorted(n for n in names if n.startswith("provisioner/")) == [
        "provisioner/probes", "provisioner/probes/burninjudge.py", "provisioner/probes/generate.py",
        "provisioner/probes/nodeparse.py"]
    link = members["roles/node_health/files/nodeparse.py"]
    assert link.issym() and link.linkname == "../../../provisioner/probes/nodeparse.py"
    judge = members["roles/node_burnin/files/burninjudge.py"]  # node_burnin ships the burn-in judge too
    assert judge.issym() and judge.linkname == "../../../provisioner/probes/burninjudge.py"
    for m in members.values():  # every link resolves inside the tarball (ansible-galaxy install refuses one that
        if m.issym():           # does not: "linkname ... not found")
            target = posixpath.normpath(posixpath.join(posixpath.dirname(m.name), m.linkname))
            assert target in names, f"{m.name} -> {m.linkname}: not in the collection"
    for bad in ("tests/", "benchmarks/", ".venv", ".git", ".runs", ".cache", "collections/", "dist/", "context/",
                "inventories/testbed", "provisioner_testbed", "hatch_build.py", "pyproject.toml", "execution-environment.yml"):
        assert not [n for n in names if n.startswith(bad)], bad
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


NCCL_INVENTORY = textwrap.dedent("""\
    all:
      children:
        gpu_nodes:
          hosts:
            node01:
              ansible_connection: local
              node_rank: 0
          vars:
            gpu_model: H100-SXM5-80GB
            gpu_count: 8
            fabric: infiniband
            ib_hcas: [mlx5_0:1, mlx5_1:1]
            bootstrap_interface: ens10f0np0
    """)

OUTSIDE_PLAYBOOK = textwrap.dedent("""\
    ---
    - name: The installed collection, by FQCN
      hosts: gpu_nodes
      gather_facts: false
      vars:
        out: "{{ lookup('env', 'OUT') }}"
      roles:
        - role: provisioner.gpu.provisioner_plan
        - role: provisioner.gpu.nccl_tuning
          vars:
            nccl_tuning_conf_path: "{{ out }}/nccl.conf"
            nccl_tuning_conf_owner: "{{ lookup('env', 'ME') }}"
            nccl_tuning_conf_group: "{{ lookup('env', 'GRP') }}"
      tasks:
        - name: The collection's plan action (the provisioner package computes it) and a filter
          ansible.builtin.copy:
            dest: "{{ out }}/filters.json"
            content: >-
              {{ {'fleet': provisioner_plan.targets,
                  'gate': hostvars | provisioner.gpu.provisioner_vllm_gate_hosts(ansible_play_hosts)} | to_json }}
            mode: "0644"
        - name: The collection's module, check mode (dpkg-query only)
          provisioner.gpu.provisioner_apt:
            packages: [dpkg]
          check_mode: true
          register: apt_probe
        - name: It found nothing to do
          ansible.builtin.assert:
            that: [apt_probe is not changed]
    """)


def test_installed_collection_runs_from_outside_the_repository(collections: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "no-roles").mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    cfg = site / "ansible.cfg"
    cfg.write_text(f"[defaults]\ncollections_path = {collections}\nroles_path = {site / 'no-roles'}\n"
                   "host_key_checking = True\nretry_files_enabled = False\n")
    (site / "hosts.yml").write_text(NCCL_INVENTORY)
    (site / "play.yml").write_text(OUTSIDE_PLAYBOOK)
    env = _env(ANSIBLE_CONFIG=str(cfg), ANSIBLE_COLLECTIONS_PATH=str(collections),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_REMOTE_TEMP=str(tmp_path / "tmp"), OUT=str(out), ME=getpass.getuser(),
               GRP=grp.getgrgid(os.getgid()).gr_name)
    pb = str(BIN / "ansible-playbook")

    r = _run([pb, "-i", "hosts.yml", "play.yml"], cwd=site, env=env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    from provisioner.inventory import load_fleet
    from provisioner.render import host_variables, render_template

    want = render_template("nccl.conf.j2", host_variables(load_fleet(site / "hosts.yml"), "node01"))
    assert (out / "nccl.conf").read_text() == want
    filters = json.loads((out / "filters.json").read_text())
    assert [n["host"] for n in filters["fleet"]["gpu_nodes"]] == ["node01"] and filters["gate"] == []

    # the role came from the installed collection: by its short name it is found nowhere here
    (site / "short.yml").write_text(OUTSIDE_PLAYBOOK.replace("provisioner.gpu.nccl_tuning", "nccl_tuning"))
    s = _run([pb, "-i", "hosts.yml", "short.yml", "--syntax-check"], cwd=site, env=env)
    assert s.returncode != 0 and "nccl_tuning" in s.stdout + s.stderr, s.stdout + s.stderr

    # the collection's own playbooks (roles by short name inside their collection) resolve
    for play in ("site", "health"):
        c = _run([pb, "-i", "hosts.yml", f"provisioner.gpu.{play}", "--syntax-check"], cwd=site, env=env)
        assert c.returncode == 0, (play, c.stdout[-3000:] + c.stderr[-2000:])


def test_execution_environment_build_context(tarball: Path, tmp_path: Path) -> None:
    """`ansible-builder create` on the repository's definition (copied, with a dist/ holding the built collection:
    the wheel's presence is the image build's business) writes a context that installs both."""
    builder = BIN / "ansible-builder"
    if not builder.exists():
        pytest.fail(f"ansible-builder is not installed in {BIN}: run `make venv` (the test extra installs it)")
    work = tmp_path / "ee"
    (work / "dist").mkdir(parents=True)
    for name in ("execution-environment.yml", "requirements.txt", "requirements.yml", "bindep.txt"):
        shutil.copy(REPO / name, work / name)
    shutil.copy(tarball, work / "dist")
    r = _run([str(builder), "create", "-f", "execution-environment.yml", "-c", "context", "--output-filename",
              "Containerfile"], cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    ctx = work / "context"
    containerfile = (ctx / "Containerfile").read_text()
    assert "ansible-galaxy collection install" in containerfile and "-r requirements.yml" in containerfile
    assert "COPY _build/dist/ /tmp/provisioner-dist/" in containerfile
    assert "ansible-core>=2.20,<2.22" in containerfile and "ansible-runner" in containerfile
    assert (ctx / "_build/dist" / tarball.name).is_file()
    reqs = (ctx / "_build/requirements.txt").read_text()
    assert f"provisioner @ file:///tmp/provisioner-dist/provisioner-{VERSION}-py3-none-any.whl" in reqs
    galaxy = yaml.safe_load((ctx / "_build/requirements.yml").read_text())
    assert galaxy["collections"] == [{"name": f"/tmp/provisioner-dist/{tarball.name}", "type": "file"}]
    assert "openssh-clients" in (ctx / "_build/bindep.txt").read_text()


def test_plugins_never_edit_sys_path() -> None:
    """The plugins import the installed `provisioner` package (pip); no path games (shared/design.md)."""
    offenders = [str(p.relative_to(REPO)) for p in sorted((REPO / "plugins").rglob("*.py"))
                 if "sys.path" in p.read_text()]
    assert not offenders, offenders
