"""provisioner: Ansible-based bare-metal provisioning for NVIDIA GPU racks serving vLLM."""

from pathlib import Path

__version__ = "0.1.0"

#: The project root (holds playbooks/, roles/, templates/, inventories/).
PROJECT_ROOT = Path(__file__).resolve().parent.parent
PLAYBOOKS = PROJECT_ROOT / "playbooks"
ROLES = PROJECT_ROOT / "roles"
TEMPLATES = PROJECT_ROOT / "templates"
INVENTORIES = PROJECT_ROOT / "inventories"
