#!/usr/bin/env bash
# ansible-test sanity on the collection's plugins. ansible-test needs the tree
# at ansible_collections/converged/hpc, so it runs on a copy of the tracked files.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
dest="$work/ansible_collections/converged/hpc"
mkdir -p "$dest"
# ansible-test only looks at files git knows; copy tracked + new (not ignored) files.
(cd "$repo" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$dest")
cd "$dest"
git init -q && git add -A >/dev/null
py="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
# Tests whose tools ship with ansible-core or are installed here; the rest need
# containers or extra venvs that this test bed does not offer.
tests=(action-plugin-docs ansible-doc changelog compile empty-init future-import-boilerplate
  ignores import line-endings metaclass-boilerplate no-assert no-basestring no-dict-iteritems
  no-dict-iterkeys no-dict-itervalues no-get-exception no-illegal-filenames no-main-display
  no-smart-quotes no-unicode-literals replace-urlopen runtime-metadata shebang symlinks
  use-argspec-type-path use-compat-six validate-modules yamllint pep8 pylint)
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done
ansible-test sanity --python "$py" --color no "${args[@]}" plugins/ "$@"
