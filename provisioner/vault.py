"""Ansible Vault secrets for every command, read from the places ansible-playbook reads them: ansible.cfg
`vault_identity_list` / `vault_password_file`, ANSIBLE_VAULT_IDENTITY_LIST / ANSIBLE_VAULT_PASSWORD_FILE, and a
command's `--vault-password-file`. Set up once per process (`setup`, called by `load_fleet` before any value is
used), never by prompting; the same sources, as file paths only, are handed to ansible-playbook (`runner_env`).

Vaulted values stay encrypted until something uses them: a command that needs one without a password gets a
one-line UsageError naming host and variable (`require`), one that does not (validate, render) never decrypts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from provisioner.errors import UsageError

#: What a vault-id slug means when it asks for a terminal (never used here: commands run unattended).
_PROMPTS = ("prompt", "prompt_ask_vault_pass")
#: Where the password comes from, in one phrase (for messages).
SOURCES = "--vault-password-file, ANSIBLE_VAULT_PASSWORD_FILE or vault_password_file in ansible.cfg"


class _State:
    done = False
    slugs: tuple[str, ...] = ()  # vault-id slugs (`id@/abs/path`) the secrets were loaded from
    password_file: str | None = None  # the configured vault_password_file (absolute), handed to ansible-playbook
    loaded = 0  # secrets loaded


def is_vaulted(v: Any) -> bool:
    """An Ansible Vault value (`!vault |` in YAML), still encrypted (ansible-core's EncryptedString)."""
    return type(v).__name__ == "EncryptedString"


def _abs(path: str) -> str:
    return str(Path(path).expanduser().absolute())


def _split(slug: str) -> tuple[str | None, str]:
    from ansible.cli import CLI

    return CLI.split_vault_id(slug)


def configured(password_file: str | os.PathLike[str] | None = None) -> tuple[list[str], str | None]:
    """(vault-id slugs `id@path` from vault_identity_list plus `--vault-password-file`, vault_password_file) as
    ansible-playbook would use them, paths absolute; prompts dropped (a command never asks)."""
    from ansible import constants as C

    slugs = []
    for slug in list(C.DEFAULT_VAULT_IDENTITY_LIST or []):
        vid, value = _split(str(slug))
        if value in _PROMPTS:
            continue
        slugs.append(f"{vid or C.DEFAULT_VAULT_IDENTITY}@{_abs(value)}")
    if password_file is not None:
        p = Path(password_file).expanduser()
        if not p.exists():
            raise UsageError("vault password file not found", path=str(p))
        slugs.append(f"{C.DEFAULT_VAULT_IDENTITY}@{_abs(str(p))}")
    cfg_file = C.DEFAULT_VAULT_PASSWORD_FILE
    late = os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE")
    if not cfg_file and late:  # exported after ansible read its settings (a long-lived process, a test session)
        slugs.append(f"{C.DEFAULT_VAULT_IDENTITY}@{_abs(late)}")
    return slugs, (_abs(str(cfg_file)) if cfg_file else None)


def setup(password_file: str | os.PathLike[str] | None = None) -> None:
    """Load the vault secrets once per process; a `--vault-password-file` given after that (a command that loaded
    the inventory first) is added to them. Never prompts. UsageError (one line) when a named file is missing or no
    configured source can be read."""
    from ansible.parsing.vault import VaultSecretsContext

    slugs, cfg_file = configured(password_file)
    if not _State.done:
        _State.done = True
        ctx = VaultSecretsContext.current(optional=True)
        if ctx is not None:  # set up by someone else in this process (ansible's own CLI, a test)
            _State.loaded = len(ctx.secrets)
            return
        if slugs or cfg_file:
            _State.loaded = len(_load(slugs, initialize=True))
        _State.slugs, _State.password_file = tuple(slugs), cfg_file
        return
    new = [s for s in slugs if s not in _State.slugs]
    if password_file is None or not new:
        return
    secrets = _load_file(new[-1])
    ctx = VaultSecretsContext.current(optional=True)
    if ctx is None:
        VaultSecretsContext.initialize(VaultSecretsContext(secrets))
    else:
        ctx.secrets.extend(secrets)
    _State.slugs += tuple(new[-1:])
    _State.loaded += len(secrets)


def _load(slugs: list[str], *, initialize: bool) -> list[Any]:
    """ansible-playbook's own loading (CLI.setup_vault_secrets: the slugs, then vault_password_file), no prompt."""
    import contextlib
    import io

    from ansible.cli import CLI
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # ansible's own "[WARNING]: Error getting vault..." lines
            return list(CLI.setup_vault_secrets(DataLoader(), list(slugs), vault_password_files=[],
                                                auto_prompt=False, initialize_context=initialize))
    except AnsibleError as exc:
        raise UsageError(f"vault: {str(exc).strip().splitlines()[0]} ({SOURCES})") from None


def _load_file(slug: str) -> list[Any]:
    """One `id@file` slug's secret (a later --vault-password-file)."""
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import get_file_vault_secret

    vid, path = _split(slug)
    try:
        secret = get_file_vault_secret(filename=path, vault_id=vid, loader=DataLoader())
        secret.load()
    except AnsibleError as exc:
        raise UsageError(f"vault: {str(exc).strip().splitlines()[0]}", path=path) from None
    return [(vid, secret)]


def active() -> bool:
    """Whether vault secrets are loaded in this process."""
    from ansible.parsing.vault import VaultSecretsContext

    ctx = VaultSecretsContext.current(optional=True)
    return ctx is not None and bool(ctx.secrets)


def runner_env() -> dict[str, str]:
    """The environment that gives ansible-playbook (through ansible-runner) the same vault secrets: file paths only,
    never a password. ansible-playbook runs with our ansible.cfg, so a site's vault_password_file is passed on."""
    env: dict[str, str] = {}
    if _State.slugs:
        env["ANSIBLE_VAULT_IDENTITY_LIST"] = ",".join(_State.slugs)
    if _State.password_file:
        env["ANSIBLE_VAULT_PASSWORD_FILE"] = _State.password_file
    return env


def worker_secrets() -> list[tuple[str, bytes]]:
    """(vault id, password) of every secret loaded in this process, for a sharded run's workers: they get them inside
    the job's own stream (the authenticated SSH channel), never in argv, an environment value or a log."""
    from ansible.parsing.vault import VaultSecretsContext

    ctx = VaultSecretsContext.current(optional=True)
    out: list[tuple[str, bytes]] = []
    for vid, secret in ctx.secrets if ctx is not None else ():
        pw = getattr(secret, "bytes", None)
        if isinstance(pw, bytes) and pw and (str(vid), pw) not in out:
            out.append((str(vid), pw))
    return out


def vaulted_vars(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(variable path, value) of every still-encrypted value in `values` (nested mappings and lists included)."""
    for k, v in values.items():
        yield from _walk(f"{prefix}{k}", v)


def _walk(path: str, v: Any) -> Iterator[tuple[str, Any]]:
    if is_vaulted(v):
        yield path, v
    elif isinstance(v, Mapping):
        for k, x in v.items():
            yield from _walk(f"{path}.{k}", x)
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            yield from _walk(f"{path}[{i}]", x)


def decrypt_problem(value: Any) -> str | None:
    """Why a vaulted value cannot be decrypted (None: it can), without its content."""
    try:
        str(value)
    except ReferenceError:
        return "no vault password given"
    except Exception as exc:  # noqa: BLE001 - AnsibleVaultError and friends: a wrong or missing secret
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "no vault secrets" in first.lower() or "was not found" in first.lower():
            return "none of the vault passwords given decrypts it"
        return f"it cannot be decrypted ({first})"
    return None


def require(fleet: Any, hosts: Iterable[str], extra: Mapping[str, Any] | None = None,
            what: str = "this command", only: Iterable[str] | None = None) -> None:
    """Every vaulted value the `hosts` (and the -e `extra` vars) hold can be decrypted (`only`: just these
    variables); else one UsageError line naming host, variable and what to do. Each distinct value is decrypted once
    (ansible caches the plain text)."""
    seen: set[int] = set()
    items: list[tuple[str, str, Any]] = [("-e", k, v) for k, v in vaulted_vars(dict(extra or {}))]
    for h in hosts:
        items += [(h, k, v) for k, v in vaulted_vars(fleet.hosts[h].vars)]
    if only is not None:
        names = set(only)
        items = [i for i in items if i[1].split(".", 1)[0].split("[", 1)[0] in names]
    for host, var, v in items:
        if id(v) in seen:
            continue
        seen.add(id(v))
        problem = decrypt_problem(v)
        if problem is not None:
            where = "in -e" if host == "-e" else f"on host {host}"
            raise UsageError(f"{var} {where} is vaulted and {problem}: {what} needs it ({SOURCES})",
                             path=str(getattr(fleet, "source", "")) or None)


def load_vars_file(path: Path) -> Any:
    """A YAML/JSON file of variables as ansible-playbook reads `-e @FILE`: a whole-file vault is decrypted, `!vault`
    values stay encrypted until used. UsageError (one line) when it cannot be read or decrypted."""
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader

    if not path.is_file():
        raise UsageError("-e @FILE: cannot read it: No such file", path=str(path))
    loader = DataLoader()
    from ansible.parsing.vault import VaultSecretsContext

    ctx = VaultSecretsContext.current(optional=True)
    if ctx is not None:
        loader.set_vault_secrets(ctx.secrets)
    try:
        head = path.read_bytes()[:14]
    except OSError as exc:
        raise UsageError(f"-e @FILE: cannot read it: {exc.strerror or exc}", path=str(path)) from None
    if head.startswith(b"$ANSIBLE_VAULT") and not active():
        raise UsageError(f"-e @FILE: the file is vaulted and no vault password is given ({SOURCES})",
                         path=str(path))
    try:
        return loader.load_from_file(str(path))
    except AnsibleError as exc:
        raise UsageError(f"-e @FILE: {str(exc).strip().splitlines()[0]}", path=str(path)) from None


def _reset_for_tests() -> None:
    """Forget this process's vault setup (tests only: a real process sets it up once)."""
    from ansible.parsing.vault import VaultSecretsContext

    VaultSecretsContext._current = None
    _State.done, _State.slugs, _State.password_file, _State.loaded = False, (), None, 0


__all__ = ["SOURCES", "active", "configured", "decrypt_problem", "is_vaulted", "load_vars_file", "require",
           "runner_env", "setup", "vaulted_vars", "worker_secrets"]
