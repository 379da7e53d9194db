"""Data and helpers shared by tests/unit/test_vllm_wheelhouse.py (in-process)
and tests/integration/test_vllm_wheelhouse_process.py (its process cases)."""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

DPKG_STATUS = """Package: bash
Status: install ok installed
Version: 5.2.15-2+b7

Package: python3.11-minimal
Status: install ok installed
Version: 3.11.2-6+deb12u8

Package: libc6
Status: install ok installed
Priority: optional
Version: 2.36-9+deb12u14
Description: GNU C Library: Shared libraries
 Contains the standard libraries.
"""


def _wheel(d: Path, name: str, version: str, tag: str, requires: tuple[str, ...] = ()) -> Path:
    p = d / f"{name}-{version}-{tag}.whl"
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(p, "w") as z:
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n")
        z.writestr(f"{info}/RECORD", "")
    return p


def _isolated_pip_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, conf: str = "") -> None:
    for var in list(__import__("os").environ):
        if var.startswith("PIP_") or var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
            monkeypatch.delenv(var)
    (tmp_path / "pip.conf").write_text(conf)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "pip.conf"))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")


@pytest.fixture()
def untrusted_https_index(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A local HTTPS simple index with a self-signed certificate (what a TLS-inspecting proxy looks like to a
    client without its CA). Yields (index URL, the certificate)."""
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "ca.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    docs = tmp_path / "index"
    (docs / "simple").mkdir(parents=True)
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(docs))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/simple", cert
    finally:
        server.shutdown()
