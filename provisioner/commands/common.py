"""Helpers more than one command needs, so that commands never import each other. Light at import time (no CLI
framework): `provision preflight`'s fast path imports this."""

from __future__ import annotations

import inspect
import re
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.errors import UsageError
from provisioner.reports.untrusted import printable  # noqa: F401  (commands import it from here)

if TYPE_CHECKING:
    from provisioner.model import Fleet


def validate(fleet: Fleet, targeted: set[str] | None = None) -> tuple[list[Any], list[Any]]:
    """(errors that block, warnings) from provisioner.rules. Errors on hosts outside `targeted` become warnings."""
    from provisioner.rules import run_rules, split_findings

    return split_findings(list(run_rules(fleet)), targeted)


def finding_line(f: Any) -> str:
    """`Finding.line()` (the same line the validate action plugin prints); tolerant of other objects."""
    line = getattr(f, "line", None)
    return line() if callable(line) else str(f)


def select(fleet: Fleet, limit: str | None) -> list[str]:
    """The GPU nodes `--limit` picks (provisioner.inventory.select_gpu_nodes)."""
    from provisioner.inventory import select_gpu_nodes

    return select_gpu_nodes(fleet, limit)


def load_targets(inventory: Path, limit: str | None, timeout: float, forks: int,
                 vault_password_file: Path | None = None) -> tuple[Fleet, list[str]]:
    """Check the options shared by `preflight` and `health`, load the fleet and pick the GPU nodes to reach."""
    from provisioner.inventory import load_fleet

    if timeout <= 0 or forks < 1:
        raise UsageError("--timeout must be > 0 and --forks >= 1")
    fleet = load_fleet(inventory, vault_password_file=vault_password_file)
    hosts = select(fleet, limit)
    if not hosts:
        raise UsageError(f"no GPU nodes match{' --limit ' + limit if limit else ''}", path=str(inventory))
    return fleet, hosts



def load_run_targets(
    inventory: Path, extra: list[str] | None, limit: str | None, playbook: Path | None, accelerate: str | None,
    vault_password_file: Path | None = None, what: str = "this command",
) -> tuple[Fleet, dict[str, Any], str | None, list[str]]:
    """Check the options shared by `run` and `drift`, load the fleet once (extra vars laid on it) and resolve the
    limit on it: (fleet, extra vars, absolute limit, targeted hosts). The vault secrets come first (-e @FILE may be
    vaulted), and every vaulted value of the targeted hosts must decrypt: a run needs them (one line, exit 2)."""
    from provisioner import vault
    from provisioner.accelerate import env as accel_env
    from provisioner.inventory import limit_hosts, load_fleet
    from provisioner.runner import resolve_limit

    if playbook is not None and not playbook.is_file():
        raise UsageError("playbook not found", path=str(playbook))
    accel_env(accelerate)  # an unknown or uninstalled accelerator is a usage error before anything runs
    vault.setup(vault_password_file)
    xv = extra_vars(extra)
    fleet = load_fleet(inventory, extra_vars=xv)
    limit_abs = resolve_limit(limit)
    targeted = limit_hosts(fleet, limit_abs)
    if not targeted:
        raise UsageError(f"no hosts match{' --limit ' + limit if limit else ''}", path=str(inventory))
    vault.require(fleet, targeted, xv, what)
    return fleet, xv, limit_abs, targeted


#: --vault-password-file of every command that reads the inventory
VAULT_HELP = ("File holding the vault password for vaulted values (else ANSIBLE_VAULT_PASSWORD_FILE / "
              "ANSIBLE_VAULT_IDENTITY_LIST or ansible.cfg's vault_password_file / vault_identity_list).")

#: --exec-node of `run` and `drift`
EXEC_NODE_HELP = ("Shard the run across these execution nodes (hosts of group execution_nodes; repeat or comma list): "
                  "one ansible-runner worker each, over SSH.")


def shard_targets(fleet: Fleet, targeted: list[str], names: list[str] | None,
                  accelerate: str | None = None) -> tuple[list[str], list[str]]:
    """(the --exec-node names checked against the inventory, the targeted hosts without them): an execution node
    runs shards, it is not provisioned by its own run."""
    if not names:
        return [], targeted
    from provisioner.runner.shards import exec_nodes
    from provisioner.runner.stream import check_accelerate

    check_accelerate(accelerate)  # vaulted values: checked by the shared options; the workers get the secrets
    nodes = exec_nodes(fleet, names)
    rest = [h for h in targeted if h not in nodes]
    if not rest:
        raise UsageError("no hosts left to run once the execution nodes are taken out", path=str(fleet.source))
    return nodes, rest


def shard_lines(result: Any) -> list[str]:
    """One line per shard of a sharded run (for stderr)."""
    out = []
    for s in getattr(result, "shards", None) or []:
        state = s["status"] if not s.get("error") else f"error: {s['error']}"
        out.append(f"shard {s.get('shard') or s['node']}: {len(s['hosts'])} host(s) ({', '.join(s['units'])}), "
                   f"{state}, {s['duration']:.0f} s")
    return out


class Format(str, Enum):
    """--format of validate, preflight, health, onboard."""

    text = "text"
    json = "json"


_ITEM = re.compile(r"^(?:[-*] |\d+\. )")


def unwrap(text: str) -> str:
    """A command's --help from its source-wrapped text: the first paragraph (the one-line summary) and every other
    paragraph joined into one line each (the terminal wraps them); list items (`- `, `1. `) keep their own lines."""
    paragraphs = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines: list[str] = []
        for raw in para.splitlines():
            line = raw.strip()
            if lines and not _ITEM.match(line):
                lines[-1] += " " + line
            else:
                lines.append(line)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


#: -e/--extra-vars of `run` and `drift` (ansible-playbook's forms)
EXTRA_VARS_HELP = "Extra variables, highest precedence: key=value, JSON/YAML {...} or @FILE (repeat)."


def extra_vars(values: list[str] | None) -> dict[str, Any]:
    """`-e/--extra-vars` as ansible-playbook reads them (later ones win): `key=value` pairs (strings), a JSON/YAML
    mapping (`{...}`), or `@FILE` (YAML/JSON; a whole-file vault or `!vault` values, decrypted with the vault
    secrets: provisioner.vault). UsageError naming the value on anything else. A file holding vaulted values is
    handed to ansible-playbook as `-e @FILE` (runner.ExtraVars), never copied into its argv."""
    import yaml

    from provisioner import vault
    from provisioner.inventory.limits import check_yaml_file
    from provisioner.runner.config import ExtraVars

    out = ExtraVars()
    files: list[str] = []
    from_files: set[str] = set()
    for value in values or []:
        if not value:
            continue
        where = f"-e {value!r}"
        secret = False
        if value.startswith("@"):
            path = Path(value[1:]).expanduser()
            vault.setup()  # the configured secrets (a command's --vault-password-file came first)
            try:
                check_yaml_file(path)  # a FIFO would block, an alias bomb would not end (inventory/limits.py)
                head = path.read_bytes()[:14] if path.is_file() else b""
            except OSError as exc:
                raise UsageError(f"-e @FILE: cannot read it: {exc.strerror or exc}", path=str(path)) from None
            if head.startswith(b"$ANSIBLE_VAULT") or b"!vault" in _read(path):
                data = vault.load_vars_file(path)
                secret = True
            else:
                try:
                    data = yaml.safe_load(path.read_text(encoding="utf-8"))
                except OSError as exc:
                    raise UsageError(f"-e @FILE: cannot read it: {exc.strerror or exc}", path=str(path)) from None
                except yaml.YAMLError as exc:
                    raise UsageError(f"-e @FILE: invalid YAML: {str(exc).splitlines()[0]}", path=str(path)) from None
            where = f"-e {value}"
        elif value[0] in "/.":
            raise UsageError(f"{where}: a file of variables is given as @FILE (-e @{value})")
        elif value[0] in "[{":
            try:
                data = yaml.safe_load(value)
            except yaml.YAMLError as exc:
                raise UsageError(f"{where}: invalid JSON/YAML: {str(exc).splitlines()[0]}") from None
        else:
            from ansible.errors import AnsibleError
            from ansible.parsing.splitter import parse_kv

            try:
                data = parse_kv(value)
            except AnsibleError as exc:
                raise UsageError(f"{where}: {str(exc).splitlines()[0]}") from None
            if "_raw_params" in data:
                raise UsageError(f"{where}: expected key=value, a JSON/YAML mapping or @FILE")
        if not isinstance(data, dict):
            raise UsageError(f"{where}: not a mapping of variables (got {type(data).__name__})")
        bad = [k for k in data if not isinstance(k, str) or not k.isidentifier()]
        if bad:
            raise UsageError(f"{where}: {bad[0]!r} is not a valid variable name")
        out.update(data)  # ansible-playbook's default hash_behaviour: replace
        if secret:
            files.append(str(Path(value[1:]).expanduser().absolute()))
            from_files.update(str(k) for k in data)
        else:
            from_files.difference_update(str(k) for k in data)
    out.files, out.from_files = tuple(files), frozenset(from_files)
    return out


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def use_vault(password_file: Path | None) -> None:
    """A command's --vault-password-file: set the vault secrets up (provisioner.vault) before the inventory is read."""
    from provisioner import vault

    vault.setup(password_file)
