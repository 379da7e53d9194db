"""Secrets at rest (issue 43, class 5): `--api-key`/`--hf-token` in a cluster's extra_args is refused (FLAG004, the
key would sit in the 0644 unit, `ps` and `provision plan`), never echoed; a run's command artifact keeps the
ANSIBLE_* variables that explain the run but not ANSIBLE_BECOME_PASS and its kin. (That the run directory keeps no
`env/` inputs: tests/integration/test_runner_local.py, which runs ansible-runner.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_inproc import provision
from inventory_factory import cluster, write_inventory

KEY = "sk-live-4fe1c0ffee"


@pytest.mark.parametrize("extra", [["--api-key", KEY], [f"--api-key={KEY}"], [f"--api_key={KEY}"],
                                   [f"--api-key {KEY}"], ["--api-ke", KEY], [f"--hf-token={KEY}"]])
def test_a_key_in_extra_args_is_refused_and_never_shown(tmp_path: Path, extra: list[str]) -> None:
    inv = write_inventory(tmp_path / "inv", group_vars=cluster(extra_args=extra))
    r = provision("validate", str(inv), "--format", "json")
    assert r.returncode == 1, r.stdout + r.stderr
    codes = [f["code"] for f in json.loads(r.stdout)["errors"]]
    assert codes == ["FLAG004"], codes
    want = "vllm_hf_token" if "hf" in extra[0] else "vllm_api_key"
    assert want in r.stdout and KEY not in r.stdout + r.stderr
    for args in (["plan", str(inv)], ["render", str(inv), "--host", "n1"], ["validate", str(inv)]):
        p = provision(*args)
        assert p.returncode == 1 and KEY not in p.stdout + p.stderr, (args, p.stdout, p.stderr)


def test_other_api_flags_pass(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path / "inv", group_vars=cluster(extra_args=["--api-server-count=2"]))
    r = provision("validate", str(inv), "--format", "json")
    assert "FLAG004" not in r.stdout


def test_the_command_artifact_keeps_no_secret_of_the_ansible_family(tmp_path: Path) -> None:
    from provisioner.runner import scrub_command_artifact

    env = {"ANSIBLE_BECOME_PASS": "b", "ANSIBLE_BECOME_PASSWORD": "b", "ANSIBLE_SSH_PASSWORD": "p",
           "ANSIBLE_VAULT_PASSWORD_FILE": "/etc/vault-pass", "ANSIBLE_PRIVATE_KEY_FILE": "/k/id", "ANSIBLE_CONFIG": "c",
           "ANSIBLE_HOST_KEY_CHECKING": "True", "AWX_SECRET_TOKEN": "t", "PATH": "/bin", "VLLM_API_KEY": "k"}
    (tmp_path / "command").write_text(json.dumps({"command": ["ansible-playbook"], "env": env}))
    scrub_command_artifact(tmp_path)
    data = json.loads((tmp_path / "command").read_text())
    assert sorted(data["env"]) == ["ANSIBLE_CONFIG", "ANSIBLE_HOST_KEY_CHECKING", "ANSIBLE_PRIVATE_KEY_FILE",
                                   "ANSIBLE_VAULT_PASSWORD_FILE", "PATH"]
    assert "ANSIBLE_BECOME_PASS" in data["env_scrubbed"]
