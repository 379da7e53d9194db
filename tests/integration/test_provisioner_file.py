"""provisioner.gpu.provisioner_file through ansible-playbook (connection local, files in a temporary directory): a
template and a content file are written once and then left alone, check mode reports drift (content and mode, with
the diff) without touching the file, a failing `validate` keeps the old file, the result names the resource;
`parent_mode` manages the file's directory in the same run.
"""

from __future__ import annotations

import getpass
import grp
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

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
        - name: Results
          ansible.builtin.copy:
            dest: "{{ root }}/results.json"
            content: "{{ {'tpl': tpl, 'plain': plain, 'inner': inner} | to_json }}"
            mode: "0644"
          check_mode: false
          diff: false
    """)


def _play(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_PATH=str(PROJECT_ROOT / "collections"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_REMOTE_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"[local]\nalpha ansible_connection=local ansible_python_interpreter={sys.executable} "
                   f"root={tmp_path / 'files'} me={getpass.getuser()} grp={grp.getgrgid(os.getgid()).gr_name}\n")
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(tmp_path / "play.yml"), *args],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    res = tmp_path / "files" / "results.json"
    return r, (json.loads(res.read_text()) if res.is_file() else {})


def test_parent_directory_is_managed_in_the_same_run(tmp_path: Path) -> None:
    (tmp_path / "files").mkdir()
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "conf.j2").write_text("a\n")
    sub = tmp_path / "files" / "sub"
    r, res = _play(tmp_path, "--check", "--diff")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert not sub.exists()
    assert res["inner"]["resources"] == [["file", str(sub)], ["file", str(sub / "inner")]]
    r, res = _play(tmp_path)
    assert r.returncode == 0 and (sub / "inner").read_text() == "x\n", r.stdout[-3000:]
    assert sub.stat().st_mode & 0o777 == 0o750 and (sub / "inner").stat().st_mode & 0o777 == 0o600
    sub.chmod(0o755)
    r, res = _play(tmp_path, "--check", "--diff")
    assert res["inner"]["resources"] == [["file", str(sub)]] and sub.stat().st_mode & 0o777 == 0o755
    assert res["inner"]["diff"][0]["after"] == {"mode": "0750"}
    r, res = _play(tmp_path)
    assert sub.stat().st_mode & 0o777 == 0o750
    r, res = _play(tmp_path)
    assert r.returncode == 0 and not res["inner"]["changed"] and res["inner"]["resources"] == []


def test_writes_once_reports_drift_and_keeps_a_file_validate_refuses(tmp_path: Path) -> None:
    (tmp_path / "files").mkdir()
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "conf.j2").write_text("{% if true %}\nsay={{ greeting }}\n{% endif %}\n")
    conf, plain = tmp_path / "files" / "conf", tmp_path / "files" / "plain"

    r, res = _play(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert conf.read_text() == "say=hello\n"  # trim_blocks, as ansible.builtin.template
    assert conf.stat().st_mode & 0o777 == 0o640 and plain.read_text() == "one\n"
    assert res["tpl"]["changed"] and res["tpl"]["resources"] == [["file", str(conf)]]

    r, res = _play(tmp_path)
    assert r.returncode == 0 and not res["tpl"]["changed"] and not res["plain"]["changed"]
    assert res["tpl"]["resources"] == []

    conf.write_text("say=edited\n")
    conf.chmod(0o600)
    r, res = _play(tmp_path, "--check", "--diff")
    assert r.returncode == 0, r.stdout[-3000:]
    assert res["tpl"]["changed"] and conf.read_text() == "say=edited\n" and conf.stat().st_mode & 0o777 == 0o600
    diffs = res["tpl"]["diff"]
    assert diffs[0]["before"] == "say=edited\n" and diffs[0]["after"] == "say=hello\n"
    assert diffs[1]["before"] == {"mode": "0600"} and diffs[1]["after"] == {"mode": "0640"}
    assert not res["plain"]["changed"]

    r, res = _play(tmp_path, "-e", "body=two", "-e", "validator='/bin/false %s'")
    assert r.returncode != 0 and "failed to validate" in r.stdout
    assert plain.read_text() == "one\n"
    assert [p.name for p in plain.parent.iterdir() if p.name.startswith(".plain.")] == []  # no temporary left
