"""The run directory's collection link under concurrent callers (a sharded run's threads share one run dir), and
the one-line description of an unexpected error (its path kept)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from provisioner import paths
from provisioner.errors import describe


def test_threads_linking_one_run_dir_all_succeed(tmp_path: Path) -> None:
    # the check-then-symlink this replaces failed ~1 in 12 of these rounds with FileExistsError
    failures: list[BaseException] = []
    for i in range(150):
        parent = tmp_path / str(i)
        parent.mkdir()
        gate = threading.Barrier(4)

        def link(parent: Path = parent, gate: threading.Barrier = gate) -> None:
            gate.wait()
            try:
                paths.link_collection(parent)
            except OSError as exc:
                failures.append(exc)

        threads = [threading.Thread(target=link) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        link_path = parent / "collections" / "ansible_collections" / "provisioner" / "gpu"
        assert link_path.is_symlink() and link_path.resolve() == paths.DATA_ROOT.resolve()
        assert sorted(p.name for p in link_path.parent.iterdir()) == ["gpu"]  # no private name left behind
    assert failures == []


def test_a_stale_link_is_replaced(tmp_path: Path) -> None:
    ns = tmp_path / "collections" / "ansible_collections" / "provisioner"
    ns.mkdir(parents=True)
    (ns / "gpu").symlink_to(tmp_path, target_is_directory=True)
    assert paths.link_collection(tmp_path) == tmp_path / "collections"
    assert (ns / "gpu").resolve() == paths.DATA_ROOT.resolve()


def test_describe_keeps_an_oserrors_paths_and_where_it_was_raised(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "x").mkdir()
    ns = tmp_path / "x" / "collections" / "ansible_collections" / "provisioner"
    ns.mkdir(parents=True)
    (ns / "gpu").mkdir()  # a directory where the link goes: os.replace refuses it
    with pytest.raises(OSError) as info:
        paths.link_collection(tmp_path / "x")
    text = describe(info.value)
    assert str(ns / "gpu") in text and text.startswith(type(info.value).__name__ + ": [Errno ")
    assert text.endswith(")") and "(at provisioner/paths.py:" in text
    assert sorted(p.name for p in ns.iterdir()) == ["gpu"]  # the private link made first is removed again
    with pytest.raises(FileExistsError) as info2:
        (tmp_path / "a").mkdir()
    assert repr(info2.value) == "FileExistsError(17, 'File exists')"  # what the shard error used to show
    text2 = describe(info2.value)
    assert text2.startswith("FileExistsError: [Errno 17] File exists: ") and str(tmp_path / "a") in text2
    assert describe(ValueError()) == "ValueError"
