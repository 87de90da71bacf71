#!/usr/bin/env bash
# tests/matrix.sh [VERSION...]: the collection on each ansible-core release meta/runtime.yml claims besides the
# test bed's own (2.19, which runs everything else): 2.16 (the oldest), 2.17 (AWX 24.6's EE), 2.18, 2.20 and 2.21
# (the newest; 2.20 and 2.21 on a Python 3.12+ control node) unless named. On each, in a venv of its
# own (tests/ansible_core.sh): on the first named (the oldest), or on each with MATRIX_UNIT=all, the unit tests
# (pytest tests/unit, the plugins and filters on that release's Ansible; not the event sources', which
# ansible-rulebook runs, nor the API client's, which uses no interface of ansible-core and is run by the
# inventory's tests); on each, ansible-test sanity's tests that depend on the release
# (ansible-doc, compile, import, runtime-metadata, validate-modules) and a syntax check of every playbook
# (MATRIX_STEPS="syntax" for some of them). The oldest also converges a lab:
# tests/e2e/test_releases.py. Prints one line per release and step, and fails when any step failed.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
versions=("$@")
(( ${#versions[@]} )) || versions=(2.16 2.17 2.18 2.20 2.21)
# MATRIX_STEPS: which steps (default all three: "unit sanity syntax")
steps="${MATRIX_STEPS:-unit sanity syntax}"
mkdir -p .lab/logs
failed=()
step() {  # step VERSION NAME COMMAND...: runs it on that release, its output in .lab/logs/matrix-VERSION-NAME.log
  local version="$1" name="$2" log=".lab/logs/matrix-$1-$2.log" start rc
  shift 2
  start=$(date +%s)
  PATH="$bin:$PATH" CONVERGED_MATRIX="$version" "$@" >"$log" 2>&1
  rc=$?
  printf '[matrix] ansible-core %s  %-10s %s (%d s)\n' "$version" "$name" \
    "$([[ $rc -eq 0 ]] && echo passed || echo "FAILED (exit $rc, $log)")" $(( $(date +%s) - start ))
  if (( rc )); then failed+=("$version $name"); tail -n 40 "$log" | sed 's/^/  | /'; fi
}
for version in "${versions[@]}"; do
  if ! bin="$(tests/ansible_core.sh "$version")"; then
    failed+=("$version venv"); continue
  fi
  # (its first line, not through head: ansible dies of a broken pipe when head leaves before it is done)
  about="$("$bin/ansible" --version 2>&1)"
  echo "[matrix] ${about%%$'\n'*} ($bin)"
  # the unit tests on the oldest release (with the test bed's own, they bracket the range), or on each with
  # MATRIX_UNIT=all: CI's time
  if [[ " $steps " == *" unit "* ]] && [[ "$version" == "${versions[0]}" || "${MATRIX_UNIT:-}" == all ]]; then
    step "$version" unit python3 -m pytest -q -p no:cacheprovider tests/unit --ignore tests/unit/plugins/test_event_source.py \
      --ignore tests/unit/plugins/test_tick_source.py --ignore tests/unit/plugins/module_utils/test_capi_client.py
  fi
  if [[ " $steps " == *" sanity "* ]]; then
    step "$version" sanity env SANITY_TESTS="ansible-doc compile import runtime-metadata validate-modules" tests/sanity.sh
  fi
  if [[ " $steps " == *" syntax "* ]]; then
    step "$version" syntax ansible-playbook --syntax-check -i localhost, playbooks/*.yml
  fi
done
if (( ${#failed[@]} )); then
  echo "[matrix] failed: $(IFS=,; echo "${failed[*]}")"
  exit 1
fi
echo "[matrix] every step passed on ansible-core ${versions[*]}"
