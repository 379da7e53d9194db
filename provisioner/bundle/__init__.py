"""The air-gapped bundle: what an inventory's hosts fetch (needs), fetched into one signed, verified directory.

- `needs`: per host and role, the apt packages, pip requirements and files (catalog/bundle.yaml, Ansible's templar);
- `manifest`: the manifest, its difference from an earlier one, completeness against needs (pure);
- `build`: apt's closure, pip's wheelhouse as a PEP 503 index, the files, the signed flat repository (I/O);
- `verify`: checksums, signature and completeness of a bundle directory.
"""
