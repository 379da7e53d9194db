#!/usr/bin/env bash
# Print the path of the first Python >= 3.12 on this machine: PATH first, then pyenv's installs.
# ansible-core >= 2.20 needs Python >= 3.12 on the controller.
set -u
ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; }
for c in python3.13 python3.12 python3; do
  p=$(command -v "$c" 2>/dev/null) || continue
  if ok "$p"; then echo "$p"; exit 0; fi
done
root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
for p in $(ls -d "$root"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do
  if ok "$p"; then echo "$p"; exit 0; fi
done
echo "error: no Python >= 3.12 found (ansible-core >= 2.20 needs it)." >&2
echo "  looked at: python3.13, python3.12, python3 on PATH, and $root/versions/3.1x" >&2
echo "  fix: apt-get install python3.12 python3.12-venv (Ubuntu 24.04 has it as python3), or pyenv install 3.12" >&2
exit 1
