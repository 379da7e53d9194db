"""The vault secrets every command loads (provisioner.vault): from a password file, ansible.cfg's settings and the
environment, never a prompt; one line naming host and variable when a needed value cannot be decrypted; -e @FILE
with a whole-file vault or `!vault` values; what ansible-playbook is handed (paths only); and the two-tier drift's
input digest, keyed so that it moves with a secret without letting anyone test guesses of it."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner import vault
from provisioner.drift import state as hoststate
from provisioner.errors import UsageError
from provisioner.inventory import load_fleet
from tests.support.inventory_factory import write_inventory

KEY = "sk-vaulted-api-key-0123"
PW = "vault-pw-for-tests"


def _vault_yaml(name: str, plaintext: str, password: str = PW) -> str:
    from ansible.parsing.vault import VaultLib, VaultSecret

    text = VaultLib([("default", VaultSecret(password.encode()))]).encrypt(plaintext).decode()
    return f"{name}: !vault |\n" + "".join(f"  {line}\n" for line in text.splitlines())


@pytest.fixture(autouse=True)
def fresh_vault(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from ansible import constants as C

    vault._reset_for_tests()
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    monkeypatch.setattr(C, "DEFAULT_VAULT_PASSWORD_FILE", None, raising=False)
    monkeypatch.setattr(C, "DEFAULT_VAULT_IDENTITY_LIST", [], raising=False)
    yield
    vault._reset_for_tests()


def _pw(tmp_path: Path, text: str = PW) -> Path:
    p = tmp_path / "vault-pass"
    p.write_text(text + "\n")
    p.chmod(0o600)
    return p


def _inv(tmp_path: Path, key: str = KEY, password: str = PW) -> Path:
    return write_inventory(tmp_path / "inv", files={"group_vars/gpu_nodes/vault.yml": _vault_yaml(
        "vllm_api_key", key, password)})


def test_a_password_file_decrypts_the_inventorys_vaulted_values(tmp_path: Path) -> None:
    fleet = load_fleet(_inv(tmp_path), vault_password_file=_pw(tmp_path))
    value = fleet.hosts["n1"].vars["vllm_api_key"]
    assert vault.is_vaulted(value) and str(value) == KEY
    vault.require(fleet, ["n1", "n2"])  # no error


def test_without_a_password_loading_works_and_require_is_one_line(tmp_path: Path) -> None:
    fleet = load_fleet(_inv(tmp_path))  # loading never decrypts
    assert not vault.active()
    with pytest.raises(UsageError) as exc:
        vault.require(fleet, ["n1"], what="provision drift")
    msg = str(exc.value)
    assert "\n" not in msg and KEY not in msg
    assert "vllm_api_key on host n1 is vaulted and no vault password given" in msg
    assert "provision drift needs it" in msg and "--vault-password-file" in msg


def test_a_wrong_password_is_named_not_shown(tmp_path: Path) -> None:
    fleet = load_fleet(_inv(tmp_path), vault_password_file=_pw(tmp_path, "not-the-password"))
    with pytest.raises(UsageError) as exc:
        vault.require(fleet, ["n2"])
    assert "vllm_api_key on host n2 is vaulted and none of the vault passwords given decrypts it" in str(exc.value)
    assert KEY not in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_missing_password_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="vault password file not found"):
        vault.setup(tmp_path / "nope")


def test_ansible_cfg_settings_are_read_and_prompts_are_never_used(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from ansible import constants as C

    pw = _pw(tmp_path)
    # vault_identity_list = prod@prompt, dev@FILE ; vault_password_file = FILE (as ansible.cfg or the env set them)
    monkeypatch.setattr(C, "DEFAULT_VAULT_IDENTITY_LIST", ["prod@prompt", f"dev@{pw}"])
    monkeypatch.setattr(C, "DEFAULT_VAULT_PASSWORD_FILE", str(pw))
    slugs, cfg_file = vault.configured()
    assert slugs == [f"dev@{pw}"] and cfg_file == str(pw)
    fleet = load_fleet(_inv(tmp_path))
    assert vault.active() and str(fleet.hosts["n1"].vars["vllm_api_key"]) == KEY
    env = vault.runner_env()
    assert env == {"ANSIBLE_VAULT_IDENTITY_LIST": f"dev@{pw}", "ANSIBLE_VAULT_PASSWORD_FILE": str(pw)}
    assert PW not in json.dumps(env)


def test_a_later_password_file_is_added_once_the_inventory_was_read(tmp_path: Path) -> None:
    fleet = load_fleet(_inv(tmp_path))  # set up with nothing configured
    vault.setup(_pw(tmp_path))  # a BMC command's --vault-password-file, after the load
    assert str(fleet.hosts["n1"].vars["vllm_api_key"]) == KEY
    assert vault.runner_env()["ANSIBLE_VAULT_IDENTITY_LIST"].endswith(f"@{tmp_path / 'vault-pass'}")
    from provisioner.runner.config import RunConfig

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = RunConfig(inventory=tmp_path).ansible_env(run_dir)  # what ansible-runner hands ansible-playbook
    assert env["ANSIBLE_VAULT_IDENTITY_LIST"] == f"default@{tmp_path / 'vault-pass'}"
    assert PW not in json.dumps(env)


def test_extra_vars_files_whole_vault_and_tagged(tmp_path: Path) -> None:
    from ansible.parsing.vault import VaultLib, VaultSecret

    from provisioner.commands.common import extra_vars
    from provisioner.runner.config import RunConfig

    vault.setup(_pw(tmp_path))
    whole = tmp_path / "whole.yml"
    whole.write_bytes(VaultLib([("default", VaultSecret(PW.encode()))]).encrypt(
        f"vllm_api_key: {KEY}\nvllm_health_timeout: 30\n"))
    tagged = tmp_path / "tagged.yml"
    tagged.write_text(_vault_yaml("vllm_hf_token", "hf_secret_token") + "nccl_ib_timeout: 21\n")
    plain = tmp_path / "plain.yml"
    plain.write_text("vllm_health_timeout: 40\n")
    xv = extra_vars([f"@{whole}", f"@{tagged}", f"@{plain}", "nccl_ib_timeout=19"])
    assert str(xv["vllm_api_key"]) == KEY and str(xv["vllm_hf_token"]) == "hf_secret_token"
    assert xv["vllm_health_timeout"] == 40 and xv["nccl_ib_timeout"] == "19"
    cfg = RunConfig(inventory=tmp_path, extravars=xv)
    # the vaulted files go to ansible-playbook as files, before the other values (which win where they come later)
    assert cfg.ansible_cmdline() == f"-e @{whole} -e @{tagged}"
    assert cfg.ansible_extravars() == {"vllm_health_timeout": 40, "nccl_ib_timeout": "19"}
    argv = " ".join([cfg.ansible_cmdline() or "", json.dumps(cfg.ansible_extravars())])
    assert KEY not in argv and "hf_secret_token" not in argv


def test_a_vaulted_extra_vars_file_without_a_password_is_one_line(tmp_path: Path) -> None:
    from ansible.parsing.vault import VaultLib, VaultSecret

    from provisioner.commands.common import extra_vars

    whole = tmp_path / "whole.yml"
    whole.write_bytes(VaultLib([("default", VaultSecret(PW.encode()))]).encrypt(f"vllm_api_key: {KEY}\n"))
    with pytest.raises(UsageError, match="the file is vaulted and no vault password is given"):
        extra_vars([f"@{whole}"])


def test_the_keyed_input_digest_moves_with_a_secret_and_hides_it(tmp_path: Path) -> None:
    from provisioner.drift.state import KEYED
    from provisioner.ledger.store import Ledger
    from provisioner.drift.tiers import host_inputs

    pw = _pw(tmp_path)
    ledger = tmp_path / "runs" / "ledger.sqlite3"
    with Ledger.open(ledger) as lg:
        key = lg.digest_key()
    with Ledger.open(ledger) as lg:
        assert len(key) == 32 and lg.digest_key() == key  # one key, in the ledger: created once, then read
    assert sorted(p.name for p in ledger.parent.iterdir() if "digest" in p.name) == []  # no second key file
    a = load_fleet(_inv(tmp_path / "a", key="sk-one"), vault_password_file=pw)
    b = load_fleet(_inv(tmp_path / "b", key="sk-two"))
    da = host_inputs(a, ["n1"], key=key)["n1"]
    db = host_inputs(b, ["n1"], key=key)["n1"]
    assert da != db and da.startswith(KEYED)  # the secret is part of the inputs
    # the same inventory and key: the same digest; another key: another digest
    assert host_inputs(a, ["n1"], key=key)["n1"] == da
    assert host_inputs(a, ["n1"], key=b"x" * 32)["n1"] != da


def test_an_unkeyed_digest_would_let_a_secret_be_guessed_the_keyed_one_does_not() -> None:
    doc = dict(host_vars={"vllm_api_key": "1234"}, host_plan={}, fleet_plan={}, run_options={}, content="c",
               version="v")
    keyed = hoststate.inputs_digest(**doc, key=os.urandom(32))
    # what an attacker holding the ledger would try: every guess's plain sha256 of the same document
    guesses = {g: hashlib.sha256(json.dumps({"vars": {"vllm_api_key": g}, "plan": {}, "fleet": {}, "run": {},
                                             "content": "c", "version": "v"}, sort_keys=True).encode()).hexdigest()
               for g in ("0000", "1234", "9999")}
    assert keyed not in guesses.values()
    with pytest.raises(ValueError, match="too short"):
        hoststate.inputs_digest(**doc, key=b"short")


def test_require_only_the_variables_a_command_needs(tmp_path: Path) -> None:
    """`provision power` needs the BMC password, not the API key: a vaulted key it cannot decrypt is no error."""
    inv = write_inventory(tmp_path / "inv", files={
        "group_vars/gpu_nodes/vault.yml": _vault_yaml("vllm_api_key", KEY, "another-password"),
        "host_vars/n1.yml": _vault_yaml("bmc_password", "bmc-secret") + "bmc_address: 10.1.0.1\n"})
    fleet = load_fleet(inv, vault_password_file=_pw(tmp_path))
    vault.require(fleet, ["n1"], what="provision power", only=("bmc_password",))
    with pytest.raises(UsageError, match="vllm_api_key on host n1 is vaulted and none of the vault passwords given"):
        vault.require(fleet, ["n1"])


def test_a_sharded_jobs_vault_files_hold_the_loaded_secret_privately_and_the_env_names_paths_only(
        tmp_path: Path) -> None:
    """What a worker gets for --exec-node (runner/stream._carry_vault): the loaded secret as a 0600 file in a 0700
    dir of the job's private data dir (ansible-runner streams that dir over SSH), and an ANSIBLE_VAULT_IDENTITY_LIST
    naming the file where the worker will extract it; the password is in no environment value."""
    from provisioner.runner.stream import VAULT_DIR, _carry_vault

    pdd = tmp_path / "pdd"
    pdd.mkdir()
    assert _carry_vault(pdd, "/var/lib/provisioner/jobs/j1") == {}  # no secret loaded: nothing carried
    vault.setup(_pw(tmp_path))
    assert vault.worker_secrets() == [("default", PW.encode())]
    env = _carry_vault(pdd, "/var/lib/provisioner/jobs/j1")
    assert env == {"ANSIBLE_VAULT_IDENTITY_LIST": f"default@/var/lib/provisioner/jobs/j1/{VAULT_DIR}/0"}
    f = pdd / VAULT_DIR / "0"
    assert f.read_bytes() == PW.encode()
    assert stat.S_IMODE(f.stat().st_mode) == 0o600 and stat.S_IMODE(f.parent.stat().st_mode) == 0o700
    assert PW not in json.dumps(env)


def test_a_sharded_job_carries_its_vaulted_extra_vars_files_encrypted_and_names_them_on_the_worker(
        tmp_path: Path) -> None:
    """`-e @vaulted.yml` with --exec-node: ansible-playbook reads such a file itself, so the job carries it (still
    encrypted, 0600) and the worker's command line names its copy, never the controller's path."""
    from provisioner.runner.config import ExtraVars, RunConfig
    from provisioner.runner.stream import _carry_extra_files

    f = tmp_path / "rotated.yml"
    f.write_text(_vault_yaml("vllm_api_key", KEY))
    xv = ExtraVars({"vllm_api_key": "x", "other": 1})
    xv.files, xv.from_files = (str(f),), frozenset({"vllm_api_key"})
    pdd = tmp_path / "pdd"
    pdd.mkdir()
    cfg = _carry_extra_files(RunConfig(inventory=tmp_path / "inv.ini", extravars=xv), pdd, "/jobs/j1")
    (copy,) = (pdd / "extravars").iterdir()
    assert copy.read_text() == f.read_text() and KEY not in copy.read_text()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert cfg.ansible_cmdline() == f"-e @/jobs/j1/extravars/{copy.name}" and str(f) not in str(cfg.ansible_cmdline())
    assert cfg.ansible_extravars() == {"other": 1}  # the file's keys come from the file, as on one controller
    plain = RunConfig(inventory=tmp_path / "inv.ini", extravars={"a": 1})
    assert _carry_extra_files(plain, pdd, "/jobs/j1") is plain
