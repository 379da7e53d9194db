"""Execution accelerators for `provision run|drift|onboard`: which Ansible strategy runs the playbook.

- `none` (default): ansible.cfg's `linear` strategy (fork per task, AnsiballZ over pipelined SSH).
- `mitogen`: Mitogen for Ansible's `mitogen_linear` (one persistent interpreter per host over the same SSH,
  modules run in it): same task order and `serial` semantics. Needs the `mitogen` package on the controller
  (`pip install 'provisioner[accelerate]'`); nothing on the hosts. Figures and caveats: benchmarks/README.md "Round 3".

Chosen by `--accelerate MODE`, else `$PROVISION_ACCELERATE`, else `none`. Plain ansible-playbook: set the same two
variables that `env()` returns.
"""

from __future__ import annotations

import os
from pathlib import Path

from provisioner.errors import UsageError

MODES = ("none", "mitogen")
DEFAULT = "none"
ENV_VAR = "PROVISION_ACCELERATE"
MITOGEN_CONNECT_TIMEOUT = 60  # seconds, see env()


def mode(requested: str | None = None) -> str:
    """The mode to use: `requested`, else $PROVISION_ACCELERATE, else the default; UsageError if unknown."""
    value = (requested or os.environ.get(ENV_VAR) or DEFAULT).strip().lower()
    if value not in MODES:
        src = "--accelerate" if requested else ENV_VAR
        raise UsageError(f"{src}: unknown accelerator {value!r} (one of: {', '.join(MODES)})")
    return value


def env(requested: str | None = None) -> dict[str, str]:
    """Environment for ansible-playbook that selects the accelerator (empty for `none`)."""
    m = mode(requested)
    if m == "none":
        return {}
    try:
        import ansible_mitogen
    except ImportError:
        raise UsageError("accelerator 'mitogen' needs the mitogen package on the controller: "
                         "pip install 'provisioner[accelerate]'") from None
    strategy_dir = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    out = {"ANSIBLE_STRATEGY_PLUGINS": str(strategy_dir), "ANSIBLE_STRATEGY": "mitogen_linear"}
    # Mitogen's connect timeout (Ansible's `timeout`, 10 s) covers ssh AND starting its interpreter on the host; on a
    # loaded controller (load ~40) that took longer and every host came back "Connection timed out", where stock
    # Ansible's (the TCP/SSH connect only) did not. An operator's own ANSIBLE_TIMEOUT wins.
    if not os.environ.get("ANSIBLE_TIMEOUT"):
        out["ANSIBLE_TIMEOUT"] = str(MITOGEN_CONNECT_TIMEOUT)
    return out
