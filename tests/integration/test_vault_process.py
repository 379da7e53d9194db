"""Vaulted values through the real CLI (issue 43, class 1): `run` (real ansible-runner on a local-connection host)
gets the secret into the play from every place ansible-playbook reads a vault password (--vault-password-file,
ANSIBLE_VAULT_PASSWORD_FILE, ansible.cfg), with `-e @FILE` whole-file vaults and `!vault` values, and the secret is
in no argv, env file or artifact of the run; `render`, `plan` and `validate` work with and without the password;
the commands that need a secret say so in one line (exit 2) without it. No root, no network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SECRET = "sk-vaulted-8e1f-do-not-leak"
OTHER = "sk-from-extra-vars-77aa"
PW = "integration-vault-pw-31"
PROVISION = [sys.executable, "-m", "provisioner.cli"]

PLAYBOOK = """
- name: Write what the play sees
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Record the key and the marker
      ansible.builtin.copy:
        dest: "{{ out }}/{{ inventory_hostname }}.txt"
        content: "{{ vllm_api_key }} {{ marker | default('none') }}\\n"
        mode: "0600"
      no_log: true
"""


def _encrypt(text: str) -> str:
    from ansible.parsing.vault import VaultLib, VaultSecret

    return VaultLib([("default", VaultSecret(PW.encode()))]).encrypt(text).decode()


def _tagged(name: str, value: str) -> str:
    return f"{name}: !vault |\n" + "".join(f"  {ln}\n" for ln in _encrypt(value).splitlines())


@pytest.fixture()
def site(tmp_path: Path) -> dict[str, Path]:
    out = tmp_path / "out"
    out.mkdir()
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.ini").write_text("[gpu_nodes]\nalpha ansible_connection=local\n")
    (inv / "group_vars" / "gpu_nodes.yml").write_text(
        f"ansible_python_interpreter: {sys.executable}\nout: {out}\ngpu_model: H100-SXM5-80GB\ngpu_count: 8\n"
        "fabric: ethernet\nbootstrap_interface: eth0\n" + _tagged("vllm_api_key", SECRET))
    pb = tmp_path / "site.yml"
    pb.write_text(PLAYBOOK)
    pw = tmp_path / "vault-pass"
    pw.write_text(PW + "\n")
    pw.chmod(0o600)
    return {"inv": inv / "hosts.ini", "pb": pb, "out": out, "runs": tmp_path / "runs", "tmp": tmp_path, "pw": pw}


def cli(site: dict[str, Path], *args: str, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_VAULT", "ANSIBLE_CONFIG"))}
    e = dict(base, PROVISION_RUNS_DIR=str(site["runs"]), COLUMNS="300",
             ANSIBLE_CACHE_PLUGIN_CONNECTION=str(site["tmp"] / "facts"), **(env or {}))
    p = subprocess.run([*PROVISION, *args], capture_output=True, text=True, env=e, timeout=600,
                       cwd=cwd or site["tmp"])
    assert "Traceback" not in p.stderr, p.stderr
    return p


def run(site: dict[str, Path], *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return cli(site, "run", str(site["inv"]), "--playbook", str(site["pb"]), "--skip-preflight", *args, **kw)


def _no_secret_in_runs(site: dict[str, Path], *secrets: str) -> None:
    hits = [str(f) for f in site["runs"].rglob("*") if f.is_file()
            for s in (*secrets, PW) if s.encode() in f.read_bytes()]
    assert hits == []


def test_run_gets_the_secret_from_each_source_and_leaves_it_nowhere(site: dict[str, Path]) -> None:
    # 1. --vault-password-file
    p = run(site, "--vault-password-file", str(site["pw"]))
    assert p.returncode == 0, p.stdout + p.stderr
    assert (site["out"] / "alpha.txt").read_text() == f"{SECRET} none\n"
    assert "host states not recorded" not in p.stderr, p.stderr  # the input digest was computed
    # 2. ANSIBLE_VAULT_PASSWORD_FILE
    (site["out"] / "alpha.txt").unlink()
    p = run(site, env={"ANSIBLE_VAULT_PASSWORD_FILE": str(site["pw"])})
    assert p.returncode == 0, p.stdout + p.stderr
    assert (site["out"] / "alpha.txt").read_text() == f"{SECRET} none\n"
    # 3. ansible.cfg's vault_password_file (a site's own config, in the working directory): ansible-playbook runs
    #    with the suite's ansible.cfg, so the CLI hands the file on
    (site["out"] / "alpha.txt").unlink()
    cfg = site["tmp"] / "site-cfg"
    cfg.mkdir()
    (cfg / "ansible.cfg").write_text(f"[defaults]\nvault_password_file = {site['pw']}\n")
    p = run(site, cwd=cfg)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (site["out"] / "alpha.txt").read_text() == f"{SECRET} none\n"
    _no_secret_in_runs(site, SECRET)
    # what ansible-playbook was given: a path, never the password
    cmds = [json.loads(f.read_text()) for f in site["runs"].rglob("artifacts/ansible/command")]
    assert cmds and all(PW not in json.dumps(c) for c in cmds)
    assert any(str(site["pw"]) in json.dumps(c["env"]) for c in cmds)


def test_extra_vars_files_whole_vault_and_tagged_reach_the_play_not_argv(site: dict[str, Path]) -> None:
    whole = site["tmp"] / "whole.yml"
    whole.write_text(_encrypt(f"vllm_api_key: {OTHER}\nmarker: whole-file\n"))
    tagged = site["tmp"] / "tagged.yml"
    tagged.write_text(_tagged("vllm_api_key", OTHER + "-t") + "marker: tagged\n")
    p = run(site, "--vault-password-file", str(site["pw"]), "-e", f"@{whole}")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (site["out"] / "alpha.txt").read_text() == f"{OTHER} whole-file\n"
    # a later -e wins, as in ansible-playbook: the marker from the command line, the key from the tagged file
    p = run(site, "--vault-password-file", str(site["pw"]), "-e", "marker=cli", "-e", f"@{tagged}",
            "-e", "marker=last")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (site["out"] / "alpha.txt").read_text() == f"{OTHER}-t last\n"
    _no_secret_in_runs(site, SECRET, OTHER)
    # without the password the vaulted file is one line, exit 2, and nothing ran
    (site["out"] / "alpha.txt").unlink()
    p = run(site, "-e", f"@{whole}")
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0, p.stderr
    assert "the file is vaulted and no vault password is given" in p.stderr
    assert not (site["out"] / "alpha.txt").exists()


def test_without_a_password_the_commands_that_need_it_say_so_the_others_work(site: dict[str, Path]) -> None:
    inv = str(site["inv"])
    for args in (["run", inv, "--playbook", str(site["pb"]), "--skip-preflight"], ["drift", inv],
                 ["drift", inv, "--report", "json"]):
        p = cli(site, *args)
        assert p.returncode == 2, p.stdout + p.stderr
        assert p.stderr.strip().count("\n") == 0, p.stderr
        assert "vllm_api_key on host alpha is vaulted and no vault password given" in p.stderr, p.stderr
        assert SECRET not in p.stderr + p.stdout
    assert not (site["out"] / "alpha.txt").exists()
    # a wrong password: one line too
    bad = site["tmp"] / "bad-pass"
    bad.write_text("wrong\n")
    p = cli(site, "drift", inv, "--vault-password-file", str(bad))
    assert p.returncode == 2 and "vllm_api_key on host alpha is vaulted and" in p.stderr, p.stderr
    # validate checks the vaulted value without decrypting it; render redacts it; plan does not need it
    for env in ({}, {"ANSIBLE_VAULT_PASSWORD_FILE": str(site["pw"])}):
        v = cli(site, "validate", inv, env=env)
        assert v.returncode == 0 and "valid" in v.stdout, v.stdout + v.stderr
        r = cli(site, "render", inv, "--host", "alpha", env=env)
        assert r.returncode == 0 and "/etc/nccl.conf" in r.stdout, r.stdout + r.stderr
        pl = cli(site, "plan", inv, "--format", "json", env=env)
        assert pl.returncode == 0, pl.stdout + pl.stderr
        assert SECRET not in v.stdout + r.stdout + pl.stdout + v.stderr + r.stderr + pl.stderr


def test_render_plan_and_validate_on_a_vaulted_cluster_inventory(tmp_path: Path) -> None:
    """The repository's rack A with its API key vaulted in group_vars and a vaulted -e file: render shows the env
    file with the key redacted, plan and validate read it, with or without the password."""
    import shutil

    from provisioner import PROJECT_ROOT

    inv = tmp_path / "rack"
    shutil.copytree(PROJECT_ROOT / "inventories", inv, ignore=shutil.ignore_patterns("testbed*"))
    with (inv / "group_vars" / "gpu_nodes.yml").open("a") as f:
        f.write(_tagged("vllm_api_key", SECRET))
    pw = tmp_path / "pw"
    pw.write_text(PW + "\n")
    extra = tmp_path / "extra.yml"
    extra.write_text(_encrypt("vllm_health_timeout: 901\n"))
    site = {"runs": tmp_path / "runs", "tmp": tmp_path}
    ini = str(inv / "rack-a.ini")
    for env in ({}, {"ANSIBLE_VAULT_PASSWORD_FILE": str(pw)}):
        r = cli(site, "render", ini, "--host", "node01", env=env)
        assert r.returncode == 0 and 'VLLM_API_KEY="<redacted>"' in r.stdout, r.stdout + r.stderr
        v = cli(site, "validate", ini, env=env)
        assert v.returncode == 0, v.stdout + v.stderr
        assert SECRET not in r.stdout + v.stdout
    p = cli(site, "plan", ini, "-e", f"@{extra}", "--format", "json", env={"ANSIBLE_VAULT_PASSWORD_FILE": str(pw)})
    assert p.returncode == 0, p.stdout + p.stderr
    assert SECRET not in p.stdout
    p = cli(site, "plan", ini, "-e", f"@{extra}")
    assert p.returncode == 2 and "the file is vaulted and no vault password is given" in p.stderr, p.stderr
    # upgrade needs the key (its gates talk to the clusters): one line without the password, before any host
    u = cli(site, "upgrade", ini)
    assert u.returncode == 2 and u.stderr.strip().count("\n") == 0, u.stderr
    assert "vllm_api_key on host node01 is vaulted and no vault password given: provision upgrade" in u.stderr
