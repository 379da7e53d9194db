"""Probes: paramiko sessions (ssh.py), parsers of what GPU nodes print (parsers.py), preflight and health gates."""
