"""What the pure rules need that takes I/O to learn: resolved model specs and, optionally, vLLM's parser."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from provisioner import catalog
from provisioner.catalog import ModelSpec
from provisioner.model import Fleet

# (model, argv) -> None when vLLM's parser accepts it, else its message
FlagChecker = Callable[[str, Sequence[str]], "str | None"]


@dataclass(frozen=True)
class RuleContext:
    models: Mapping[str, ModelSpec] = field(default_factory=dict)  # cluster -> resolved model
    model_errors: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # cluster -> (var, message)
    flag_checker: FlagChecker | None = None  # vLLM's own parser, when importable and asked for


def inventory_dir(fleet: Fleet) -> Path:
    src = fleet.source
    return src if src.is_dir() else src.parent


def build_context(fleet: Fleet, *, flag_checker: FlagChecker | None = None) -> RuleContext:
    """Resolve each cluster's model: `model_arch` from the catalog, or `model_config` (an HF config.json on the
    controller, relative to the inventory directory). Problems go to `model_errors` for rule CL002."""
    models: dict[str, ModelSpec] = {}
    errors: dict[str, tuple[str, str]] = {}
    for name, c in fleet.clusters.items():
        cfg = c.settings.get("model_config")
        arch = c.settings.get("model_arch")
        if cfg is not None:
            if not isinstance(cfg, str) or not cfg:
                continue  # CL013 reports the type
            p = Path(cfg)
            p = p if p.is_absolute() else inventory_dir(fleet) / p
            try:
                models[name] = catalog.load_model_config(p)
            except ValueError as exc:
                errors[name] = ("vllm_cluster.model_config", f"model_config: {exc}")
        elif isinstance(arch, str):
            spec = catalog.model(arch)
            if spec is not None:
                models[name] = spec
    return RuleContext(models=models, model_errors=errors, flag_checker=flag_checker)
