"""Build hook: the wheel carries the Ansible side that `provision` runs.

The repository layout stays as it is (ansible.cfg, playbooks/, roles/, templates/ at the root: the Ansible face of
the repository). A regular wheel (`pip wheel .`, `pip install .`, `python -m build`) gets a copy of them under
`provisioner/_data/`, where `provisioner/paths.py` finds them when the package is installed. Symlinks inside them
(roles/monitoring/filter_plugins/provisioner_fleet.py) are stored as the files they point to.

An editable install (`pip install -e .`) gets nothing copied: its .pth file points at the repository, and
`provisioner/paths.py` uses the repository's own directories (so edits to roles/ take effect at once).
(A static `[tool.hatch.build.targets.wheel.force-include]` table would also copy them into editable installs.)
"""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: repository path -> path inside the wheel
DATA = {
    "ansible.cfg": "provisioner/_data/ansible.cfg",
    "playbooks": "provisioner/_data/playbooks",
    "plugins": "provisioner/_data/plugins",
    "roles": "provisioner/_data/roles",
    "templates": "provisioner/_data/templates",
}


class AnsibleDataHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version == "standard":
            build_data["force_include"].update(DATA)
