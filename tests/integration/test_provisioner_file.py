"""provisioner.gpu.provisioner_file through ansible-playbook (connection local, files in a temporary directory): a
template and a content file are written once and then left alone, check mode reports drift (content and mode, with
the diff) without touching the file, a failing `validate` keeps the old file, the result names the resource;
`parent_mode` manages the file's directory in the same run. One sequence of six runs (a module-scoped fixture keeps
each run's outcome and the files as it left them); each test reads the runs that prove its part.
"""

from __future__ import annotations

import getpass
import grp
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from provisioner import PROJECT_ROOT

BIN = Path(sys.executable).parent

PLAY = textwrap.dedent("""\
    - name: provisioner_file
      hosts: local
      gather_facts: false
      vars:
        greeting: hello
      tasks:
        - name: A template
          provisioner.gpu.provisioner_file:
            src: "{{ playbook_dir }}/conf.j2"
            dest: "{{ root }}/conf"
            owner: "{{ me }}"
            group: "{{ grp }}"
            mode: "0640"
          register: tpl
        - name: A content file, checked by validate
          provisioner.gpu.provisioner_file:
            dest: "{{ root }}/plain"
            content: "{{ body | default('one\\n') }}"
            mode: "0644"
            validate: "{{ validator | default('/bin/true %s') }}"
          register: plain
        - name: A file with its directory
          provisioner.gpu.provisioner_file:
            dest: "{{ root }}/sub/inner"
            content: "x\\n"
            mode: "0600"
            parent_mode: "0750"
          register: inner
        - name: Results, kept by the tree callback (no module runs for them)
          ansible.builtin.debug:
            msg: "{{ {'tpl': tpl, 'plain': plain, 'inner': inner} }}"
    """)


def _play(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    tree = tmp_path / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    env.update(ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_PATH=str(PROJECT_ROOT / "collections"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_REMOTE_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"),
               ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.tree", ANSIBLE_CALLBACK_TREE_DIR=str(tree))
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"[local]\nalpha ansible_connection=local ansible_python_interpreter={sys.executable} "
                   f"root={tmp_path / 'files'} me={getpass.getuser()} grp={grp.getgrgid(os.getgid()).gr_name}\n")
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(tmp_path / "play.yml"), *args],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    res = json.loads((tree / "alpha").read_text()) if (tree / "alpha").is_file() else {}
    return r, (res.get("msg", {}) if r.returncode == 0 else {})


@dataclass
class Run:
    rc: int
    out: str
    res: dict[str, Any]
    files: dict[str, tuple[str, int] | None]  # name -> (text or "" for a directory, mode), None: absent
    left: list[str]  # temporary files left beside `plain`


def _files(root: Path) -> dict[str, tuple[str, int] | None]:
    def one(p: Path) -> tuple[str, int] | None:
        if not p.exists():
            return None
        return ("" if p.is_dir() else p.read_text(), p.stat().st_mode & 0o777)

    return {n: one(root / n) for n in ("conf", "plain", "sub", "sub/inner")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Run]]]:
    """check (nothing there yet) -> apply -> [conf edited and chmod 600, sub chmod 755] check -> apply -> apply again
    -> a content that its validate refuses."""
    tmp_path = tmp_path_factory.mktemp("pfile")
    root = tmp_path / "files"
    root.mkdir()
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "conf.j2").write_text("{% if true %}\nsay={{ greeting }}\n{% endif %}\n")
    out: dict[str, Run] = {}

    def run(name: str, *args: str) -> None:
        r, res = _play(tmp_path, *args)
        out[name] = Run(r.returncode, r.stdout, res, _files(root),
                        [p.name for p in root.iterdir() if p.name.startswith(".plain.")])

    run("check_fresh", "--check", "--diff")
    run("apply")
    (root / "conf").write_text("say=edited\n")
    (root / "conf").chmod(0o600)
    (root / "sub").chmod(0o755)
    run("check_drift", "--check", "--diff")
    run("fix")
    run("again")
    run("refused", "-e", "body=two", "-e", "validator='/bin/false %s'")
    yield root, out


def test_parent_directory_is_managed_in_the_same_run(runs: tuple[Path, dict[str, Run]]) -> None:
    root, runs_ = runs
    sub = str(root / "sub")
    r = runs_["check_fresh"]
    assert r.rc == 0, r.out[-3000:]
    assert r.files["sub"] is None  # check mode: not made
    assert r.res["inner"]["resources"] == [["file", sub], ["file", sub + "/inner"]]
    r = runs_["apply"]
    assert r.rc == 0 and r.files["sub/inner"] == ("x\n", 0o600) and r.files["sub"] == ("", 0o750), r.out[-3000:]
    r = runs_["check_drift"]  # sub was chmod 755
    assert r.res["inner"]["resources"] == [["file", sub]] and r.files["sub"] == ("", 0o755)
    assert r.res["inner"]["diff"][0]["after"] == {"mode": "0750"}
    assert runs_["fix"].files["sub"] == ("", 0o750)
    r = runs_["again"]
    assert r.rc == 0 and not r.res["inner"]["changed"] and r.res["inner"]["resources"] == []


def test_writes_once_reports_drift_and_keeps_a_file_validate_refuses(runs: tuple[Path, dict[str, Run]]) -> None:
    root, runs_ = runs
    conf = str(root / "conf")
    assert runs_["check_fresh"].files["conf"] is None  # check mode writes nothing
    r = runs_["apply"]
    assert r.rc == 0, r.out[-3000:]
    assert r.files["conf"] == ("say=hello\n", 0o640)  # trim_blocks, as ansible.builtin.template
    assert r.files["plain"] == ("one\n", 0o644)
    assert r.res["tpl"]["changed"] and r.res["tpl"]["resources"] == [["file", conf]]

    r = runs_["check_drift"]  # conf was edited and chmod 600
    assert r.rc == 0, r.out[-3000:]
    assert r.res["tpl"]["changed"] and r.files["conf"] == ("say=edited\n", 0o600)
    diffs = r.res["tpl"]["diff"]
    assert diffs[0]["before"] == "say=edited\n" and diffs[0]["after"] == "say=hello\n"
    assert diffs[1]["before"] == {"mode": "0600"} and diffs[1]["after"] == {"mode": "0640"}
    assert not r.res["plain"]["changed"]
    assert runs_["fix"].files["conf"] == ("say=hello\n", 0o640)

    r = runs_["again"]  # written once: a rerun leaves everything alone
    assert r.rc == 0 and not r.res["tpl"]["changed"] and not r.res["plain"]["changed"]
    assert r.res["tpl"]["resources"] == []

    r = runs_["refused"]
    assert r.rc != 0 and "failed to validate" in r.out
    assert r.files["plain"] == ("one\n", 0o644)
    assert r.left == []  # no temporary left
