"""provisioner.runner.forkcost: which AnsiballZ payloads are kept between runs, under which key, and the frozen GC."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import pytest

from provisioner import paths
from provisioner.runner import forkcost
from provisioner.runner.config import RunConfig

BUILTIN = "ansible.modules.stat-ZIP_DEFLATED-none"
OURS = "ansible_collections.provisioner.gpu.plugins.modules.provisioner_apt-ZIP_DEFLATED-none"
OTHERS = ("ansible_collections.community.general.plugins.modules.ufw-ZIP_DEFLATED-none",  # another collection
          "ansible.modules.stat-ZIP_DEFLATED-coverage",  # an extension
          BUILTIN + ".lock")


def _local(tmp_path: Path) -> Path:
    local = tmp_path / "run" / "ansiballz_cache"
    local.mkdir(parents=True)
    for name in (BUILTIN, OURS, *OTHERS):
        (local / name).write_bytes(name.encode())
    return local


def test_save_keeps_builtin_and_own_payloads_only(tmp_path: Path) -> None:
    store = tmp_path / "store" / "k1"
    assert forkcost.save(_local(tmp_path), store) == 2
    assert sorted(p.name for p in store.iterdir()) == sorted([BUILTIN, OURS])
    assert (store / OURS).read_bytes() == OURS.encode()
    assert store.stat().st_mode & 0o777 == 0o700
    assert forkcost.save(tmp_path / "run" / "ansiballz_cache", store) == 0  # nothing new


def test_restore_fills_a_fresh_run(tmp_path: Path) -> None:
    store = tmp_path / "store" / "k1"
    forkcost.save(_local(tmp_path), store)
    fresh = tmp_path / "run2" / "ansiballz_cache"
    assert forkcost.restore(store, fresh) == 2
    assert (fresh / BUILTIN).read_bytes() == BUILTIN.encode()
    assert forkcost.restore(tmp_path / "missing", tmp_path / "run3") == 0


def test_save_prunes_key_directories_unused_for_a_month(tmp_path: Path) -> None:
    old, recent = tmp_path / "store" / "old", tmp_path / "store" / "recent"
    for d in (old, recent):
        d.mkdir(parents=True)
        (d / BUILTIN).write_text("x")
    past = time.time() - forkcost.STALE_S - 60
    os.utime(old, (past, past))
    forkcost.save(_local(tmp_path), tmp_path / "store" / "k1")
    assert not old.exists() and recent.exists()


def test_key_changes_with_each_input() -> None:
    base = {"ansible_version": "2.21.5", "ansible_dir": "/venv/ansible", "python": "3.13.1",
            "module_path": ["/usr/share/ansible/plugins/modules"], "plugins_digest": "abc"}
    keys = {forkcost.key(**base)}
    for field, value in (("ansible_version", "2.21.6"), ("ansible_dir", "/other/ansible"), ("python", "3.12.0"),
                         ("module_path", ["/site/library"]), ("plugins_digest", "abd")):
        keys.add(forkcost.key(**{**base, field: value}))
    assert len(keys) == 6


def test_tree_digest_follows_content_not_bytecode(tmp_path: Path) -> None:
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "m.py").write_text("A = 1\n")
    first = forkcost.tree_digest(tmp_path)
    (tmp_path / "modules" / "__pycache__").mkdir()
    (tmp_path / "modules" / "__pycache__" / "m.cpython-313.pyc").write_bytes(b"\0")
    assert forkcost.tree_digest(tmp_path) == first
    (tmp_path / "modules" / "m.py").write_text("A = 2\n")
    assert forkcost.tree_digest(tmp_path) != first


def test_store_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(forkcost.ENV, raising=False)
    assert forkcost.store_dir() is None
    monkeypatch.setenv(forkcost.ENV, str(tmp_path))
    store = forkcost.store_dir()
    assert store is not None and store.parent == tmp_path and len(store.name) == 24


def test_run_environment_names_the_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(forkcost.ENV, raising=False)
    env = RunConfig(inventory=tmp_path / "hosts.ini").ansible_env(tmp_path)
    assert env[forkcost.ENV] == str(paths.ansiballz_dir())


def test_freeze_moves_live_objects_to_the_permanent_generation() -> None:
    before = gc.get_freeze_count()
    keep = [object() for _ in range(10)] + [[i] for i in range(1000)]
    try:
        forkcost.freeze()
        assert gc.get_freeze_count() >= before + 1000
    finally:
        gc.unfreeze()
    assert keep


# --- compiled templates shared with the workers ------------------------------------------------------------------

def test_memo_is_active_on_the_installed_ansible_core() -> None:
    """The memo wraps a private ansible-core step, checked per series (forkcost.CHECKED_SERIES): an ansible-core from
    another series fails here, so that it is checked (tests/integration/test_forkcost_memo.py) before it is added."""
    try:
        assert forkcost.memoize(), "ansible-core series not in forkcost.CHECKED_SERIES: check it, then add it"
    finally:
        forkcost.forget()


@pytest.fixture
def memo():
    assert forkcost.memoize()
    yield forkcost._memo
    forkcost.forget()


def _templar(searchpath: list[str] | None = None, **variables):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.copy_with_new_env(searchpath=searchpath) if searchpath else templar


def test_memo_compiles_once_and_renders_each_hosts_values(memo) -> None:
    from ansible.template import trust_as_template

    source = trust_as_template("{{ name }} has {{ gpus * 2 }} halves")
    assert _templar(name="node01", gpus=8).template(source) == "node01 has 16 halves"
    assert len(memo) == 1
    assert _templar(name="node02", gpus=4).template(source) == "node02 has 8 halves"
    assert len(memo) == 1  # the second host reused the compiled template, with its own values


def test_memo_keys_on_options(memo) -> None:
    from ansible.template import trust_as_template

    source = trust_as_template("{% if on %}\nyes\n{% endif %}\n")
    kept = _templar(on=True).template(source, overrides={"trim_blocks": True})
    raw = _templar(on=True).template(source, overrides={"trim_blocks": False})
    assert (kept, raw) == ("yes\n", "\nyes\n")
    assert len(memo) == 2


def test_memo_keys_an_including_template_on_its_search_path(memo, tmp_path: Path) -> None:
    from ansible.template import trust_as_template

    for site in ("a", "b"):
        (tmp_path / site).mkdir()
        (tmp_path / site / "part.j2").write_text(f"site {site}")
    source = trust_as_template("{% include 'part.j2' %}")
    assert _templar([str(tmp_path / "a")]).template(source) == "site a"
    assert _templar([str(tmp_path / "b")]).template(source) == "site b"


def test_memo_never_keeps_a_template_that_does_not_compile(memo) -> None:
    from ansible.errors import AnsibleError
    from ansible.template import trust_as_template

    for _ in range(2):
        with pytest.raises(AnsibleError):
            _templar().template(trust_as_template("{{ broken( }}"))
    assert len(memo) == 0


def test_warm_compiles_a_tasks_strings_that_its_workers_then_reuse(memo) -> None:
    from ansible.parsing.dataloader import DataLoader
    from ansible.playbook.task import Task
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import trust_as_template

    init_plugin_loader()
    ds = {"name": "write", "ansible.builtin.debug": {"msg": trust_as_template("{{ greeting }} {{ who }}")},
          "when": [trust_as_template("ready == 'yes'")], "changed_when": False}
    task = Task.load(ds, loader=DataLoader())
    assert forkcost.warm(task) == 2  # the argument (a template) and the conditional (an expression)
    size = len(memo)
    templar = _templar(greeting="hi", who="node01", ready="yes")
    assert templar.template(task.args["msg"]) == "hi node01"
    assert templar.evaluate_conditional(task.when[0]) is True
    assert len(memo) == size  # both found compiled

