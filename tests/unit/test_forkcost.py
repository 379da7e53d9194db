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
