"""Build hook: the wheel carries the Ansible side that `provision` runs.

The repository layout stays as it is: the root is the Ansible collection provisioner.gpu (galaxy.yml, meta/,
ansible.cfg, playbooks/, roles/, plugins/, templates/). A regular wheel (`pip wheel .`, `pip install .`,
`python -m build`) gets a copy of them under `provisioner/_data/`, where `provisioner/paths.py` finds them when the
package is installed; each run links that directory as the collection (`paths.link_collection`), since the roles call
the collection's module and filters by FQCN. Symlinks inside them (roles/node_health/files/nodeparse.py) are stored
as the files they point to; the repository's own link `collections/ansible_collections/provisioner/gpu` is not copied.

An editable install (`pip install -e .`) gets nothing copied: its .pth file points at the repository, and
`provisioner/paths.py` uses the repository's own directories (so edits to roles/ take effect at once).
(A static `[tool.hatch.build.targets.wheel.force-include]` table would also copy them into editable installs.)
"""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: repository path -> path inside the wheel
DATA = {
    "galaxy.yml": "provisioner/_data/galaxy.yml",
    "meta": "provisioner/_data/meta",
    "ansible.cfg": "provisioner/_data/ansible.cfg",
    "plugins": "provisioner/_data/plugins",
    "playbooks": "provisioner/_data/playbooks",
    "roles": "provisioner/_data/roles",
    "templates": "provisioner/_data/templates",
}


class AnsibleDataHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version == "standard":
            build_data["force_include"].update(DATA)
