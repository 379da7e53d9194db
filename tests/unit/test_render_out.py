"""`provision render --out DIR` (issue 43, class 5): every destination lies under DIR (a `..` in vllm_env_file or
vllm_unit_dir, or a directory under DIR that is a symlink out of it, is refused with exit 2), an inventory that fails
validation is refused (exit 1), and in both cases nothing is written; files are written atomically."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cli_inproc import provision
from provisioner import INVENTORIES


@pytest.fixture
def site(tmp_path: Path) -> Path:
    shutil.copytree(INVENTORIES, tmp_path / "inv")
    (tmp_path / "inv" / "host_vars").mkdir()
    return tmp_path


def _host_vars(site: Path, text: str) -> Path:
    (site / "inv" / "host_vars" / "node01.yml").write_text(text)
    return site / "inv" / "rack-a.ini"


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_render_out_writes_every_file_with_its_mode(site: Path) -> None:
    out = site / "out"
    p = provision("render", str(site / "inv" / "rack-a.ini"), "--host", "node01", "--out", str(out))
    assert p.returncode == 0, p.stderr
    env = out / "etc/vllm/vllm.env"
    assert oct(env.stat().st_mode & 0o777) == "0o640" and "VLLM" in env.read_text()
    assert oct((out / "etc/nccl.conf").stat().st_mode & 0o777) == "0o644"
    assert not [f for f in _files(out) if Path(f).name.startswith(".")]  # no temporary file left behind


@pytest.mark.parametrize("var", [
    "vllm_env_file: /etc/vllm/../../../../escaped.env",
    "vllm_unit_dir: /etc/systemd/../../../../../escaped-units",
])
def test_render_out_refuses_a_path_that_leaves_the_directory(site: Path, var: str) -> None:
    inv = _host_vars(site, var + "\n")
    out = site / "deep" / "out"
    p = provision("render", str(inv), "--host", "node01", "--out", str(out))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "outside --out" in p.stderr and "Traceback" not in p.stderr
    assert _files(site / "deep") == [] and not list(site.glob("escaped*"))  # nothing written, anywhere


def test_render_out_refuses_a_symlink_out_of_the_directory(site: Path) -> None:
    out, elsewhere = site / "out", site / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, out / "etc")  # DIR/etc -> outside DIR
    p = provision("render", str(site / "inv" / "rack-a.ini"), "--host", "node01", "--out", str(out))
    assert p.returncode == 2 and "resolves outside --out" in p.stderr, p.stderr
    assert _files(elsewhere) == [] and _files(out) == ["etc"]


def test_render_refuses_an_inventory_that_fails_validation(site: Path) -> None:
    inv = _host_vars(site, "gpu_count: 3\n")  # HW rules: not a valid count for the model
    out = site / "out"
    p = provision("validate", str(inv))
    assert p.returncode == 1
    p = provision("render", str(inv), "--host", "node01", "--out", str(out))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "refusing to render" in p.stderr and _files(out) == []
    p = provision("render", str(inv), "--host", "node01")  # nor printed
    assert p.returncode == 1 and p.stdout == ""


def test_write_atomic_replaces_a_symlink_instead_of_following_it(tmp_path: Path) -> None:
    from provisioner.reports.textfile import write_atomic

    target = tmp_path / "target"
    target.write_text("keep")
    link = tmp_path / "dir" / "file"
    link.parent.mkdir()
    os.symlink(target, link)
    write_atomic(link, "new", 0o600)
    assert target.read_text() == "keep" and not link.is_symlink() and link.read_text() == "new"
    assert oct(link.stat().st_mode & 0o777) == "0o600"
