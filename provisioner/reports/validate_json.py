"""`provision validate --format json`: {"ok", "errors", "warnings", "clusters"} (schema in docs/validate.md)."""

from __future__ import annotations

import json

from provisioner.rules.result import ValidationResult


def render(result: ValidationResult) -> str:
    return json.dumps(result.as_json(), indent=2, default=str) + "\n"
