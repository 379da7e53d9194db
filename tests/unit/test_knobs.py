"""Every knob an operator can set is checked (issue 24): the tables the rules keep of what the templates write,
held against the templates themselves, so a new managed line cannot slip past the passthrough rules."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from cli_inproc import ROOT
from inventory_factory import gpu_nodes


def _template_keys(name: str, pattern: str) -> set[str]:
    text = (ROOT / "templates" / name).read_text(encoding="utf-8")
    text = re.sub(r"\{#.*?#\}", "", text, flags=re.DOTALL)  # the header comment quotes example lines
    return set(re.findall(pattern, text))


def test_nccl_managed_keys_are_the_template_keys() -> None:
    from provisioner.rules.nccl import MANAGED_KEYS, MANAGED_ON

    keys = _template_keys("nccl.conf.j2", r"\b((?:NCCL|FI)_[A-Z0-9_]+)=")
    assert keys == set(MANAGED_KEYS), sorted(keys ^ set(MANAGED_KEYS))
    assert set(MANAGED_ON) <= set(MANAGED_KEYS)


def test_vllm_env_managed_keys_are_the_template_keys() -> None:
    from provisioner.rules.env import MANAGED_ENV, MANAGED_ENV_ON
    from provisioner.rules.nccl import MANAGED_KEYS

    keys = _template_keys("vllm.env.j2", r"kv\('([A-Z_][A-Z0-9_]*)'")
    assert keys == set(MANAGED_ENV), sorted(keys ^ set(MANAGED_ENV))
    assert set(MANAGED_ENV_ON) <= set(MANAGED_ENV) | set(MANAGED_KEYS)
    assert "{% include 'nccl.conf.j2' %}" in (ROOT / "templates" / "vllm.env.j2").read_text()  # NCCL_*: ENV001


def test_vllm_env_extra(tmp_path: Path) -> None:
    from rules_helpers import findings

    def msgs(d: str, extra: object, **gv: object) -> list[str]:
        return [f.message for f in findings(tmp_path / d, "ENV001", group_vars=gpu_nodes(vllm_env_extra=extra, **gv))
                if f.host == "n1"]

    assert msgs("ok", {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": 1, "LD_LIBRARY_PATH": "/x"}) == []
    (m,) = msgs("home", {"HOME": "/tmp"})
    assert "vllm_home" in m and "two HOME lines" in m
    (m,) = msgs("nccl", {"NCCL_DEBUG": "INFO"})
    assert "nccl_extra (NCCL_DEBUG: 'INFO')" in m
    (m,) = msgs("hca", {"NCCL_IB_HCA": "=mlx5_0"})
    assert "set ib_hcas" in m
    assert msgs("list", ["A=1"]) and msgs("name", {"1X": "a"}) and msgs("nested", {"A": {"b": 1}})


# --- docs/validate.md: one row per variable an operator can set -----------------------------------------------

def _variable_rows() -> dict[str, tuple[str, list[str], str]]:
    """variable -> (role/contract, rule codes, reason) from the table in docs/validate.md."""
    text = (ROOT / "docs" / "validate.md").read_text(encoding="utf-8")
    section = text.split("## Every variable an operator can set", 1)[1]
    rows: dict[str, tuple[str, list[str], str]] = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([a-z_][a-z0-9_.]*)` \|(.*)\|(.*)\|(.*)\|$", line)
        if m:
            name, where, codes, why = (x.strip() for x in m.groups())
            assert name not in rows, f"two rows for {name}"
            rows[name] = (where, [c.strip() for c in codes.split(",") if c.strip()], why)
    return rows


def _spec_variables() -> dict[str, set[str]]:
    """variable -> roles: every option of every argument spec, plus the variables a spec names as not validated
    there (their defaults come from vars/<Distribution>.yml)."""
    out: dict[str, set[str]] = {}
    for f in sorted((ROOT / "roles").glob("*/meta/argument_specs.yml")):
        role = f.parent.parent.name
        for ep in (yaml.safe_load(f.read_text(encoding="utf-8"))["argument_specs"] or {}).values():
            for name in ep.get("options") or {}:
                out.setdefault(name, set()).add(role)
            for d in ep.get("description") or []:
                m = re.search(r"Not validated here .*? - (.*)$", " ".join(str(d).split()))
                for name in re.findall(r"[a-z_][a-z0-9_]*", m.group(1)) if m else []:
                    out.setdefault(name, set()).add(role)
    return out


def _contract_variables() -> set[str]:
    """The variables of docs/inventory.md's tables (first column), vllm_cluster keys as vllm_cluster.<key>."""
    out: set[str] = set()
    kind = None
    for line in (ROOT / "docs" / "inventory.md").read_text(encoding="utf-8").splitlines():
        if line.startswith(("| variable |", "| key |")):
            kind = line.split("|")[1].strip()
        elif not line.startswith("|"):
            kind = None
        elif kind and not line.startswith("|---"):
            names = re.findall(r"`([a-z_][a-z0-9_]*)`", line.split("|")[1])
            out.update(names if kind == "variable" else (f"vllm_cluster.{n}" for n in names))
    return out | {"vllm_cluster"}


def test_every_settable_variable_has_a_row() -> None:
    rows = _variable_rows()
    specs = _spec_variables()
    contract = _contract_variables()
    assert len(specs) > 200 and len(contract) > 40  # the parsers found the specs and the tables
    missing = sorted((set(specs) | contract) - set(rows))
    assert not missing, f"add a row to docs/validate.md for: {missing}"
    stale = sorted(set(rows) - set(specs) - contract)
    assert not stale, f"rows for variables no argument spec or contract table has: {stale}"
    for name, (where, _, _) in rows.items():
        for role in specs.get(name, ()):
            assert role in where, f"{name}: role {role} missing from its row"


def test_every_row_names_real_rule_codes_or_a_reason() -> None:
    from provisioner.rules import all_rules

    codes = set(all_rules())
    for name, (_, named, why) in _variable_rows().items():
        unknown = [c for c in named if c not in codes]
        assert not unknown, f"{name}: no rule {unknown}"
        assert named or why, f"{name}: name the rule codes that check it, or say why it is free"
