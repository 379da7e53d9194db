"""Supply-chain rules (SUP0xx): each message names where the value is set (group or host, the variable, the file),
the value found and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_inproc import provision
from inventory_factory import BASE_INI, gpu_nodes, write_inventory
from rules_helpers import findings

from provisioner.defaults import role_default
from provisioner.inventory import load_fleet
from provisioner.rules import build_context, run_rules
from provisioner.rules.supply import _pip_options


def test_plain_http_pip_index_is_a_warning_naming_group_variable_value_and_fix(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "SUP001", group_vars=gpu_nodes(vllm_pip_index_url="http://pypi.site/simple/"))
    assert (f.severity, f.group, f.host, f.var) == ("warning", "gpu_nodes", None, "vllm_pip_index_url")
    assert "'http://pypi.site/simple/'" in f.message and "https" in f.message and "site_ca_certificates" in f.message
    assert "group_vars/gpu_nodes.yml" in f.message  # where it is set


def test_pip_options_in_extra_args_each_get_their_code(tmp_path: Path) -> None:
    args = "--no-cache-dir --trusted-host pypi.site -i http://pypi.site/simple --extra-index-url=https://two/simple"
    fs = findings(tmp_path, host_vars={"n1": {"vllm_pip_extra_args": args}})
    got = sorted((f.code, f.host, f.var) for f in fs if f.code.startswith("SUP"))
    assert got == [("SUP001", "n1", "vllm_pip_extra_args"), ("SUP002", "n1", "vllm_pip_extra_args"),
                   ("SUP003", "n1", "vllm_pip_extra_args")]
    by = {f.code: f.message for f in fs}
    assert "--index-url http://pypi.site/simple" in by["SUP001"]
    assert "--trusted-host pypi.site" in by["SUP002"] and "site_ca_certificates" in by["SUP002"]
    assert "--extra-index-url https://two/simple" in by["SUP003"] and "vllm_pip_index_url" in by["SUP003"]


def test_trusted_host_in_any_pip_extra_args_is_an_error_naming_file_group_host_and_variable(tmp_path: Path) -> None:
    fs = findings(tmp_path, "SUP002", group_vars=gpu_nodes(vllm_pip_extra_args="--trusted-host=198.18.9.11"),
                  host_vars={"n2": {"site_tool_pip_extra_args": "--no-cache-dir --trusted-host mirror.site"}})
    got = {(f.severity, f.group, f.host, f.var) for f in fs}
    assert got == {("error", "gpu_nodes", None, "vllm_pip_extra_args"),
                   ("error", None, "n2", "site_tool_pip_extra_args")}
    by = {f.var: f.message for f in fs}
    assert "--trusted-host 198.18.9.11" in by["vllm_pip_extra_args"] and "https" in by["vllm_pip_extra_args"]
    assert "group_vars/gpu_nodes.yml" in by["vllm_pip_extra_args"]  # the file it is set in
    assert "site_tool_pip_extra_args: --trusted-host mirror.site" in by["site_tool_pip_extra_args"]
    assert "host_vars/n2.yml" in by["site_tool_pip_extra_args"]


@pytest.mark.parametrize(("args", "want"), [
    ("-ihttp://a/simple", [("-i", "http://a/simple")]),
    ("--find-links=http://w/ --pre", [("--find-links", "http://w/"), ("--pre", None)]),
    ("'--trusted-host' 'a b'", [("--trusted-host", "a b")]),
    ("--trusted-host", [("--trusted-host", None)]),
    ("--index-url 'unterminated", [("--index-url", "'unterminated")]),  # shlex refuses: split on spaces
])
def test_pip_option_parsing(args: str, want: list[tuple[str, str | None]]) -> None:
    assert list(_pip_options(args)) == want


def test_a_requirement_by_plain_http_url_is_a_warning(tmp_path: Path) -> None:
    fs = findings(tmp_path, "SUP001", group_vars=gpu_nodes(vllm_pip_extra_packages=[
        "ray[default]==2.52.0", "flashinfer @ http://wheels.site/flashinfer-0.5-py3-none-any.whl",
        "other @ https://wheels.site/other.whl"]))
    assert [(f.var, f.group) for f in fs] == [("vllm_pip_extra_packages", "gpu_nodes")]
    assert "flashinfer @ http://wheels.site" in fs[0].message


def test_https_templated_and_vaulted_values_pass(tmp_path: Path) -> None:
    fs = findings(tmp_path, group_vars=gpu_nodes(vllm_pip_index_url="{{ site_pypi }}",
                                                 vllm_pip_extra_args="--no-cache-dir",
                                                 nvidia_repo_url="https://mirror/cuda/"))
    assert [f for f in fs if f.code.startswith("SUP")] == []


def test_plain_http_apt_repo_is_a_warning(tmp_path: Path) -> None:
    fs = findings(tmp_path, "SUP004", group_vars=gpu_nodes(nvidia_repo_url="http://mirror/cuda/"),
                  host_vars={"n2": {"infiniband_doca_repo_url": "HTTP://mirror/doca/"}})
    assert {(f.group, f.host, f.var) for f in fs} == {
        (None, "n2", "infiniband_doca_repo_url"), ("gpu_nodes", None, "nvidia_repo_url")}
    assert all(f.severity == "warning" and "signature" in f.message for f in fs)
    assert all(f"set {f.var} to the mirror's https:// URL" in f.message and "site_ca_certificates" in f.message
               for f in fs)  # what to set, by name


def test_fingerprint_pins(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "SUP005", group_vars=gpu_nodes(nvidia_repo_key_fingerprints=["A4B469963BF863CC"]))
    assert f.severity == "error" and "a key id, not a fingerprint" in f.message and "40 hex" in f.message
    (f,) = findings(tmp_path / "b", "SUP005", group_vars=gpu_nodes(infiniband_stack="doca"))
    assert (f.group, f.var) == ("gpu_nodes", "infiniband_stack") and "2 host(s): n1, n2" in f.message
    assert "infiniband_doca_repo_key_fingerprints" in f.message and "gpg --show-keys" in f.message
    assert findings(tmp_path / "c", "SUP005", group_vars=gpu_nodes(
        nvidia_repo_key_fingerprints="eb693b3035cd5710e231e123a4b469963bf863cc")) == []


def test_the_site_apt_repository_is_checked_like_the_nvidia_one(tmp_path: Path) -> None:
    """site_apt_repo_* (the lb/monitoring hosts' source at an air-gapped site): plain HTTP warned, a key id refused."""
    (f,) = findings(tmp_path, "SUP004", group_vars=gpu_nodes(site_apt_repo_url="http://mirror:8091/apt/debian12/"))
    assert f.var == "site_apt_repo_url" and "set site_apt_repo_url to the mirror's https:// URL" in f.message
    (f,) = findings(tmp_path / "b", "SUP005", group_vars=gpu_nodes(site_apt_repo_key_fingerprints=["A4B469963BF863CC"]))
    assert f.var == "site_apt_repo_key_fingerprints" and "a key id, not a fingerprint" in f.message


def test_the_role_default_pins_nvidias_cuda_key() -> None:
    """NVIDIA's published fingerprint of key 3bf863cc (github.com/NVIDIA/cuda-repo-management SIGNATURES.md)."""
    assert role_default("nvidia_driver", "nvidia_repo_key_fingerprints") == [
        "EB693B3035CD5710E231E123A4B469963BF863CC"]
    assert role_default("infiniband", "infiniband_doca_repo_key_fingerprints") == []


MIRROR_INI = BASE_INI + "\n[bundle_mirror]\nm1 ansible_host=10.0.0.9\n"
CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY_SECRET = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"
KEY = f"-----BEGIN PRIVATE KEY-----\n{KEY_SECRET}\n-----END PRIVATE KEY-----\n"


def test_a_mirror_without_its_certificate_and_key_is_an_error_naming_host_group_and_file(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "SUP006", ini=MIRROR_INI)
    assert (f.severity, f.host, f.group, f.var) == ("error", "m1", "bundle_mirror", "bundle_mirror_tls_certificate")
    assert f.message.startswith("m1 (group bundle_mirror in hosts.ini) serves the bundle over HTTPS")
    assert "found certificate not set, key not set" in f.message and "site_ca_certificates" in f.message
    # a key that is not PEM: named as such, its value never shown, the file it is set in named
    (f,) = findings(tmp_path / "b", "SUP006", ini=MIRROR_INI, host_vars={"m1": {
        "bundle_mirror_tls_certificate": CERT, "bundle_mirror_tls_key": KEY_SECRET}})
    assert f.var == "bundle_mirror_tls_key" and "found certificate PEM, key not a PEM private key" in f.message
    assert KEY_SECRET not in f.message and "host_vars/m1.yml" in f.message
    (f,) = findings(tmp_path / "c", "SUP006", ini=MIRROR_INI, group_vars={"bundle_mirror": {
        "bundle_mirror_tls_certificate": "", "bundle_mirror_tls_key": KEY}})
    assert "found certificate empty, key PEM" in f.message and "group_vars/bundle_mirror.yml" in f.message


def test_a_mirror_with_both_or_plain_http_apt_only_passes(tmp_path: Path) -> None:
    assert findings(tmp_path, "SUP006", ini=MIRROR_INI, group_vars={"bundle_mirror": {
        "bundle_mirror_tls_certificate": CERT, "bundle_mirror_tls_key": KEY}}) == []
    assert findings(tmp_path / "b", "SUP006", ini=MIRROR_INI, host_vars={"m1": {
        "bundle_mirror_tls": False, "bundle_mirror_http_port": 8090}}) == []
    (f,) = findings(tmp_path / "c", "SUP006", ini=MIRROR_INI, host_vars={"m1": {"bundle_mirror_tls": "false"}})
    assert f.var == "bundle_mirror_tls" and "bundle_mirror_http_port is not set" in f.message
    assert findings(tmp_path / "d", "SUP006") == []  # no mirror, nothing to check


def test_a_vaulted_key_passes_without_being_read(tmp_path: Path) -> None:
    from provisioner_testbed.inventory_writer import vault_encrypter

    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    vaulted = vault_encrypter(pw)("bundle_mirror_tls_key", KEY)
    inv = write_inventory(tmp_path / "inv", ini=MIRROR_INI, files={"host_vars/m1.yml": (
        f"bundle_mirror_tls_certificate: |\n  {CERT.replace(chr(10), chr(10) + '  ').rstrip()}\n"
        "bundle_mirror_tls_key: !vault |\n" + "".join(f"  {ln}\n" for ln in vaulted.splitlines()))})
    fleet = load_fleet(inv)
    assert [f for f in run_rules(fleet, build_context(fleet)) if f.code == "SUP006"] == []


def test_run_refuses_the_mirror_playbook_before_any_host(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path / "inv", ini=MIRROR_INI, host_vars={"m1": {"bundle_mirror_tls_key": KEY}})
    p = provision("run", str(inv), "--playbook", "playbooks/bundle_mirror.yml", columns=400,
                  env={"PROVISION_RUNS_DIR": str(tmp_path / "runs")})
    assert p.returncode == 1, p.stdout + p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if "SUP006" in ln]
    assert "m1" in line and "bundle_mirror_tls_certificate" in line and KEY_SECRET not in p.stdout + p.stderr
    assert "PLAY" not in p.stdout and "Traceback" not in p.stderr
