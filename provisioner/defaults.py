"""The roles' `defaults/main.yml`: the one home of every role default. The CLI reads them here (once per process),
never re-declares them; `provision render`, the rules, health and monitoring all see the same values."""

from __future__ import annotations

import copy
import functools
from typing import Any

import yaml

from provisioner.catalog import SAFE_LOADER
from provisioner.errors import UsageError
from provisioner.paths import ROLES, data_file


@functools.cache
def _load(role: str) -> dict[str, Any]:
    if not (ROLES / role / "defaults").is_dir() and (ROLES / role).is_dir():
        return {}  # a role without defaults
    path = data_file(ROLES / role / "defaults" / "main.yml")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER) or {}  # noqa: S506
    except yaml.YAMLError as exc:
        raise UsageError(f"role defaults are not valid YAML: {str(exc).splitlines()[0]}", path=str(path)) from None
    if not isinstance(data, dict):
        raise UsageError("role defaults are not a mapping", path=str(path))
    return data


def role_defaults(*roles: str) -> dict[str, Any]:
    """The roles' defaults merged in the order given (later roles win), as a fresh dict the caller may change."""
    out: dict[str, Any] = {}
    for role in roles:
        out.update(copy.deepcopy(_load(role)))
    return out


def role_default(role: str, key: str) -> Any:
    """One default of one role (None when the role does not declare it)."""
    return copy.deepcopy(_load(role).get(key))
