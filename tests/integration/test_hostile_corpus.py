"""Hostile values (issue 43, class 2): every example inventory and every testbed shape, with a corpus of hostile
values put into each variable that reaches a rendered file. For each value and variable, either the rules
`provision validate` runs (and playbooks/validate.yml, through the same engine) refuse it with a TXT finding
naming that variable, or every file it reaches keeps exactly its intended directives: checked with the format's
own tool (`systemd-analyze verify`, `nginx -t`, `promtool check config`, `nft -c`) and read back the way its
consumer reads it (tests/support/format_parsers.py).

A tool that is not installed is skipped on a developer machine and fails in CI (.ci/install-deps.sh installs
them all); `nft -c` also needs CAP_NET_ADMIN (root), else its check is skipped with a reason.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from format_parsers import (env_assignments, exec_argv, nccl_keys, nginx_directives, nginx_tokens, unit_directives,
                            yaml_shape)
from inventory_factory import write_inventory
from provisioner import INVENTORIES, PROJECT_ROOT, ROLES, TEMPLATES, defaults, plan, render
from provisioner.inventory import load_fleet
from provisioner.model import Fleet
from provisioner.monitoring import render_lb_config, render_monitoring
from provisioner.inventory.origin import where
from provisioner.rules import run_rules
from provisioner_testbed import inventory_writer as invw

TOOLS = {t: shutil.which(t) or (f"/usr/sbin/{t}" if os.path.exists(f"/usr/sbin/{t}") else None)
         for t in ("systemd-analyze", "nginx", "promtool", "nft")}
NJS = next((p for p in ("/usr/lib/nginx/modules/ngx_http_js_module.so",
                        "/usr/share/nginx/modules/ngx_http_js_module.so") if os.path.exists(p)), None)


def tool(name: str) -> str:
    path = TOOLS[name]
    if path is None:
        if os.environ.get("CI"):
            raise AssertionError(f"CI needs {name} (.ci/install-deps.sh installs it)")
        pytest.skip(f"{name} is not installed")
    return path


# the corpus: line breaks of every kind, NUL, escapes, each format's delimiters, specifiers, a template
CORPUS = [
    "x\nExecStartPost=/bin/sh -c id",
    "x\r\nNCCL_NET=Socket",
    "a\nVLLM_API_KEY=evil",
    "x\x00y",
    "\x1b[2Jx",
    "x\u2028y",
    "x\x85y",
    "x\ty",
    'x"; include /etc/passwd; "',
    "x' # y",
    "x;y",
    "x } server { listen 1; } #",
    "10.0.0.0/8 } chain evil { type filter hook input priority 0; policy drop; } set y {",
    "x%n$HOME\\",
    "x: {remote_write: [{url: 'http://198.18.255.1/'}]}",
    "--api-key=zzz",
    "x y",
]  # templates ("{{ ... }}") resolve in Ansible before any format sees them; the CLI's own resolution is sandboxed
# (tests/unit/test_rules_text.py::test_templated_value_cannot_escape_the_sandbox)

# -e name -> its value with the hostile string inside (the extra-var path of `provision run/validate -e`)
EXTRA_POINTS: dict[str, Any] = {
    "nccl_extra": lambda v: {"NCCL_DEBUG_SUBSYS": v},
    "vllm_env_extra": lambda v: {"HOSTILE_X": v},
    "vllm_api_key": lambda v: v,
    "vllm_client_networks": lambda v: [v],
    "monitoring_external_labels": lambda v: {"site": v},
    "monitoring_scrape_interval": lambda v: v,
    "serving_lb_keepalive_timeout": lambda v: v,
    "vllm_host_ip": lambda v: v,
}
# vllm_cluster keys, edited in the file that defines the first cluster's vllm_cluster
CLUSTER_POINTS = ("extra_args", "served_model_name")


# --- the bases: every example inventory, the factory's, every testbed shape ---------------------------------------
SPECS = PROJECT_ROOT / "provisioner_testbed" / "specs"


def _testbed(tmp: Path, shape: str) -> Path:
    """The inventory `provision testbed up` writes for a rack of `shape` (the default H100 rack, or a spec file of
    provisioner_testbed/specs/: each host's hardware from the spec, as provisioner_testbed.rack does), 4 GPU
    hosts and a balancer."""
    from provisioner_testbed import hwspec

    spec: dict[str, Any] = {}
    if shape != "default":
        spec = yaml.safe_load((SPECS / f"{shape}.yaml").read_text())
    hosts = []
    for i in range(1, 5):
        name = f"node{i:02d}"
        r = hwspec.resolve({**(spec.get("defaults") or {}), **((spec.get("hosts") or {}).get(name) or {})})
        hosts.append(invw.InvHost(name=name, address=f"198.18.0.{10 + i}", gpu_model=r["gpu_model"],
                                  gpu_count=len(r["gpus"]), ib_hcas=tuple(x["name"] for x in r["hcas"]),
                                  efa_devices=len(r["efa"]), nvlink_domain=invw.NVL72_DOMAIN if r["imex"] else None))
    hosts.append(invw.InvHost(name="lb01", address="198.18.0.99", group=invw.LB_GROUP))
    efa = {"efa_installer_url": "http://198.18.0.1:8090/efa/aws-efa-installer.tar.gz",
           "efa_installer_sha256": "0" * 64} if any(h.efa_devices for h in hosts) else {}  # as the rack's repo serves
    rack = invw.InvRack(name=shape, hosts=tuple(hosts), key_file="/k/id", known_hosts="/k/known_hosts",
                        repo_url="http://198.18.0.1:8090/nvidia/", proxy_url="http://198.18.0.1:3128", extra_vars=efa)
    return invw.write(rack, tmp / shape)


def _example(tmp: Path, name: str) -> Path:
    dst = tmp / "inventories"
    if not dst.exists():
        shutil.copytree(INVENTORIES, dst)
    p = dst / name
    return p / "hosts.ini" if (p / "hosts.ini").exists() else p


BASES = ["rack-a.ini", "b200-rack", "gb200-nvl72", "p5-pair", "factory", "tb:default",
         *(f"tb:{p.stem}" for p in sorted(SPECS.glob("*.yaml")))]


def base_inventory(tmp: Path, base: str) -> Path:
    if base == "factory":
        return write_inventory(tmp / "factory")
    if base.startswith("tb:"):
        return _testbed(tmp, base[3:])
    return _example(tmp, base)


def set_cluster_keys(fleet: Fleet, values: dict[str, Any]) -> str:
    """Edit the YAML file that defines the first cluster's vllm_cluster (found through Ansible's origin)."""
    name = sorted(fleet.clusters)[0]
    vc = fleet.group_vars[name]["vllm_cluster"]
    w = where(vc)
    assert w, f"no origin for {name}'s vllm_cluster"
    path = Path(w[0])
    doc = yaml.safe_load(path.read_text())
    target = doc.get("vllm_cluster", doc)
    for k, v in values.items():
        target[k] = v(target.get(k)) if callable(v) else v
    path.write_text(yaml.safe_dump(doc, allow_unicode=False))
    return name


# --- render everything a value can reach ------------------------------------------------------------------------
def _nft(fleet: Fleet, host: str) -> str:
    """templates/nftables-cluster.nft.j2 with the cluster_firewall role's inputs computed as the role does."""
    h = fleet.hosts[host]
    v: dict[str, Any] = {k: x for k, x in defaults.role_defaults("cluster_firewall").items()
                         if not (isinstance(x, str) and "{{" in x)}
    v.update(h.vars)
    part = plan.host_plan(fleet, host)
    members = part["cluster_members"]
    v.update(inventory_hostname=host, cluster_firewall_ssh_ports=[22],
             cluster_firewall_member_addresses=[fleet.hosts[m].address for m in members],
             cluster_firewall_lb_addresses=[x.address for x in fleet.hosts.values() if "lb" in x.groups],
             cluster_firewall_domain_addresses=part["imex_nodes"])
    if members:
        v["vllm_cluster"] = dict(fleet.clusters[part["cluster"]].settings)
    return _nft_env().get_template("nftables-cluster.nft.j2").render(**v)


@functools.cache
def _nft_env() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    """One environment for the run: it compiles the template once."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                                                       undefined=jinja2.StrictUndefined, trim_blocks=True,
                                                       keep_trailing_newline=True)
    env.tests["search"] = lambda s, pat: re.search(pat, str(s)) is not None  # Ansible's test
    return env


def render_all(fleet: Fleet) -> dict[str, str]:
    """name -> text of every file the values can reach, for the first cluster's head and one worker/member."""
    out: dict[str, str] = {}
    c = fleet.clusters[sorted(fleet.clusters)[0]]
    for host in c.members[:2]:
        for f in render.host_files(fleet, host, redact=False):
            out[f"{host}:{f.dest}"] = f.content
        out[f"{host}:nft"] = _nft(fleet, host)
    out["lb"] = render_lb_config(fleet, overrides={"serving_lb_njs_dir": str(ROLES / "serving_lb" / "files"),
                                                   "serving_lb_log_dir": "/tmp"})
    for name, text in render_monitoring(fleet).items():
        out[name] = text
    return out


def intended(fleet: Fleet) -> dict[str, Any]:
    """What the files must say: each unit's argv from the plan, the env file's extra keys."""
    c = fleet.clusters[sorted(fleet.clusters)[0]]
    return {h: plan.vllm_facts(fleet, h) for h in c.members[:2]}


def shape(files: dict[str, str]) -> dict[str, Any]:
    """Each file's structure with the values left out."""
    out: dict[str, Any] = {}
    for name, text in files.items():
        if name.endswith(".service"):
            out[name] = [(s, k) for s, k, _ in unit_directives(text)]
        elif name.endswith(".env"):
            out[name] = [k for k, _ in env_assignments(text)]
        elif name.endswith("nccl.conf"):
            out[name] = nccl_keys(text)
        elif name == "lb":
            out[name] = nginx_directives(text)
        elif name.endswith("nft"):
            out[name] = [ln.split("{")[0].split()[0] for ln in text.splitlines() if ln.strip()
                         and not ln.lstrip().startswith("#")] + [str(text.count("{")), str(text.count("}"))]
        else:
            out[name] = yaml_shape(yaml.safe_load(text))
    return out


# --- the format tools --------------------------------------------------------------------------------------------
def check_tools(files: dict[str, str], work: Path) -> list[str]:
    """Problems the formats' own tools find (empty: every file passes)."""
    problems: list[str] = []
    work.mkdir(parents=True, exist_ok=True)
    units = {n: t for n, t in files.items() if n.endswith(".service")}
    if units and TOOLS["systemd-analyze"]:
        paths = []
        for i, (n, t) in enumerate(sorted(units.items())):
            p = work / f"hostile{i}-{Path(n).name}"
            p.write_text(t)
            paths.append(str(p))
        r = subprocess.run([TOOLS["systemd-analyze"], "verify", "--man=no", "--generators=no", *paths],
                           capture_output=True, text=True, timeout=120)
        noise = [ln for ln in r.stderr.splitlines() if ln.strip() and "hostile" in ln]
        if r.returncode or noise:
            problems.append(f"systemd-analyze verify: rc {r.returncode}: {noise or r.stderr[-500:]}")
    if TOOLS["nginx"] and NJS:
        (work / "tmp").mkdir(exist_ok=True)
        (work / "lb.conf").write_text(files["lb"])
        (work / "nginx.conf").write_text(
            f"load_module {NJS};\npid {work}/nginx.pid;\nerror_log {work}/error.log warn;\n"
            f"events {{ worker_connections 64; }}\nhttp {{\n client_body_temp_path {work}/tmp;\n"
            f" include {work}/lb.conf;\n}}\n")
        r = subprocess.run([TOOLS["nginx"], "-t", "-q", "-c", str(work / "nginx.conf")], capture_output=True,
                           text=True, timeout=60)
        if r.returncode:
            problems.append(f"nginx -t: {r.stderr[-500:]}")
    if TOOLS["promtool"]:
        for name in ("prometheus.yml", "prometheus-rules.yml"):
            (work / name).write_text(files[name])
        r = subprocess.run([TOOLS["promtool"], "check", "config", "prometheus.yml"], capture_output=True, text=True,
                           timeout=60, cwd=work)
        if r.returncode:
            problems.append(f"promtool check config: {(r.stdout + r.stderr)[-500:]}")
    if TOOLS["nft"] and os.geteuid() == 0:
        for n, t in files.items():
            if n.endswith("nft"):
                p = work / (n.replace(":", "_").replace("/", "_"))
                p.write_text(t)
                r = subprocess.run([TOOLS["nft"], "-c", "-f", str(p)], capture_output=True, text=True, timeout=60)
                if r.returncode:
                    problems.append(f"nft -c {n}: {r.stderr[-500:]}")
    return problems


# --- the test ----------------------------------------------------------------------------------------------------
def refused(findings: list[Any], var: str) -> bool:
    """A TXT error names `var` (a vllm_cluster key: `vllm_cluster.KEY`, or `vllm_cluster` with the key's path in
    the message)."""
    return any(f.code.startswith("TXT") and f.severity == "error" and (
        f.var in (var, f"vllm_cluster.{var}") or (f.var == "vllm_cluster" and f"vllm_cluster.{var}" in f.message))
        for f in findings)


#: set in group_vars/all (`provision monitoring` reads monitoring_* from groups all/monitoring, not from -e)
ALL_POINTS = ("monitoring_external_labels", "monitoring_scrape_interval")


def set_all_vars(inv: Path, values: dict[str, Any]) -> None:
    gv = (inv if inv.is_dir() else inv.parent) / "group_vars"
    path = gv / "all" / "zz-hostile.yml" if (gv / "all").is_dir() else gv / "all.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    doc.update(values)
    path.write_text(yaml.safe_dump(doc, allow_unicode=False))


def load(inv: Path, cluster_vals: dict[str, Any], extra: dict[str, Any], tmp: Path) -> Fleet:
    fleet = load_fleet(inv)
    if cluster_vals:
        set_cluster_keys(fleet, cluster_vals)
    set_all_vars(inv, {k: v for k, v in extra.items() if k in ALL_POINTS})
    return load_fleet(inv, extra_vars={k: v for k, v in extra.items() if k not in ALL_POINTS})


PLAIN = "plainvalue"
PLAIN_FOR = {"vllm_client_networks": "192.0.2.0/24", "monitoring_scrape_interval": "15s",
             "serving_lb_keepalive_timeout": "60s"}  # what the format needs where "plainvalue" is no value


def _points(v: str) -> tuple[dict[str, Any], dict[str, Any]]:
    cluster_vals = {"extra_args": lambda old: [*(old or []), v], "served_model_name": v}
    extra = {k: f(PLAIN_FOR.get(k, v) if v == PLAIN else v) for k, f in EXTRA_POINTS.items()}
    return cluster_vals, extra


def cases() -> Iterator[Any]:
    for base in BASES:
        yield pytest.param(base, id=base)


@pytest.fixture(scope="module")
def baseline_tools(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The tools accept every base as rendered without hostile values (else a failure below means nothing)."""
    for t in ("systemd-analyze", "nginx", "promtool"):
        tool(t)
    if NJS is None and os.environ.get("CI"):
        raise AssertionError("CI needs libnginx-mod-http-js")


@pytest.mark.parametrize("base", list(cases()))
def test_hostile_values_are_refused_or_kept_in_their_place(base: str, tmp_path: Path, baseline_tools: None) -> None:
    inv0 = base_inventory(tmp_path / "plain", base)
    plain = load(inv0, *_points(PLAIN), tmp_path)
    plain_files = render_all(plain)
    assert not [f for f in run_rules(plain) if f.code.startswith("TXT")], "the plain value is refused"
    assert check_tools(plain_files, tmp_path / "tools-plain") == []
    want_shape = shape(plain_files)
    tried = refusals = 0
    for i, v in enumerate(CORPUS):
        cluster_vals, extra = _points(v)
        inv = base_inventory(tmp_path / f"v{i}", base)
        fleet = load(inv, cluster_vals, extra, tmp_path)
        found = run_rules(fleet)
        # a value the rules refuse must be refused naming its variable; drop those and render the rest
        kept_extra = {k: x for k, x in extra.items() if not refused(found, k)}
        kept_cluster = {k: x for k, x in cluster_vals.items() if not refused(found, k)}
        refusals += len(extra) + len(cluster_vals) - len(kept_extra) - len(kept_cluster)
        if "\n" in v or "\x00" in v or "\r" in v:  # a line break or NUL is refused everywhere
            assert not kept_extra and not kept_cluster, (v, sorted(kept_extra), sorted(kept_cluster))
            continue
        # refused points get the plain value back: the rest must render in exactly the plain files' shape
        plain_cluster, plain_extra = _points(PLAIN)
        inv2 = base_inventory(tmp_path / f"k{i}", base)
        fleet2 = load(inv2, {**plain_cluster, **kept_cluster}, {**plain_extra, **kept_extra}, tmp_path)
        assert not [f.line() for f in run_rules(fleet2) if f.code.startswith("TXT")], v
        files = render_all(fleet2)
        tried += 1
        assert shape(files) == want_shape, (v, sorted(kept_extra), sorted(kept_cluster))
        # the values land where they are meant to, whole
        for host, facts in intended(fleet2).items():
            unit = files.get(f"{host}:{facts['units'][-1]['dest']}")
            if unit is not None:
                exec_start = next(val for _, k, val in unit_directives(unit) if k == "ExecStart")
                assert exec_argv(exec_start) == facts["exec_argv"], v
                if "extra_args" in kept_cluster:
                    assert v in exec_argv(exec_start)
            env = dict(env_assignments(files[f"{host}:/etc/vllm/vllm.env"]))
            if "vllm_env_extra" in kept_extra:
                assert env["HOSTILE_X"] == v.rstrip()
            if "vllm_api_key" in kept_extra:
                assert env["VLLM_API_KEY"] == v.rstrip()
        if "served_model_name" in kept_cluster:
            assert v in nginx_tokens(files["lb"])
        if "monitoring_external_labels" in kept_extra:
            assert yaml.safe_load(files["prometheus.yml"])["global"]["external_labels"] == {"site": v}
        problems = check_tools(files, tmp_path / f"tools{i}")
        assert problems == [], (v, problems)
    assert refusals and tried, (refusals, tried)


def test_a_cluster_group_name_cannot_inject(tmp_path: Path) -> None:
    """Group names come from the inventory itself (YAML spells any): refused by TXT001/TXT002 and quoted in units."""
    for i, name in enumerate(["c1\nExecStartPost=/bin/id", "c1%n", 'c1"x', "c1 x"]):
        d = tmp_path / str(i)
        d.mkdir()
        (d / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
            "gpu_nodes": {"hosts": {"n1": {"ansible_host": "10.0.0.1"}}},
            name: {"hosts": {"n1": {"node_rank": 0}},
                   "vars": {"vllm_cluster": {"model": "/m", "model_arch": "Llama-3.1-8B", "tensor_parallel_size": 8,
                                             "max_model_len": 4096, "max_num_seqs": 8}}}}}}))
        (d / "group_vars").mkdir()
        (d / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump(
            {"gpu_model": "H100-SXM5-80GB", "gpu_count": 8, "fabric": "ethernet", "bootstrap_interface": "eth0"}))
        fleet = load_fleet(d / "hosts.yml")
        assert [f for f in run_rules(fleet) if f.code.startswith("TXT") and f.group == name], name
        unit = next(f.content for f in render.host_files(fleet, "n1") if f.dest.endswith("vllm.service"))
        assert [k for _, k, _ in unit_directives(unit)] == [k for _, k, _ in unit_directives(
            unit.replace(name, "c1"))] and sum(k.startswith("Exec") for _, k, _ in unit_directives(unit)) == 1


@pytest.mark.parametrize("v", ["x\nExecStartPost=/bin/id", "a\r\nVLLM_API_KEY=evil", 'q"\nserver { listen 9; }'])
def test_templates_keep_their_shape_behind_the_rules(v: str, tmp_path: Path, baseline_tools: None) -> None:
    """Defence in depth: with the rules bypassed (a value the rules refuse, rendered anyway), every file whose
    format can quote or escape keeps the plain render's directives and passes its tool. Settings rendered as bare
    words (monitoring_scrape_interval, serving_lb_*_timeout) have only the rules."""
    bare = ("monitoring_scrape_interval", "serving_lb_keepalive_timeout")
    plain = load(base_inventory(tmp_path / "plain", "tb:default"), *_points(PLAIN), tmp_path)
    cluster_vals, extra = _points(v)
    fleet = load(base_inventory(tmp_path / "v", "tb:default"), cluster_vals,
                 {k: (_points(PLAIN)[1][k] if k in bare else x) for k, x in extra.items()}, tmp_path)
    assert {f.code for f in run_rules(fleet)} >= {"TXT001"}  # refused, yet:
    files = render_all(fleet)
    assert shape(files) == shape(render_all(plain))
    assert check_tools(files, tmp_path / "tools") == []
    for host, facts in intended(fleet).items():
        unit = files[f"{host}:{facts['units'][-1]['dest']}"]
        exec_start = [val for _, k, val in unit_directives(unit) if k.startswith("Exec")]
        assert len(exec_start) == 1 and exec_argv(exec_start[0]) == facts["exec_argv"]
        assert v in exec_argv(exec_start[0])
        env = dict(env_assignments(files[f"{host}:/etc/vllm/vllm.env"]))
        assert env["HOSTILE_X"] == v and env["VLLM_API_KEY"] == v
