"""Each default is declared once: in a role's defaults/main.yml. The CLI reads it from there (provisioner.defaults)
and the docs' default columns say the same values."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from provisioner import defaults
from provisioner.model import Host
from provisioner import PROJECT_ROOT
from provisioner.rules import nccl

NCCL_KEYS = ("nccl_algo", "nccl_ib_timeout", "nccl_ib_retry_cnt", "nccl_ib_gid_index", "nccl_cross_nic", "nccl_extra")
ROLE_FILE = PROJECT_ROOT / "roles/nccl_tuning/defaults/main.yml"


def _doc_defaults(doc: Path) -> dict[str, str]:
    """`| `var` | `default` | ...` rows of a markdown table -> {var: default cell}."""
    out = {}
    for m in re.finditer(r"^\| `(nccl_[a-z_]+)` \| ([^|]+) \|", doc.read_text(), re.M):
        out[m.group(1)] = m.group(2).strip()
    return out


def test_the_cli_sees_the_roles_values() -> None:
    role = yaml.safe_load(ROLE_FILE.read_text())
    for k in NCCL_KEYS:
        assert defaults.role_default("nccl_tuning", k) == role[k], k
        # the rules fall back to exactly that value for a host that does not set it
        assert nccl._get(Host(name="h", address="h", groups=(), vars={}), k) == role[k], k


def test_a_caller_cannot_change_the_cached_defaults() -> None:
    d = defaults.role_defaults("nccl_tuning")
    d["nccl_extra"]["NCCL_X"] = 1
    assert defaults.role_default("nccl_tuning", "nccl_extra") == {}


def test_docs_state_the_role_defaults() -> None:
    role = yaml.safe_load(ROLE_FILE.read_text())
    for doc in ("docs/inventory.md", "docs/roles.md"):
        rows = _doc_defaults(PROJECT_ROOT / doc)
        for k in NCCL_KEYS:
            assert k in rows, f"{doc}: no row for {k}"
            cell = rows[k]
            want = "{}" if role[k] == {} else str(role[k])
            assert cell.startswith(f"`{want}`"), f"{doc}: {k} documented as {cell}, the role says {want}"


def test_no_python_copy_of_role_defaults() -> None:
    """No module of the package declares a dict of nccl_* defaults of its own again."""
    for path in (PROJECT_ROOT / "provisioner").rglob("*.py"):
        if "testbed" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                assert len(keys & set(NCCL_KEYS)) < 3, f"{path}: a dict of NCCL defaults (keys {sorted(keys)})"
