"""Small helpers shared by the rules (pure)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from provisioner.bmc.config import is_vaulted

if TYPE_CHECKING:
    from provisioner.model import Fleet


def is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def type_name(v: Any) -> str:
    if v is None:
        return "null"
    for t, n in ((bool, "bool"), (int, "int"), (float, "float"), (str, "string"), (dict, "dict"),
                 (list, "list"), (tuple, "list")):
        if isinstance(v, t):
            return n
    return type(v).__name__.removeprefix("_AnsibleTagged").lower()  # e.g. a YAML date: "date"


def show(v: Any) -> str:
    """A found value for a message: repr, shortened."""
    if isinstance(v, dict):
        r = repr(dict(v))
    elif isinstance(v, (list, tuple)):
        r = repr(list(v))
    elif isinstance(v, str):
        r = repr(str(v))
    else:
        r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def suggest(value: Any, choices: Iterable[str]) -> str:
    """' (did you mean X?)' or ''."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    if not close:
        low = {c.lower(): c for c in choices}
        close = [low[value.lower()]] if value.lower() in low else []
    return f" (did you mean {close[0]!r}?)" if close else ""


def quoted_hint(v: Any, want: str) -> str:
    """Extra advice when a number/bool arrived as a string (e.g. quoted in YAML)."""
    if isinstance(v, str):
        s = v.strip().lower()
        if want == "int" and s.lstrip("-").isdigit():
            return f"; write {s} without quotes"
        if want == "bool" and s in ("true", "false", "yes", "no", "on", "off"):
            return "; write true/false without quotes"
        if want == "number":
            try:
                float(s)
                return f"; write {s} without quotes"
            except ValueError:
                pass
    return ""


def places(fleet: Fleet, var: str) -> Iterator[tuple[str | None, str | None, Any]]:
    """(group, host, value) once per place `var` is set: each group that sets it, then each host whose value is
    not one of its groups' (so a bad group value is reported once, on the group)."""
    for g, gv in fleet.group_vars.items():
        if var in gv:
            yield g, None, gv[var]
    for h in fleet.hosts.values():
        if var not in h.vars:
            continue
        v = h.vars[var]
        if any(var in fleet.group_vars.get(g, {}) and same(fleet.group_vars[g][var], v) for g in (*h.groups, "all")):
            continue
        yield None, h.name, v


def mapping_places(fleet: Fleet, var: str) -> Iterator[tuple[str | None, str | None, Mapping[str, Any]]]:
    """`places` whose value is a mapping (the key rules of a mapping variable; its shape rule reports the rest)."""
    for g, h, v in places(fleet, var):
        if isinstance(v, Mapping):
            yield g, h, v


def mapping_shape(fleet: Fleet, var: str, keys: Sequence[str], *, what: str,
                  example: str) -> Iterator[tuple[str | None, str | None, Any, list[str]]]:
    """(group, host, value, problems) per place `var` is set (not null): the messages for a value that is not a
    mapping or has keys outside `keys` (`what` names a key: "a policy key")."""
    for g, h, v in places(fleet, var):
        if v is None:
            continue
        if not isinstance(v, Mapping):
            yield g, h, v, [f"{var} = {show(v)} is a {type_name(v)}: expected a mapping, e.g. {example}"]
            continue
        yield g, h, v, [f"{var}.{k} is not {what} (one of {', '.join(keys)}){suggest(k, keys)}"
                        for k in v if k not in keys]


def same(a: Any, b: Any) -> bool:
    """a == b without decrypting a vault value (comparing an EncryptedString decrypts it, or raises)."""
    if a is b:
        return True
    return not is_vaulted(a) and not is_vaulted(b) and a == b
