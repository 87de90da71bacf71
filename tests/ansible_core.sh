#!/usr/bin/env bash
# tests/ansible_core.sh VERSION: prints the bin directory of a venv holding ansible-core VERSION (2.16, 2.17,
# ...), made once under .lab/venv: the test bed's Python with its packages (--system-site-packages: pytest,
# kubernetes, the collections the ansible package brings) and that ansible-core over them. Put it first in
# PATH to run ansible-playbook, ansible-test and pytest on that release (tests/matrix.sh, the releases lab).
set -euo pipefail
version="${1:?usage: tests/ansible_core.sh VERSION (e.g. 2.16)}"
[[ "$version" =~ ^2\.[0-9]+$ ]] || { echo "tests/ansible_core.sh: '$version' is not an ansible-core release like 2.16" >&2; exit 2; }
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="$repo/.lab/venv/ansible-core-$version"
have() { "$venv/bin/python" -c 'import ansible.release as r; print(r.__version__)' 2>/dev/null || true; }
if [[ "$(have)" != "$version".* ]]; then
  mkdir -p "$repo/.lab/venv"
  # one maker at a time (the matrix and the releases lab may ask at once)
  exec 9>"$repo/.lab/venv/.lock"
  flock 9
  if [[ "$(have)" != "$version".* ]]; then
    rm -rf "$venv"
    python3 -m venv --system-site-packages "$venv"
    # (pip notes that the ansible package in the system's packages wants its own ansible-core: this one wins here)
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "ansible-core==$version.*" 2>&1 \
      | grep -v "dependency resolver\|requires ansible-core\|^$" >&2 || true
    [[ "$(have)" == "$version".* ]] || { echo "tests/ansible_core.sh: ansible-core $version did not install in $venv" >&2; exit 1; }
  fi
fi
echo "$venv/bin"
