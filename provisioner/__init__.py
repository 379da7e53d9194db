"""provisioner: Ansible-based bare-metal provisioning for NVIDIA GPU racks serving vLLM."""

__version__ = "0.1.0"

# Where the Ansible side lives (the repository root in a checkout, provisioner/_data/ when installed) is decided once,
# in provisioner/paths.py; these names stay for the code and tests that import them from here.
from provisioner.paths import DATA_ROOT, INVENTORIES, PLAYBOOKS, ROLES, TEMPLATES  # noqa: E402

#: The directory holding ansible.cfg, playbooks/, roles/, templates/ (the repository root in a checkout).
PROJECT_ROOT = DATA_ROOT

__all__ = ["DATA_ROOT", "INVENTORIES", "PLAYBOOKS", "PROJECT_ROOT", "ROLES", "TEMPLATES", "__version__"]
