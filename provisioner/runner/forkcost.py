"""Cheaper forked workers in ansible-playbook's main process (called by runner/callback/awx_display.py).

Ansible forks one worker per host and task. `freeze()` at each play start moves the parsed playbook, inventory and
variables into the garbage collector's permanent generation, so the workers neither scan nor copy-on-write them.
`warm(task)` compiles the task's templates and `warm_plugins()` loads the Jinja filters before the workers fork.
`restore()`/`save()` keep the AnsiballZ module payloads between runs (Ansible builds each module's zip once per run in
a temporary directory), keyed by everything that shapes a payload. `PROVISION_FORKCOST=0` turns all of it off,
`PROVISION_FORKCOST_MEMO=0` the compiled templates and filters only.
"""

from __future__ import annotations

import gc
import hashlib
import os
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

#: Environment variable naming the directory that keeps the payloads (RunConfig.ansible_env sets it; unset: none kept).
ENV = "PROVISION_ANSIBALLZ_CACHE"
#: Payloads kept: ansible-core's own modules and this collection's, without extensions (coverage, debugger). Another
#: collection's module can change without anything in the key changing, so its payload is rebuilt each run.
KEPT = re.compile(r"(ansible\.modules|ansible_collections\.provisioner\.gpu\.plugins\.modules)\.[A-Za-z0-9_]+"
                  r"-ZIP_[A-Z]+-none")
#: Key directories not used for this long are removed when a run saves into another one.
STALE_S = 30 * 86400


def freeze() -> None:
    """Move every object alive now into the permanent generation (what the forked workers then share untouched)."""
    gc.freeze()


def key(*, ansible_version: str, ansible_dir: str, python: str, module_path: Iterable[str], plugins_digest: str) -> str:
    """The cache directory's name: a payload is the module's code plus the module_utils it imports, so it depends on
    ansible-core (version and location), the Python, the library path that may shadow a builtin module, and this
    collection's plugins."""
    h = hashlib.sha256()
    for part in (ansible_version, ansible_dir, python, os.pathsep.join(module_path), plugins_digest):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:24]


def tree_digest(root: Path) -> str:
    """sha256 over the files under `root` (relative paths and bytes; caches of compiled Python left out)."""
    h = hashlib.sha256()
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        for f in files:
            h.update(f"{f.relative_to(root)}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def restore(store: Path, local: Path) -> int:
    """Copy the kept payloads from `store` into this run's AnsiballZ cache `local`; how many."""
    if not store.is_dir():
        return 0
    local.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in store.iterdir():
        if KEPT.fullmatch(f.name) and not (local / f.name).exists():
            shutil.copyfile(f, local / f.name)
            n += 1
    os.utime(store)
    return n


def save(local: Path, store: Path) -> int:
    """Copy the payloads this run built (kept names only, not in `store` yet) into `store`, each by an atomic rename;
    remove sibling key directories unused for STALE_S. How many were saved."""
    if not local.is_dir():
        return 0
    new = [f for f in local.iterdir() if KEPT.fullmatch(f.name) and not (store / f.name).exists()]
    if not new:
        return 0
    store.mkdir(parents=True, exist_ok=True, mode=0o700)
    for f in new:
        tmp = store / f".{f.name}.{os.getpid()}"
        shutil.copyfile(f, tmp)
        os.replace(tmp, store / f.name)
    cutoff = time.time() - STALE_S
    for d in store.parent.iterdir():
        if d != store and d.is_dir() and d.stat().st_mtime < cutoff:
            shutil.rmtree(d, ignore_errors=True)
    return len(new)


def store_dir() -> Path | None:
    """This run's store (`$PROVISION_ANSIBALLZ_CACHE/<key>`), or None when the variable is unset. Imports Ansible:
    call it in ansible-playbook's process."""
    base = os.environ.get(ENV)
    if not base:
        return None
    import sys

    import ansible
    from ansible import constants as C
    from ansible.release import __version__

    from provisioner import paths

    return Path(base) / key(ansible_version=__version__, ansible_dir=str(Path(ansible.__file__).parent),
                            python=sys.version, module_path=list(C.DEFAULT_MODULE_PATH or []),
                            plugins_digest=tree_digest(paths.DATA_ROOT / "plugins"))


def local_dir() -> Path:
    """This run's AnsiballZ cache (Ansible's own name for it, in its per-run temporary directory)."""
    from ansible import constants as C

    return Path(C.DEFAULT_LOCAL_TMP) / "ansiballz_cache"


# --- Compiled templates shared with the workers ------------------------------------------------------------------
# ansible-core compiles a Jinja template every time it renders one, so every forked worker compiled its task's
# arguments, conditionals, role defaults and role templates again. `memoize()` keeps compiled templates by source text
# and options (and the search path, for a template that includes); `warm(task)`, called in the main process before
# the task's workers are forked, compiles the task's strings there, so that the workers inherit them. Compiling only
# (never rendering) has no side effect; a string that does not compile is left to the worker, which reports it.

#: The ansible-core series whose (private) compile step the memo wraps was checked against: what a compiled template
#: depends on, and the same bytes rendered with and without it (tests/integration/test_forkcost_memo.py). Another
#: series runs without the memo until it is checked and added here.
CHECKED_SERIES = ("2.21.",)
#: Compiled templates kept (the main process's memo is bounded; a worker's copy dies with the worker).
MEMO_MAX = 20000
_memo: dict[tuple, object] = {}
_originals: dict[str, object] = {}
#: Task keywords whose strings are conditionals (Jinja expressions), and the keywords templated as strings.
_CONDITIONALS = ("when", "changed_when", "failed_when", "until")
_TEMPLATED = ("args", "environment", "loop", "vars", "delegate_to", "notify", "name", "loop_control")


def memoize() -> bool:
    """Wrap ansible-core's template/expression compilation with the memo; False (nothing wrapped) on an ansible-core
    series it was not checked against."""
    from ansible.release import __version__

    if not __version__.startswith(CHECKED_SERIES):
        return False
    try:
        from ansible._internal._templating._engine import TemplateEngine
        from ansible._internal._templating._jinja_bits import AnsibleTemplate, AnsibleTemplateExpression
    except ImportError:
        return False
    if getattr(TemplateEngine, "_provisioner_memo", False):
        return True
    kinds = {"_compile_template": AnsibleTemplate, "_compile_expression": AnsibleTemplateExpression}
    if not all(hasattr(TemplateEngine, name) for name in kinds):
        return False
    for name, good in kinds.items():
        orig = getattr(TemplateEngine, name)
        _originals[name] = orig
        setattr(TemplateEngine, name, _memoized(name, orig, good))
    TemplateEngine._provisioner_memo = True
    return True


def forget() -> None:
    """Undo `memoize()` and empty the memo (tests)."""
    from ansible._internal._templating._engine import TemplateEngine

    for name, orig in _originals.items():
        setattr(TemplateEngine, name, orig)
    _originals.clear()
    _memo.clear()
    TemplateEngine._provisioner_memo = False


#: Jinja consults the environment's loader (its search path) only for these statements; a template without them
#: compiles the same whatever the search path.
_LOADER_WORDS = re.compile(r"\b(include|import|extends)\b")


def _memoized(kind: str, orig, good: type):
    def compile_(self, template, options):
        try:
            source = str.__str__(template)
            where = None
            if _LOADER_WORDS.search(source):
                loader = self.environment.loader
                where = tuple(map(str, getattr(loader, "searchpath", ()) or ())) or self.basedir
            key = (kind, source, options, where)
            hit = _memo.get(key)
        except TypeError:  # an unhashable option: compile as ansible-core does
            return orig(self, template, options)
        if hit is not None:
            return hit
        compiled = orig(self, template, options)
        if isinstance(compiled, good) and len(_memo) < MEMO_MAX:  # compile errors stay deferred, never kept
            _memo[key] = compiled
        return compiled

    return compile_


def warm_plugins() -> None:
    """Load the builtin Jinja filters and tests in this (the main) process: each worker loaded them again otherwise."""
    from ansible.plugins.loader import filter_loader, test_loader

    filter_loader.get("default")  # the first lookup loads every builtin one
    test_loader.get("defined")


def _strings(value, out: list[str], depth: int = 0) -> None:
    if depth > 8:
        return
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, out, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _strings(v, out, depth + 1)


def warm(task) -> int:
    """Compile `task`'s templated strings, its conditionals and the role templates it renders in this (the main)
    process, so that the workers forked for it find them compiled. How many were compiled now."""
    if not _originals:  # no memo: nothing would be kept
        return 0
    from ansible._internal._templating._engine import TemplateEngine, TemplateOptions
    from ansible._internal._templating._jinja_bits import is_possibly_all_template

    engine = TemplateEngine()
    n = _compile_templates(engine, [getattr(task, attr, None) for attr in _TEMPLATED])
    try:
        n += _warm_files(task, engine)
    except Exception:  # a speed-up only: the workers compile what was not warmed
        pass
    cond = TemplateOptions(escape_backslashes=False, preserve_trailing_newlines=False)
    conds: list[str] = []
    _strings([getattr(task, attr, None) for attr in _CONDITIONALS], conds)
    for c in conds:
        c = c.strip()
        if c and not is_possibly_all_template(c):
            n += _compile(engine._compile_expression, c, cond)
    return n


def warm_play(play) -> int:
    """Compile the defaults and vars of the play's roles (templated lazily, in each worker that reads them)."""
    if not _originals:
        return 0
    from ansible._internal._templating._engine import TemplateEngine

    return _compile_templates(TemplateEngine(), [(role.get_default_vars(), role.get_vars(include_params=False))
                                                 for role in play.get_roles()])


def _compile_templates(engine, values) -> int:
    """Compile, with the default options, each distinct string in `values` that may be a template."""
    from ansible._internal._templating._engine import TemplateOptions
    from ansible._internal._templating._jinja_bits import is_possibly_template

    found: list[str] = []
    _strings(values, found)
    return sum(_compile(engine._compile_template, s, TemplateOptions.DEFAULT)
               for s in dict.fromkeys(found) if is_possibly_template(s))


#: Action arguments naming a role template that the collection's actions render (plugin_utils/render.py).
_FILE_ARGS = ("src", "pin_src")


def _warm_files(task, engine) -> int:
    """Compile the role templates `task` renders (provisioner_file's `src`, provisioner_apt's `pin_src`) with the
    options plugin_utils/render.py uses. A templated `src` is looked up by its last path part: the memo is keyed by
    the template's text, so a wrong guess costs one compile and never changes what a worker renders."""
    if not str(getattr(task, "action", "")).startswith("provisioner.gpu.provisioner_"):
        return 0
    from ansible._internal._templating._engine import TemplateOptions
    from ansible.template import Templar, trust_as_template

    from provisioner import paths

    args = getattr(task, "args", None) or {}
    srcs = [src for src in (args.get(arg) for arg in _FILE_ARGS) if isinstance(src, str)]
    if not srcs:
        return 0
    options = TemplateOptions(escape_backslashes=False, overrides=Templar()._overrides.merge(_render_overrides()))
    dirs = [*(Path(p) / "templates" for p in task.get_search_path()), paths.TEMPLATES]
    n = 0
    for src in srcs:
        name = src.rsplit("}}", 1)[-1].lstrip("/")
        f = next((d / name for d in dirs if (d / name).is_file()), None)
        if f is not None:
            n += _compile(engine._compile_template, trust_as_template(f.read_text(encoding="utf-8")), options)
    return n


def _render_overrides() -> dict:
    """plugin_utils/render.py's Jinja overrides (the collection's module, importable in ansible-playbook only)."""
    import importlib

    return importlib.import_module("ansible_collections.provisioner.gpu.plugins.plugin_utils.render").OVERRIDES


def _compile(fn, source: str, options) -> int:
    size = len(_memo)
    try:
        fn(source, options)
    except Exception:
        return 0
    return len(_memo) - size
