#!/usr/bin/env bash
# ansible-test sanity on the whole collection. ansible-test needs the tree
# at ansible_collections/converged/hpc, so it runs on a copy of the tracked files.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
dest="$work/ansible_collections/converged/hpc"
mkdir -p "$dest"
# ansible-test only looks at files git knows; copy tracked + new (not ignored) files.
(cd "$repo" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$dest")
# The collections this one builds on (doc fragments, module_utils) next to it, as
# ansible-test expects: the ones the ansible package installed.
site="$(python3 -c 'import ansible_collections, os; print(os.path.dirname(ansible_collections.__file__ or list(ansible_collections.__path__)[0]))' 2>/dev/null)"
for dep in kubernetes; do
  [[ -d "$site/ansible_collections/$dep" ]] && ln -s "$site/ansible_collections/$dep" "$work/ansible_collections/$dep"
done
cd "$dest"
git init -q && git add -A >/dev/null
py="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
# ansible-test bootstraps pip in its venvs with a script from a host these
# machines cannot reach; this stand-in bootstraps pip with ensurepip instead
# and then installs the pinned packages ansible-test asks for from PyPI.
# (its pip version: PIP_VERSION since ansible-core 2.17, a default in get_venv_packages before)
pip_version="$(python3 -c 'import re, ansible_test._internal.python_requirements as r
print(getattr(r, "PIP_VERSION", None) or re.search(r"pip=.([0-9.]+).", open(r.__file__).read()).group(1))' \
  2>/dev/null || echo 24.2)"
# one ansible-test at a time on this machine: the matrix's and make lint's may meet in make test, and would
# write the same venvs and pip stand-in at once
mkdir -p "$HOME/.ansible/test"
exec 8>"$HOME/.ansible/test/.converged-sanity.lock"
flock 8
cache="$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
if [[ ! -f "$cache" ]] || ! grep -q converged.hpc "$cache"; then
  mkdir -p "$(dirname "$cache")"
  cat >"$cache" <<'PY'
# converged.hpc stand-in for get-pip.py: ensurepip, then pip install the requested packages.
import subprocess
import sys

subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
PY
fi
# Tests whose tools ship with ansible-core or are installed here; the rest need
# containers or extra venvs that this test bed does not offer.
# SANITY_TESTS (space-separated) runs only those (tests/matrix.sh: the ones an older ansible-core judges
# differently).
tests=(action-plugin-docs ansible-doc changelog compile empty-init ignores import line-endings
  no-assert no-get-exception no-illegal-filenames no-smart-quotes pep8 pylint replace-urlopen
  runtime-metadata shebang symlinks use-argspec-type-path use-compat-six validate-modules yamllint)
if [[ -n "${SANITY_TESTS:-}" ]]; then read -r -a tests <<<"$SANITY_TESTS"; fi
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done
ansible-test sanity --local --python "$py" --color no "${args[@]}" "$@"
