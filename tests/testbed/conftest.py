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

# the racks' inventories vault their secrets: the password file through ANSIBLE_VAULT_PASSWORD_FILE, as a site's
from provisioner_testbed import vault

vault.export_for_tests()

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
