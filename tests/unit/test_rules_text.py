"""Hostile values (issue 43, class 2): rules TXT001/TXT002, fullmatch validators, the templates' own escaping."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from inventory_factory import cluster, gpu_nodes, write_inventory
from provisioner import plan, render
from provisioner.inventory import load_fleet
from provisioner.rules.text import CONTROL_RE
from rules_helpers import findings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("ch", ["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\x9b", "\u2028", "\u2029"])
def test_every_control_character_is_refused(tmp_path: Path, ch: str) -> None:
    fs = findings(tmp_path, "TXT001", group_vars=cluster(extra_args=[f"--x{ch}y"]))
    assert len(fs) == 1, fs
    f = fs[0]
    assert (f.group, f.var) == ("c1", "vllm_cluster")
    assert f"U+{ord(ch):04X}" in f.message and "vllm_cluster.extra_args[0]" in f.message
    assert "ExecStart=" in f.message  # the file it would reach


def test_message_names_variable_host_and_file(tmp_path: Path) -> None:
    fs = findings(tmp_path, "TXT001", host_vars={"n2": {"vllm_env_extra": {"A": "1\nVLLM_API_KEY=evil"}}})
    assert [(f.host, f.group, f.var) for f in fs] == [("n2", None, "vllm_env_extra")]
    line = fs[0].line()
    assert line.startswith("TXT001 n2 (vllm_env_extra): vllm_env_extra.A holds a newline (U+000A) at character 2")
    assert "/etc/vllm/vllm.env" in line and "host_vars/n2.yml" in line


def test_group_value_reported_once_on_the_group(tmp_path: Path) -> None:
    fs = findings(tmp_path, "TXT001", group_vars=gpu_nodes(nccl_extra={"NCCL_DEBUG": "WARN\nNCCL_NET=Socket"}))
    assert [(f.group, f.host) for f in fs] == [("gpu_nodes", None)]
    assert "/etc/nccl.conf" in fs[0].message


def test_keys_and_nested_values_are_checked(tmp_path: Path) -> None:
    fs = findings(tmp_path, "TXT001", group_vars={"all": {"monitoring_external_labels": {"a\nb": "x"},
                                                          "deep": {"x": [{"y": "\x00"}]}}})
    assert {f.var for f in fs} == {"monitoring_external_labels", "deep"}
    assert any("deep.x[0].y" in f.message for f in fs)


def test_host_and_group_names(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, ini="[gpu_nodes]\nn1 ansible_host=10.0.0.1\nn2 ansible_host=10.0.0.2\n\n"
                                        "[c1]\nn1 node_rank=0\nn2 node_rank=1\n", base=True)
    # YAML inventories can spell any group or host name
    (inv.parent / "hosts.yml").write_text(
        'all:\n  children:\n    gpu_nodes:\n      hosts:\n        "n1\\nx": {ansible_host: 10.0.0.1}\n'
        '    "c1\\rExecStartPost=/bin/id":\n      hosts:\n        "n1\\nx": {node_rank: 0}\n')
    inv.unlink()
    fleet = load_fleet(inv.parent / "hosts.yml")
    from provisioner.rules import run_rules

    fs = [f for f in run_rules(fleet) if f.code == "TXT001"]
    assert {f.var for f in fs} >= {"inventory_hostname", "(group name)"}


def test_vaulted_values_are_not_read(tmp_path: Path) -> None:
    class EncryptedString:  # the type name is what provisioner.bmc.config.is_vaulted tests
        def __str__(self) -> str:
            raise AssertionError("decrypted")

    from provisioner.rules.text import _walk

    assert list(_walk({"k": EncryptedString()}, "v")) == [("v (key)", "k")]


def test_plain_values_pass(tmp_path: Path) -> None:
    fs = findings(tmp_path, group_vars={**cluster(served_model_name="llama-3.1-70b", extra_args=["--seed=1"]),
                                        **gpu_nodes(nccl_extra={"NCCL_DEBUG": "WARN"},
                                                    vllm_client_networks=["10.0.0.0/8"])})
    assert not [f for f in fs if f.code.startswith("TXT")], fs


@pytest.mark.parametrize(("var", "value"), [("ib_hcas", ["mlx5_0\n"]), ("bootstrap_interface", "eth0\n")])
def test_trailing_newline_fails_the_format_rules_too(tmp_path: Path, var: str, value: object) -> None:
    # `^...$` with re.match accepted "eth0\n"; the validators use fullmatch
    fs = findings(tmp_path, group_vars=gpu_nodes(**{var: value}))
    assert {f.code for f in fs} >= {"TXT001", "HW006" if var == "ib_hcas" else "HW002"}, fs


def test_no_validator_anchors_with_dollar() -> None:
    """Every validator regex is used with fullmatch: no pattern of provisioner/ (rules, bmc, plan) or plugins/ ends
    in `$` without re.M (`$` also matches before a trailing newline)."""
    bad = []
    for path in [*ROOT.joinpath("provisioner").rglob("*.py"), *ROOT.joinpath("plugins").rglob("*.py")]:
        if "probes" in path.parts or "reports" in path.parts:
            continue  # parsers of node output, line by line (re.M)
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("compile", "match")
                    and getattr(node.func, "value", None) is not None
                    and getattr(node.func.value, "id", "") == "re" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                    and node.args[0].value.endswith("$") and len(node.args) == 1
                    and not any(k.arg == "flags" for k in node.keywords)):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, bad


# --- the templates escape for their format (defence in depth behind the rules) -------------------------------------


@pytest.mark.parametrize("arg", ["a\nExecStartPost=/bin/id", "x\r\ny", ";", "a b", '"q"', "%n", "$HOME", "\x85",
                                 "back\\slash"])
def test_systemd_quote_keeps_one_argument_on_one_line(arg: str) -> None:
    q = plan.systemd_quote(arg)
    assert "\n" not in q and "\r" not in q and not CONTROL_RE.search(q)
    assert q.startswith('"') or re.fullmatch(r"[A-Za-z0-9_./:=,@+\-]+", q)


def _rendered(tmp_path: Path, **spec: object) -> dict[str, str]:
    fleet = load_fleet(write_inventory(tmp_path, **spec))  # type: ignore[arg-type]
    return {f.dest: f.content for f in render.host_files(fleet, "n1")}


def test_units_and_env_keep_their_shape(tmp_path: Path) -> None:
    files = _rendered(tmp_path, group_vars={
        **cluster(extra_args=["--x\nExecStartPost=/bin/id"], served_model_name="m\nExecStartPre=/bin/id"),
        **gpu_nodes(nccl_extra={"NCCL_DEBUG": "WARN\nNCCL_NET=Socket"},
                    vllm_env_extra={"A": '1"\nVLLM_API_KEY=evil'}, vllm_user="vllm\nExecStartPre=/bin/id",
                    vllm_home="/h\rExecStopPost=/bin/id", vllm_after_units=["a.service\nExecReload=/bin/id"])})
    unit = files["/etc/systemd/system/vllm.service"]
    assert [ln.split("=")[0] for ln in unit.splitlines() if ln.startswith("Exec")] == ["ExecStart"]
    assert [ln.split("=")[0] for ln in unit.splitlines() if ln.startswith(("User", "WorkingDirectory", "After"))] \
        == ["After", "User", "WorkingDirectory"]
    nccl = files["/etc/nccl.conf"]
    assert not [ln for ln in nccl.splitlines() if ln.startswith("NCCL_NET")]
    env = env_keys(files["/etc/vllm/vllm.env"])
    assert "VLLM_API_KEY" not in env and "NCCL_NET" not in env and env.count("A") == 1, env


def env_keys(text: str) -> list[str]:
    """The keys systemd's EnvironmentFile parser (src/basic/env-file.c) assigns: a double-quoted value runs to the
    next unescaped quote, newlines included; `#` starts a comment at the start of a line."""
    keys, i, n = [], 0, len(text)
    while i < n:
        if text[i] in " \t\n":
            i += 1
            continue
        if text[i] in "#;":
            i = text.find("\n", i) if "\n" in text[i:] else n
            continue
        eq = text.index("=", i)
        keys.append(text[i:eq].strip())
        i = eq + 1
        while i < n and text[i] != "\n":
            if text[i] == "\\":
                i += 2
                continue
            if text[i] in "\"'":
                q, i = text[i], i + 1
                while i < n and text[i] != q:
                    i += 2 if text[i] == "\\" and q == '"' else 1
            i += 1
    return keys


def test_templated_value_cannot_escape_the_sandbox(tmp_path: Path) -> None:
    from provisioner.errors import UsageError
    from provisioner.monitoring import render_monitoring

    fleet = load_fleet(write_inventory(tmp_path, group_vars={"all": {
        "monitoring_scrape_interval": "{{ ''.__class__.__mro__[1].__subclasses__() }}"}}))
    with pytest.raises(UsageError, match="sandbox|unsafe"):
        render_monitoring(fleet)


def test_monitoring_refuses_hostile_values_and_writes_nothing(tmp_path: Path) -> None:
    from cli_inproc import provision

    inv = write_inventory(tmp_path / "inv", group_vars={"all": {"monitoring_external_labels": {"site": "a\nb"}}})
    p = provision("monitoring", str(inv), "--out", str(tmp_path / "out"), "--no-check")
    assert p.returncode == 1 and "TXT001" in p.stderr and "nothing written" in p.stderr
    assert not (tmp_path / "out").exists()
    ok = write_inventory(tmp_path / "ok")
    p = provision("monitoring", str(ok), "--out", str(tmp_path / "out2"), "--no-check",
                  "--set", 'monitoring_external_labels={"a: b": "x"}')
    assert p.returncode == 1 and "not a Prometheus label name" in p.stderr
    assert not (tmp_path / "out2").exists()


def test_empty_strings_are_unset_not_refused(tmp_path: Path) -> None:
    fs = findings(tmp_path, "TXT002", group_vars=gpu_nodes(vllm_host_ip="", serving_lb_default_model="",
                                                           vllm_client_networks=[]))
    assert fs == []


def test_the_mirror_certificate_and_key_are_multi_line_by_design(tmp_path: Path) -> None:
    """PEM texts (role bundle_mirror): newlines allowed, as in site_ca_certificates; other controls still refused."""
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    gv = {"bundle_mirror": {"bundle_mirror_tls_certificate": pem, "bundle_mirror_tls_key": pem.replace("CERT", "K")}}
    ini = "[gpu_nodes]\nn1 ansible_host=10.0.0.1\n\n[bundle_mirror]\nn1\n"
    assert findings(tmp_path, "TXT001", ini=ini, group_vars=gv) == []
    gv["bundle_mirror"]["bundle_mirror_tls_certificate"] = pem + "\x1b[2J"
    (f,) = findings(tmp_path / "b", "TXT001", ini=ini, group_vars=gv)
    assert f.var == "bundle_mirror_tls_certificate" and f.severity == "error"
