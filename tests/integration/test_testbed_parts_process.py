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


def test_repo_server_serves_the_same_over_https_trusted_through_the_racks_ca_only(tmp_path: Path) -> None:
    import ssl
    import urllib.error
    import urllib.request

    from provisioner_testbed import tls

    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "InRelease").write_text("signed")
    tls.ensure(tmp_path / "tls", "127.0.0.1", "test repo CA")
    assert (os.stat(tmp_path / "tls" / "server.key").st_mode & 0o777) == 0o600
    p = serve.start("127.0.0.1:18094", {"/nvidia/": tmp_path / "repo"}, tmp_path / "log",
                    tls=("127.0.0.1:18095", tmp_path / "tls"))
    try:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "tls" / "ca.pem"))
        got = urllib.request.urlopen("https://127.0.0.1:18095/nvidia/InRelease", timeout=5, context=ctx).read()
        assert got == b"signed"
        try:  # the system's trust store alone does not know the rack's CA
            urllib.request.urlopen("https://127.0.0.1:18095/nvidia/InRelease", timeout=5,
                                   context=ssl.create_default_context())
            raise AssertionError("an unknown CA was trusted")
        except urllib.error.URLError as e:
            assert "CERTIFICATE_VERIFY_FAILED" in str(e.reason)
        assert urllib.request.urlopen("http://127.0.0.1:18094/nvidia/InRelease", timeout=5).read() == b"signed"
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
