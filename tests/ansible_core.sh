#!/usr/bin/env bash
# tests/ansible_core.sh VERSION: prints the bin directory of a venv holding ansible-core VERSION (2.16, 2.17,
# ...), made once under .lab/venv. Put it first in PATH to run ansible-playbook, ansible-test and pytest on that
# release (tests/matrix.sh, the releases lab, tests/integration/test_newest_core.py).
#
# Up to 2.19: the test bed's Python with its packages (--system-site-packages: pytest, kubernetes, the
# collections the ansible package brings) and that ansible-core over them. 2.20 and later need Python 3.12+ on
# the control node: the newest CPython 3.12+ found (python3.1N on PATH, else pyenv's ~/.pyenv/versions/3.1N.*),
# in a venv of its own with what a site's control node installs: that core, the `ansible` package of its
# release (13 for 2.20, 14 for 2.21: the collections), requirements.txt's other packages and pytest. `ansible`
# 14 no longer ships awx.awx: the test bed's (from the `ansible` package that still ships it) is linked in, as
# a site installs it beside (docs/awx.md).
set -euo pipefail
version="${1:?usage: tests/ansible_core.sh VERSION (e.g. 2.16)}"
[[ "$version" =~ ^2\.([0-9]+)$ ]] || { echo "tests/ansible_core.sh: '$version' is not an ansible-core release like 2.16" >&2; exit 2; }
minor=${BASH_REMATCH[1]}
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="$repo/.lab/venv/ansible-core-$version"
have() { "$venv/bin/python" -c 'import ansible.release as r; print(r.__version__)' 2>/dev/null || true; }

# the newest Python 3.12+ on this machine, or nothing
newer_python() {
  local py
  for py in python3.14 python3.13 python3.12 $(ls -d "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$py"; return 0
    fi
  done
  return 1
}

if [[ "$(have)" != "$version".* ]]; then
  mkdir -p "$repo/.lab/venv"
  # one maker at a time (the matrix and the releases lab may ask at once)
  exec 9>"$repo/.lab/venv/.lock"
  flock 9
  if [[ "$(have)" != "$version".* ]]; then
    rm -rf "$venv"
    quiet() { grep -v "dependency resolver\|requires ansible-core\|^$\|Running pip as the 'root' user" >&2 || true; }
    if (( minor < 20 )); then
      python3 -m venv --system-site-packages "$venv"
      # (pip notes that the ansible package in the system's packages wants its own ansible-core: this one wins here)
      "$venv/bin/python" -m pip install -q --disable-pip-version-check "ansible-core==$version.*" 2>&1 | quiet
    else
      py=$(newer_python) || { echo "tests/ansible_core.sh: ansible-core $version needs Python 3.12 or later on the" \
        "control node, and this machine has none (python3.12 or newer on PATH, or under ~/.pyenv/versions)" >&2; exit 1; }
      "$py" -m venv "$venv"
      # the ansible package of that core: 13 brings 2.20, 14 brings 2.21
      "$venv/bin/python" -m pip install -q --disable-pip-version-check "ansible-core==$version.*" \
        "ansible==$(( minor - 7 )).*" "kubernetes>=30" "jinja2>=3.1" "netaddr>=1.0" "PyYAML>=6" pytest 2>&1 | quiet
      site=$("$venv/bin/python" -c 'import ansible_collections, os; print(list(ansible_collections.__path__)[0])')
      if [[ ! -d "$site/awx/awx" ]]; then
        theirs=$(python3 -c 'import ansible_collections, os; print(list(ansible_collections.__path__)[0])' 2>/dev/null || true)
        [[ -d "$theirs/awx/awx" ]] || { echo "tests/ansible_core.sh: ansible $(( minor - 7 )) has no awx.awx and" \
          "the test bed's ansible package has none to lend (pip install 'ansible<14')" >&2; exit 1; }
        mkdir -p "$site/awx" && ln -s "$theirs/awx/awx" "$site/awx/awx"
      fi
    fi
    [[ "$(have)" == "$version".* ]] || { echo "tests/ansible_core.sh: ansible-core $version did not install in $venv" >&2; exit 1; }
  fi
fi
echo "$venv/bin"
