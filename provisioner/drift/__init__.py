"""The two-tier drift: `state` is a host's recorded state (what the tier-1 probe reads on a node, the input digests,
the comparison), `tiers` the controller side (the probe over SSH, recording a host after a complete run, sorting
hosts into the probe's tier or Ansible's). docs/running.md ("Two tiers") has the picture."""
