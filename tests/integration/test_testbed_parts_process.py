"""The parts of tests/unit/test_testbed_parts.py that need a real process (moved from the unit lane, which runs in-process)."""
from __future__ import annotations
import os
import subprocess
import sys
from pathlib import Path
from provisioner_testbed import serve
from provisioner_testbed.state import Proc


def test_repo_server_serves_files_over_http(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    (tmp_path / "InRelease").write_text("signed")
    p = serve.start("127.0.0.1:18093", {"/nvidia/": tmp_path}, tmp_path / "log")
    try:
        assert urllib.request.urlopen("http://127.0.0.1:18093/nvidia/InRelease", timeout=5).read() == b"signed"
        for url in ("http://127.0.0.1:18093/nvidia/", "http://127.0.0.1:18093/nvidia/missing"):
            try:
                urllib.request.urlopen(url, timeout=5)
                raise AssertionError(url)
            except urllib.error.HTTPError as e:
                assert e.code in (403, 404)
    finally:
        os.kill(p.pid, 15)
        os.waitpid(p.pid, 0)


def test_a_recycled_pid_is_not_our_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        p = Proc.of(child.pid)
        assert p is not None and p.alive()
        assert not Proc(child.pid, p.start + 1).alive()  # same pid, other start time
        assert Proc.from_json(p.to_json()) == p
    finally:
        child.kill()
        child.wait()
    assert not p.alive()
