"""Load an Ansible inventory into the typed `Fleet` model.

The only module that touches Ansible's inventory API: ansible-core's own InventoryManager reads INI or YAML
inventories (a file or a directory of them), and host variables are merged with ansible-core's own building blocks
(`sort_groups`, `combine_vars`, the vars plugins that read group_vars/ and host_vars/, `VARIABLE_PRECEDENCE`) in
exactly the order `VariableManager.get_vars(host=...)` uses. The one difference is speed: the merged group part is
computed once per distinct set of groups instead of once per host (5,000 hosts in a handful of groups need a handful
of merges), so loading costs about Ansible's own parse. `tests/unit/test_inventory.py` checks the result against
`VariableManager.get_vars` on the same inventories.

`load_fleet(path)` is the CLI's entry point (any source ansible-core accepts: INI/YAML file or directory, an
executable script, an inventory plugin config). Inside a play nothing reads the inventory again: the provisioner_plan
action builds its Fleet from what Ansible resolved (provisioner.plan.fleet_from_vars).

Paths: an inventory path is made absolute first, as ansible-playbook and ansible-inventory do with `-i`
(`unfrackpath(path, follow=False)`: from the working directory, symlinks kept), and ansible-core's per-directory
vars-plugin caches are cleared before each load. ansible-core keys those caches by the directory string it is given:
a relative source (`rack-a.ini`: directory "") resolved to no directory at all, so group_vars/ beside it was
silently skipped, and a cached relative directory would go stale when the working directory changes.

Errors (missing file, bad INI line, bad YAML in the inventory or in group_vars/host_vars) become `UsageError`s
whose message names the file, the line when Ansible or YAML knows it, and the reason.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from provisioner.errors import UsageError
from provisioner.inventory.origin import where
from provisioner.model import Cluster, Fleet, Host, freeze
from provisioner.plan import make_cluster, make_host


def _quiet_ansible() -> None:
    # Keep ansible's own warnings (e.g. "provided hosts list is empty") off our output; we report ourselves.
    os.environ.setdefault("ANSIBLE_LOCALHOST_WARNING", "False")
    os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_WARNING", "False")
    os.environ.setdefault("ANSIBLE_DEPRECATION_WARNINGS", "False")


def inventory_source(path: str | os.PathLike[str]) -> Path:
    """The inventory source as Ansible's CLIs resolve `-i PATH`: `~` and `$VARS` expanded, absolute from the working
    directory, symlinks not followed (group_vars/ is read beside the link, as ansible-playbook does)."""
    from ansible.utils.path import unfrackpath

    return Path(unfrackpath(os.fspath(path), follow=False))


def _fresh_vars_plugins() -> None:
    """Forget ansible-core's process-wide vars-plugin caches (host_group_vars: directory -> realpath, found and
    missing group_vars/host_vars). A one-shot ansible-playbook never sees a directory change under it; a process
    that loads inventories again (tests, long-lived callers) would get the first answer forever."""
    try:
        from ansible.plugins.vars import host_group_vars as hgv
    except ImportError:  # pragma: no cover - the plugin is part of ansible-core
        return
    for name in ("CANONICAL_PATHS", "FOUND", "NAK"):
        cache: Any = getattr(hgv, name, None)
        if cache is not None and hasattr(cache, "clear"):
            cache.clear()


def load_fleet(path: str | os.PathLike[str], extra_vars: Mapping[str, Any] | None = None,
               vault_password_file: str | os.PathLike[str] | None = None) -> Fleet:
    """Read the inventory at `path`; raise UsageError (exit 2) when it cannot be read or parsed. `extra_vars` (the
    run's `-e`) are laid on top as in a play: the rules see what the play will see. A relative
    `path` is resolved from the working directory exactly as `ansible-playbook -i` does (`inventory_source`).
    The vault secrets are set up first (provisioner.vault: ansible.cfg, environment, `vault_password_file`);
    vaulted values stay encrypted in the Fleet until used."""
    _quiet_ansible()
    from provisioner import vault

    vault.setup(vault_password_file)
    p = inventory_source(path)
    if not p.exists():
        raise UsageError("inventory not found", path=str(p))
    if not os.access(p, os.R_OK):
        raise UsageError("inventory is not readable", path=str(p))
    if p.is_file() and p.stat().st_size == 0:
        raise UsageError("inventory is empty", path=str(p))
    from provisioner.inventory import cache as inventory_cache

    # the same bytes as a load that passed every check below: the fleet it built (provisioner/inventory/cache.py)
    digest = inventory_cache.key(p, extra_vars)
    cached = inventory_cache.lookup(p, digest)
    if cached is not None:
        c_hosts, c_clusters, c_group_vars, c_groups = cached
        inventory_cache.keep(len(c_hosts))
        return Fleet(source=p, hosts=freeze(c_hosts), clusters=freeze(c_clusters), group_vars=freeze(c_group_vars),
                     groups=freeze(c_groups), ansible_inventory=None)  # --limit parses the hosts (limit_hosts)
    from provisioner.inventory.limits import check_inventory

    check_inventory(p)  # before ansible-core reads it: no FIFO/device, no YAML alias bomb (resource limits)
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    _fresh_vars_plugins()
    loader = DataLoader()
    # "unparsed" inventories do not raise by default: make ansible fail loudly on a source it cannot parse.
    C.INVENTORY_UNPARSED_IS_FAILED = True
    chatter = io.StringIO()  # Ansible's own warnings; we report the reason ourselves
    failure: AnsibleError | None = None
    try:
        with contextlib.redirect_stderr(chatter), inventory_cache.no_gc():
            inv = InventoryManager(loader=loader, sources=[str(p)])
            hosts, group_vars, groups = _read(loader, inv, [str(p)], extra_vars=dict(extra_vars or {}))
    except AnsibleError as exc:
        failure = exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read inventory: {exc}", path=str(p)) from None
    except RecursionError:
        raise UsageError("cannot parse inventory: groups are nested too deeply (a cycle?)", path=str(p)) from None
    if failure is not None:
        where, reason = _describe(failure)
        if where is None or reason.startswith(("No inventory was parsed", "Completely failed")):
            with contextlib.redirect_stderr(chatter):
                where, reason = _explain_source(loader, p) or (where, reason)
        raise UsageError(f"cannot parse inventory: {reason}", path=where or str(p))

    if not hosts:
        raise UsageError("the inventory defines no hosts: nothing to validate or run (is it the right file?)",
                         path=str(p))
    with inventory_cache.no_gc():
        fleet = _fleet(inv, p, hosts, group_vars, groups)
    inventory_cache.store(p, digest, fleet.hosts, fleet.clusters, fleet.group_vars, fleet.groups)
    inventory_cache.keep(len(fleet.hosts))
    return fleet


def limit_hosts(source: Fleet | str | os.PathLike[str], limit: str | None) -> list[str]:
    """The hosts `limit` selects (an ansible-playbook `--limit`: groups, globs, `~regex`, `!`, `&`, `@file`), in
    inventory order. A Fleet from `load_fleet` is resolved on the inventory it was read from; a path is parsed (hosts
    only). UsageError when the pattern or the inventory is bad."""
    _quiet_ansible()
    from ansible.errors import AnsibleError

    inv = source.ansible_inventory if isinstance(source, Fleet) else None
    where = source.source if isinstance(source, Fleet) else inventory_source(source)
    try:
        if inv is None:
            from ansible.inventory.manager import InventoryManager
            from ansible.parsing.dataloader import DataLoader

            inv = InventoryManager(loader=DataLoader(), sources=[str(where)])
        # Ansible's own "[WARNING]: Could not match supplied host pattern": the caller reports an empty selection
        with contextlib.redirect_stderr(io.StringIO()):
            try:
                if limit:
                    inv.subset(limit)
                return [h.name for h in inv.get_hosts("all")]
            finally:
                if limit:
                    inv.subset(None)
    except AnsibleError as exc:
        raise UsageError(f"cannot select hosts: {str(exc).strip().splitlines()[0]}", path=str(where)) from None


def _fleet(inv: Any, source: Path, hosts: dict[str, Host], group_vars: dict[str, Any],
           groups: dict[str, tuple[str, ...]]) -> Fleet:
    clusters = _clusters(inv, hosts, group_vars)
    return Fleet(
        source=source,
        hosts=freeze(hosts),
        clusters=freeze(clusters),
        group_vars=freeze(group_vars),
        groups=freeze(groups),
        ansible_inventory=inv,  # host patterns and --limit are resolved on it (limit_hosts)
    )


def _read(loader: Any, inv: Any, sources: list[str], extra_vars: dict[str, Any] | None = None,
          ) -> tuple[dict[str, Host], dict[str, Any], dict[str, tuple[str, ...]]]:
    """Hosts with merged vars (Ansible's precedence), each group's own vars, group -> member host names.
    `extra_vars` (a play's -e): on top of every host's vars and of the variables each group sets itself."""
    from ansible import constants as C
    from ansible.inventory.helpers import get_group_vars, sort_groups
    from ansible.utils.vars import combine_vars
    from ansible.vars.plugins import get_vars_from_inventory_sources

    all_group = inv.groups["all"]
    stage = "task"  # what VariableManager.get_vars uses by default (ansible-playbook's view)

    def plugin_vars(entities: list[Any]) -> dict[str, Any]:
        return get_vars_from_inventory_sources(loader, sources, entities, stage)

    all_plugin = plugin_vars([all_group])
    group_merge: dict[tuple[str, ...], dict[str, Any]] = {}

    def merged_groups(host_groups: list[Any]) -> dict[str, Any]:
        """VariableManager.get_vars' group part for one host, cached per distinct group list."""
        key = tuple(g.name for g in host_groups)
        hit = group_merge.get(key)
        if hit is not None:
            return hit
        parts = {
            "all_inventory": lambda: all_group.get_vars(),
            "all_plugins_inventory": lambda: all_plugin,
            "all_plugins_play": lambda: {},  # no play: no playbook-adjacent vars (as get_vars without a play)
            "groups_inventory": lambda: get_group_vars(host_groups),
            "groups_plugins_inventory": lambda: plugin_vars(host_groups),
            "groups_plugins_play": lambda: {},
        }
        out: dict[str, Any] = {}
        for entry in C.VARIABLE_PRECEDENCE:
            fn = parts.get(entry)
            if fn is not None:
                new = fn()
                if new:
                    out = combine_vars(out, new)
        group_merge[key] = out
        return out

    hosts: dict[str, Host] = {}
    # every host of the inventory: a play's --limit and serial batches (subset/restriction) do not shrink the Fleet
    for h in inv.get_hosts(ignore_limits=True, ignore_restrictions=True):
        host_groups = sort_groups([g for g in h.get_groups() if g.name != "all"])
        hv = combine_vars(merged_groups(host_groups), h.get_vars())
        hv = combine_vars(hv, plugin_vars([h]))
        if extra_vars:
            hv = combine_vars(hv, extra_vars)
        hosts[h.name] = make_host(h.name, hv, (g.name for g in host_groups))

    group_vars: dict[str, Any] = {}
    groups: dict[str, tuple[str, ...]] = {}
    for name, g in inv.groups.items():
        own = plugin_vars([g]) if name != "all" else all_plugin
        gv = combine_vars(g.get_vars(), own)
        if extra_vars:
            over = {k: v for k, v in extra_vars.items() if k in gv}
            if over:
                gv = combine_vars(gv, over)
        group_vars[name] = freeze(gv)
        groups[name] = tuple(x.name for x in g.get_hosts())
    return hosts, group_vars, groups


def _clusters(inv: Any, hosts: dict[str, Host], group_vars: dict[str, Any]) -> dict[str, Cluster]:
    """A cluster is a group whose *own* vars (inline or group_vars/) define `vllm_cluster` (what the rules check; a
    play finds the same groups from resolved variables, provisioner.plan.detect_clusters, rule CL019)."""
    return {name: make_cluster(name, group_vars.get(name, {}).get("vllm_cluster"), [h.name for h in g.get_hosts()],
                               hosts)
            for name, g in inv.groups.items() if "vllm_cluster" in group_vars.get(name, {})}


# --- error messages -----------------------------------------------------------------------------------------------


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _origin_of(exc: BaseException) -> tuple[str, int | None] | None:
    return where(getattr(exc, "obj", None))


def _describe(exc: BaseException) -> tuple[str | None, str]:
    """(file[:line], reason) from an Ansible exception chain: the deepest message and the most precise origin."""
    where: tuple[str, int | None] | None = None
    reason = ""
    for e in _chain(exc):
        o = _origin_of(e)
        if o is not None and (where is None or (where[1] is None and o[1] is not None)):
            where = o
        if type(e).__module__.startswith("yaml"):
            continue  # Ansible's wrapper says the same in a sentence
        msg = str(getattr(e, "message", None) or e).strip()
        msg = msg.splitlines()[0] if msg else ""
        if msg and not msg.startswith(("Failed to parse inventory.", "Failed to parse inventory with")):
            reason = msg.removeprefix("Failed to parse inventory: ")
    where_s = None if where is None else (f"{where[0]}:{where[1]}" if where[1] else where[0])
    return where_s, _plain(reason) or type(exc).__name__


# ansible-core's internal names of the types it tags values with, as a reader knows them
_TYPE_WORDS = {"str": "string", "unicode": "string", "int": "integer", "float": "number", "bool": "boolean",
               "dict": "mapping", "list": "list", "nonetype": "null", "tuple": "list"}


def _type_word(name: str) -> str:
    base = re.sub(r"^_?AnsibleTagged", "", name.rsplit(".", 1)[-1]).removeprefix("_")
    return _TYPE_WORDS.get(base.lower(), base.lower())


def _plain(reason: str) -> str:
    """A reason without Python internals: `'_AnsibleTaggedStr'` / `<class 'x.Y'>` become the type's plain name."""
    reason = re.sub(r"""["']?<class '([\w.]+)'>["']?""", lambda m: _type_word(m.group(1)), reason)
    reason = re.sub(r"""'(_?AnsibleTagged\w+|NoneType)'""", lambda m: _type_word(m.group(1)), reason)
    if "surrogates not allowed" in reason or "can't decode" in reason:
        reason = f"not valid UTF-8 text ({reason})"
    return reason


def _explain_source(loader: Any, p: Path) -> tuple[str, str] | None:
    """Re-parse a failed inventory file with the one plugin meant for it, to report the line and the real reason;
    when the inventory itself parses, look for the group_vars/ or host_vars/ file that broke the load."""
    found = None
    if p.is_file():
        found = _explain_yaml(loader, p) if p.suffix in (".yml", ".yaml", ".json") else _explain_ini(loader, p)
    return found or _explain_vars_files(p)


_VARS_SUFFIXES = ("", ".yml", ".yaml", ".json")  # what ansible-core's host_group_vars plugin reads


def _explain_vars_files(p: Path) -> tuple[str, str] | None:
    """(file:line, reason) for the first group_vars/host_vars file beside the inventory whose document is not a
    mapping of variables (a list, a string...: Ansible only says it could not combine a dict with it)."""
    import yaml

    base = p if p.is_dir() else p.parent
    for sub in ("group_vars", "host_vars"):
        top = base / sub
        if not top.is_dir():
            continue
        for f in sorted(x for x in top.rglob("*") if x.is_file()):
            rel = f.relative_to(top)
            if any(part.startswith(".") for part in rel.parts) or f.suffix not in _VARS_SUFFIXES:
                continue
            try:
                text = f.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue  # Ansible names those itself
            if text.lstrip().startswith("$ANSIBLE_VAULT"):
                continue  # a vaulted file: its plain text is not ours to read
            try:
                node = yaml.compose(text)  # no constructors: custom tags (!vault, !unsafe) are fine
            except yaml.YAMLError:
                continue  # Ansible reports YAML errors with the file and line
            if node is None or isinstance(node, yaml.MappingNode):
                continue
            kind = "a list" if isinstance(node, yaml.SequenceNode) else "a single value"
            if isinstance(node, yaml.ScalarNode):
                value = node.value if len(node.value) <= 40 else node.value[:37] + "..."
                kind = f"the single value {value!r}"
            return (f"{f}:{node.start_mark.line + 1}",
                    f"a {sub} file must be a mapping of variable names to values (name: value lines), found {kind}")
    return None


def _explain_yaml(loader: Any, p: Path) -> tuple[str, str] | None:
    import yaml

    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        return f"{p}{line}", f"invalid YAML: {exc.problem or exc.context}"
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        return str(p), f"invalid YAML: {str(exc).splitlines()[0]}"
    if not isinstance(data, dict):
        return str(p), f"a YAML inventory must be a mapping of groups (found {type(data).__name__})"
    from ansible.inventory.data import InventoryData
    from ansible.plugins.loader import inventory_loader

    plugin = inventory_loader.get("yaml")
    try:
        plugin.parse(InventoryData(), loader, str(p.resolve()), cache=False)
    except Exception as exc:  # noqa: BLE001 - we only harvest the message
        _, reason = _describe(exc)
        return str(p), reason
    return None


def _explain_ini(loader: Any, p: Path) -> tuple[str, str] | None:
    import tempfile

    from ansible.inventory.data import InventoryData
    from ansible.plugins.inventory.ini import InventoryModule

    def fails(text: str) -> bool:
        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / p.name
            f.write_text(text, encoding="utf-8")
            try:
                InventoryModule().parse(InventoryData(), loader, str(f), cache=False)
            except Exception:  # noqa: BLE001 - only whether it fails
                return True
        return False

    def first_failing_line(lines: list[str]) -> int | None:
        """The 1-based line where ansible's INI parser first fails (the shortest failing prefix; it does not say)."""
        lo, hi = 1, len(lines)
        if not fails("\n".join(lines) + "\n"):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if fails("\n".join(lines[:mid]) + "\n"):
                hi = mid
            else:
                lo = mid + 1
        return lo

    try:
        InventoryModule().parse(InventoryData(), loader, str(p.resolve()), cache=False)
    except Exception as exc:  # noqa: BLE001 - we only harvest the message
        _, reason = _describe(exc)
        try:
            line = first_failing_line(p.read_text(encoding="utf-8", errors="replace").splitlines())
        except OSError:
            line = None
        if line is not None:
            try:
                text = p.read_text(encoding="utf-8", errors="replace").splitlines()[line - 1].strip()
            except IndexError:
                text = ""
            if text.startswith("[") and not text.endswith("]"):
                reason = f"section header {text!r} is missing its closing ']'"
            elif reason[:1].islower():  # a bare Python error from inside the parser: show the line it choked on
                reason = f"cannot read {text!r} ({reason})"
        return (f"{p}:{line}" if line else str(p)), reason
    return None


# --- where a group membership is set ------------------------------------------------------------------------------


def membership_origin(source: Path, group: str, host: str) -> str | None:
    """'file:line' of the line that makes `host` a member of `group` in an INI inventory (the file, or the files
    of an inventory directory): the host's line in `[group]`, else its line in a child group's section
    (`[group:children]`). None when no INI line says so (YAML, scripts, host ranges)."""
    if not source.exists():
        return None
    files = sorted(p for p in source.iterdir() if p.is_file() and not p.name.startswith(".")) if source.is_dir() \
        else [source]
    for p in files:
        if p.suffix in (".yml", ".yaml", ".json"):
            continue
        try:
            lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        hosts: dict[str, dict[str, int]] = {}  # group -> host -> line
        children: dict[str, list[str]] = {}
        section: str | None = None
        kind = "hosts"
        for n, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section, _, kind = line[1:-1].strip().partition(":")
                kind = kind or "hosts"
                continue
            if section is None:
                section, kind = "ungrouped", "hosts"
            name = line.split()[0]
            if kind == "hosts":
                hosts.setdefault(section, {}).setdefault(name, n)
            elif kind == "children":
                children.setdefault(section, []).append(name)
        found = _member_line(group, host, hosts, children, set())
        if found is not None:
            path = p
            with contextlib.suppress(ValueError):
                path = p.relative_to(Path.cwd())
            return f"{path}:{found}"
    return None


def _member_line(group: str, host: str, hosts: dict[str, dict[str, int]], children: dict[str, list[str]],
                 seen: set[str]) -> int | None:
    if group in seen:
        return None
    seen.add(group)
    if host in hosts.get(group, {}):
        return hosts[group][host]
    for child in children.get(group, []):
        found = _member_line(child, host, hosts, children, seen)
        if found is not None:
            return found
    return None


def select_gpu_nodes(fleet: Fleet, limit: str | None) -> list[str]:
    """The GPU nodes `--limit` picks (retry files and regexes are resolved by Ansible itself, on the inventory the
    fleet was read from). The commands and day2's service share it."""
    from provisioner.probes.preflight import select_hosts

    if limit and any(c in limit for c in "@~"):
        from provisioner.runner.config import resolve_limit

        allowed = set(limit_hosts(fleet, resolve_limit(limit)))
        return [h for h in select_hosts(fleet, None) if h in allowed]
    return select_hosts(fleet, limit)
