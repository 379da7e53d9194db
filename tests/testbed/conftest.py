"""The simulated rack for tests: a session fixture `testbed` that brings the rack up once (or reuses one that is
already up) and yields a `provisioner_testbed.rack.Handle` (inventory path, host names/addresses, SSH key and
known_hosts paths, `ssh(host, command)`).

Environment:
- PROVISIONER_TESTBED_RACK: rack name (default `rack`; pick your own to keep parallel work apart).
- PROVISIONER_TESTBED_TEARDOWN=1: remove the rack at the end of the session when this session created it.
Needs root (systemd-nspawn, overlayfs, bridges): skipped otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


def _rack_vault() -> None:
    """The racks' generated inventories vault their secrets (provisioner_testbed.vault): every `provision` and
    `ansible-playbook` a test starts, and every in-process load, finds the password the way a site's does, through
    ANSIBLE_VAULT_PASSWORD_FILE (set here, before anything reads Ansible's settings). Root only (the rack's lanes)."""
    if os.geteuid() == 0:
        from provisioner_testbed import vault

        os.environ[vault.ENV] = str(vault.password_file())


_rack_vault()

from provisioner_testbed import rack  # noqa: E402  (after the vault environment)


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root")


@pytest.fixture(scope="session")
def testbed() -> Iterator[rack.Handle]:
    _need_root()
    name = os.environ.get("PROVISIONER_TESTBED_RACK", rack.DEFAULT_NAME)
    existed = (rack.RackState.load(name) or None) is not None
    # the rack `make demo` builds: a plain rack, no vLLM cluster in its inventory (`provision testbed up`'s default)
    h = rack.ensure(name, rack.DEFAULT_NODES, clusters=False, log=lambda m: print(f"testbed: {m}"))
    yield h
    if not existed and os.environ.get("PROVISIONER_TESTBED_TEARDOWN") == "1":
        rack.down(name)
