"""The ansible-core series the suite runs on is pinned, the same in every file that installs it: a fresh install
must not pick up a series nobody has checked (ansible-core 2.22.0 reached the index on 2026-12-07 and a fresh clone
took it; forkcost's memo, mitogen and the internal tags we read are checked per series)."""

from __future__ import annotations

import re
import tomllib

import yaml
from ansible.release import __version__ as ansible_version
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from provisioner import PROJECT_ROOT
from provisioner.runner import forkcost


def _pyproject_spec() -> str:
    deps = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d.removeprefix("ansible-core") for d in deps if re.match(r"ansible-core\b", d)]
    return spec


def test_every_file_that_installs_ansible_core_names_the_same_bounded_series() -> None:
    spec = _pyproject_spec()
    ee = yaml.safe_load((PROJECT_ROOT / "execution-environment.yml").read_text())
    runtime = yaml.safe_load((PROJECT_ROOT / "meta" / "runtime.yml").read_text())
    assert ee["dependencies"]["ansible_core"]["package_pip"] == f"ansible-core{spec}"
    assert runtime["requires_ansible"] == spec
    assert any(s.operator == "<" for s in SpecifierSet(spec)), f"ansible-core{spec}: no upper bound"


def test_the_newest_series_allowed_is_the_one_checked_and_installed() -> None:
    spec = SpecifierSet(_pyproject_spec())
    (upper,) = [Version(s.version) for s in spec if s.operator == "<"]
    newest = f"{upper.major}.{upper.minor - 1}."
    assert newest in forkcost.CHECKED_SERIES, f"ansible-core {newest}x allowed but not in forkcost.CHECKED_SERIES"
    assert Version(ansible_version) in spec, f"installed ansible-core {ansible_version} is outside {spec}"
