"""Every knob an operator can set is checked (issue 24): the tables the rules keep of what the templates write,
held against the templates themselves, so a new managed line cannot slip past the passthrough rules."""

from __future__ import annotations

import re
from pathlib import Path

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
