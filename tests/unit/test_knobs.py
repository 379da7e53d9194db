"""Every knob an operator can set is checked (issue 24): the tables the rules keep of what the templates write,
held against the templates themselves, so a new managed line cannot slip past the passthrough rules."""

from __future__ import annotations

import re

from cli_inproc import ROOT


def _template_keys(name: str, pattern: str) -> set[str]:
    text = (ROOT / "templates" / name).read_text(encoding="utf-8")
    text = re.sub(r"\{#.*?#\}", "", text, flags=re.DOTALL)  # the header comment quotes example lines
    return set(re.findall(pattern, text))


def test_nccl_managed_keys_are_the_template_keys() -> None:
    from provisioner.rules.nccl import MANAGED_KEYS, MANAGED_ON

    keys = _template_keys("nccl.conf.j2", r"\b((?:NCCL|FI)_[A-Z0-9_]+)=")
    assert keys == set(MANAGED_KEYS), sorted(keys ^ set(MANAGED_KEYS))
    assert set(MANAGED_ON) <= set(MANAGED_KEYS)
