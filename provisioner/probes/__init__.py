"""Probes: paramiko sessions (ssh.py), parsers of what GPU nodes print (parsers.py), preflight and health gates."""

# SSH needs the inventory's private key. The fleet loader keeps only a few ansible_* variables; make sure the key
# variables are among them (a no-op once provisioner.inventory keeps them itself).
try:
    from provisioner import inventory as _inventory

    _keep = getattr(_inventory, "_ANSIBLE_KEEP", None)
    if isinstance(_keep, set):
        _keep.update({"ansible_ssh_private_key_file", "ansible_private_key_file", "ansible_ssh_user",
                      "ansible_ssh_port", "ansible_become", "ansible_become_user"})
except ImportError:  # pragma: no cover
    pass
