"""The simulated racks' Ansible Vault password: one file for every rack of this machine (`vault-password` in the
testbed's state root, 0600), with which the generated inventories vault their secrets (the vLLM API key, the BMC
password), as docs/inventory.md asks a site to. Found the way a site's is: ANSIBLE_VAULT_PASSWORD_FILE, which
`provision` and plain `ansible-playbook` both read (`provision testbed up` prints the export line).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from provisioner_testbed.state import state_root

#: The environment variable that names the file (Ansible's own).
ENV = "ANSIBLE_VAULT_PASSWORD_FILE"


def password_file() -> Path:
    """The vault password file, created (0600, a random password) on first use."""
    f = state_root() / "vault-password"
    if f.is_file() and f.stat().st_size > 0:
        return f
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".vault-password.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(24) + "\n")
    try:
        os.link(tmp, f)  # two `up`s at once agree on one password
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return f


def env() -> dict[str, str]:
    """The environment that gives `provision` and `ansible-playbook` the racks' vault password."""
    return {ENV: str(password_file())}


def export_for_tests() -> None:
    """The rack lanes' conftests: as root, put ENV in this process's environment before anything reads Ansible's
    settings, so every in-process load and every `provision`/`ansible-playbook` a test starts finds the password."""
    if os.geteuid() == 0:
        os.environ.update(env())


def export_line() -> str:
    return f"export {ENV}={password_file()}"
