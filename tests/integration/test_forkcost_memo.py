"""The compiled-template memo (provisioner/runner/forkcost.py) changes nothing a run renders: the same playbook run
with it and without it (`PROVISION_FORKCOST_MEMO=0`) writes the same bytes, on local-connection hosts (no root, no
network). The playbook has what the memo must keep apart: per-host values, conditionals, loops, role defaults, and
two roles whose templates include a file of the same name with different content."""

from __future__ import annotations

import sys
from pathlib import Path

from provisioner.runner import run_playbook

ROLE_TASKS = """
- name: Render the role's template (warmed in the main process)
  provisioner.gpu.provisioner_file:
    src: main.j2
    dest: "{{ root }}/{{ inventory_hostname }}/{{ role_name }}.conf"
    mode: "0644"
- name: Render it as ansible.builtin.template does
  ansible.builtin.template:
    src: main.j2
    dest: "{{ root }}/{{ inventory_hostname }}/{{ role_name }}.builtin"
    mode: "0644"
- name: A template without include, same name in both roles
  provisioner.gpu.provisioner_file:
    src: plain.j2
    dest: "{{ root }}/{{ inventory_hostname }}/{{ role_name }}.plain"
    mode: "0644"
- name: Only where asked
  ansible.builtin.copy:
    dest: "{{ root }}/{{ inventory_hostname }}/{{ role_name }}-{{ item }}"
    content: "{{ greeting }} {{ item }} from {{ inventory_hostname }}\\n"
    mode: "0644"
  loop: "{{ extras }}"
  when: inventory_hostname in wanted
"""

PLAYBOOK = """
- name: Memo check
  hosts: all
  gather_facts: false
  roles: [red, blue]
"""


def _site(tmp: Path) -> dict[str, Path]:
    root = tmp / "hosts"
    for h in ("alpha", "beta"):
        (root / h).mkdir(parents=True)
    for role in ("red", "blue"):
        base = tmp / "roles" / role
        for d in ("tasks", "defaults", "templates"):
            (base / d).mkdir(parents=True)
        (base / "tasks" / "main.yml").write_text(ROLE_TASKS)
        greeting = f"\"{{{{ 'hello' if colour == '{role}' else 'hi' }}}}\""
        (base / "defaults" / "main.yml").write_text(f"greeting: {greeting}\nextras: [one, two]\nwanted: [alpha]\n")
        main = "{{ inventory_hostname }} {{ greeting }}\n{% include 'part.j2' %}\n"
        (base / "templates" / "main.j2").write_text(main)
        (base / "templates" / "plain.j2").write_text(f"{role}: {{{{ colour }}}}\n")
        (base / "templates" / "part.j2").write_text(f"{role} part for {{{{ colour }}}}\n")
    (tmp / "site.yml").write_text(PLAYBOOK)
    inv = tmp / "hosts.ini"
    inv.write_text("alpha ansible_connection=local colour=red\nbeta ansible_connection=local colour=blue\n"
                   f"[all:vars]\nansible_python_interpreter={sys.executable}\nroot={root}\n")
    return {"root": root, "inv": inv, "pb": tmp / "site.yml"}


def _render(tmp: Path, memo: str) -> dict[str, str]:
    site = _site(tmp)
    r = run_playbook(site["inv"], playbook=site["pb"], runs_dir=tmp / "runs",
                     envvars={"PROVISION_FORKCOST_MEMO": memo, "ANSIBLE_ROLES_PATH": str(tmp / "roles"),
                              "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp / "facts")})
    assert r.succeeded, r.to_dict()
    return {str(p.relative_to(site["root"])): p.read_text() for p in sorted(site["root"].rglob("*")) if p.is_file()}


def test_memo_renders_the_same_bytes_as_ansible_alone(tmp_path: Path) -> None:
    with_memo = _render(tmp_path / "memo", "1")
    without = _render(tmp_path / "plain", "0")
    assert with_memo == without
    assert with_memo["alpha/red.conf"] == "alpha hello\nred part for red\n"
    assert with_memo["alpha/blue.conf"] == "alpha hi\nblue part for red\n"  # blue's part.j2, not red's
    assert with_memo["beta/blue.conf"] == "beta hello\nblue part for blue\n"
    assert with_memo["alpha/red-two"] == "hello two from alpha\n"
    assert not any(name.startswith("beta/red-") for name in with_memo)  # the conditional, per host
    assert with_memo["alpha/red.builtin"] == with_memo["alpha/red.conf"]
    assert (with_memo["alpha/red.plain"], with_memo["beta/blue.plain"]) == ("red: red\n", "blue: blue\n")

