"""What a new operator meets in the first hour (issue 28): one finding per line at any width (item 4), HW008 pointing
at the membership (item 6), `provision --version` and bare `provision` (item 7), and the small ones (item 10): one
`run dir:`, no Ansible warning before our own `--limit` error, `1 host`. All in-process; nothing reaches a host (the
run is replaced by a synthetic result)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cli_inproc import provision
from provisioner import INVENTORIES, __version__
from provisioner.reports import drift_text, run_text
from provisioner.results import DriftItem, RunResult

LONG = "tensor_parallel_size x pipeline_parallel_size = 8 x 1 = 8, but the 2 member(s) have 16 GPUs in all"


@pytest.fixture
def two_clusters(tmp_path: Path) -> Path:
    """inventories/ with node01 also in llama31_70b (line 24 of rack-a.ini): HW008, and CL003 (a long message)."""
    shutil.copytree(INVENTORIES, tmp_path / "inv")
    ini = tmp_path / "inv" / "rack-a.ini"
    lines = ini.read_text().splitlines()
    at = lines.index("[llama31_70b]")
    lines.insert(at + 2, "node01 node_rank=1")
    ini.write_text("\n".join(lines) + "\n")
    return ini


@pytest.mark.parametrize("columns", [None, 40, 80])
def test_validate_prints_one_finding_per_line(two_clusters: Path, columns: int | None) -> None:
    p = provision("validate", str(two_clusters), columns=columns)
    assert p.returncode == 1, p.stderr
    findings = [ln for ln in p.stdout.splitlines() if ln.startswith(("error", "warning"))]
    assert len(findings) == 3, p.stdout
    (cl003,) = [ln for ln in findings if " CL003 " in ln]
    assert LONG in cl003
    assert "group_vars/llama31_70b.yml:10)" in cl003
    summary = p.stdout.splitlines()[-1]
    assert summary.endswith("4 hosts, 3 clusters: invalid (3 error(s), 0 warning(s))"), summary


@pytest.mark.parametrize("command", ["run", "drift"])
def test_run_and_drift_refusals_print_one_finding_per_line(two_clusters: Path, command: str) -> None:
    p = provision(command, str(two_clusters), columns=40)
    assert p.returncode == 1, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error")]
    assert len(errors) == 3 and any(LONG in ln for ln in errors), p.stderr


def test_host_in_two_clusters_points_at_the_memberships(two_clusters: Path) -> None:
    p = provision("validate", str(two_clusters), cwd=two_clusters.parent)
    (hw008,) = [ln for ln in p.stdout.splitlines() if " HW008 " in ln]
    assert hw008.endswith("keep it in one (set in rack-a.ini:19, rack-a.ini:24)"), hw008
    assert "group_vars" not in hw008


def test_version() -> None:
    p = provision("--version")
    assert (p.returncode, p.stdout, p.stderr) == (0, f"provision {__version__}\n", "")


def test_bare_provision_shows_the_help_not_an_empty_error() -> None:
    p = provision()
    assert p.returncode == 2
    assert "Usage:" in p.stdout and "validate" in p.stdout
    assert "error" not in p.stderr


def test_unmatched_limit_prints_only_our_line() -> None:
    p = provision("run", str(INVENTORIES / "rack-a.ini"), "--limit", "node99")
    assert p.returncode == 2
    assert p.stderr.splitlines() == [f"error: {INVENTORIES / 'rack-a.ini'}: no hosts match --limit node99"], p.stderr


def _result(run_dir: Path, hosts: list[str], check: bool) -> RunResult:
    r = RunResult(command="drift" if check else "run", inventory="rack-a.ini", playbook="site.yml",
                  run_dir=str(run_dir), artifact_dir=str(run_dir / "artifacts"), started=0.0, check=check,
                  targeted=hosts)
    for h in hosts:
        r.host(h).seen = True
    return r


def test_text_drift_names_the_run_dir_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import provisioner.runner as runner

    def fake_run(*args: object, **kw: object) -> RunResult:
        r = _result(tmp_path, ["node01"], check=True)
        r.hosts["node01"].changed = 1
        r.hosts["node01"].drift.append(DriftItem(host="node01", task="t", kind="file", resource="/etc/nccl.conf"))
        return r

    monkeypatch.setattr(runner, "run_playbook", fake_run)
    p = provision("drift", str(INVENTORIES / "rack-a.ini"), "--limit", "node01")
    assert p.returncode == 3, p.stderr
    assert (p.stdout + p.stderr).count("run dir:") == 1, (p.stdout, p.stderr)
    assert "drift: 1 resource on 1 host of 1 checked" in p.stdout


def test_summaries_say_one_host(tmp_path: Path) -> None:
    r = _result(tmp_path, ["node01"], check=False)
    r.hosts["node01"].changed = 1
    assert "1 host in 0.0s: 0 failed, 0 unreachable, 1 change\n" in run_text.render(r)
    r = _result(tmp_path, ["node01", "node02"], check=True)
    assert "drift: 0 resources on 0 hosts of 2 checked" in drift_text.render(r)
