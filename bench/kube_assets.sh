#!/usr/bin/env bash
# How long `make kube-assets` takes (kube-apiserver and the Cluster API, CAPM3 and Bare Metal Operator
# managers built from their Go modules), in caches of its own so nothing of the user's is touched:
#   cold     empty Go module and build caches, no binaries: what a fresh machine (and CI) pays
#   rebuild  Go's caches warm, no binaries: a version changed elsewhere, or the binary cache removed
#   cached   everything there: what every later make kube-assets, make test or make lab pays
#
#   bench/kube_assets.sh [--keep]     (--keep: leave the caches in the printed directory)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d /tmp/kube-assets-bench.XXXXXX)
[[ "${1:-}" == --keep ]] || trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
export GOCACHE="$work/go-build" GOMODCACHE="$work/go-mod" CONVERGED_HPC_CACHE="$work/cache"

run() {
  local what=$1 t0 t1
  t0=$(date +%s%N)
  "$repo/kube-assets/build.sh" "$work/assets" >"$work/$what.log" 2>&1 || { cat "$work/$what.log"; exit 1; }
  t1=$(date +%s%N)
  printf '%-8s %7.1f s   %s\n' "$what" "$(( (t1 - t0) / 1000000 ))e-3" \
    "$(grep -o 'built [a-z -]* in [0-9]* s' "$work/$what.log" | paste -sd ';' - | sed 's/;/; /g')"
}

echo "make kube-assets on $(nproc) cores, $(go version 2>/dev/null | cut -d' ' -f3), $(date -u +%F)"
run cold
rm -rf "$CONVERGED_HPC_CACHE"
run rebuild
run cached
du -sh "$GOMODCACHE" "$GOCACHE" "$CONVERGED_HPC_CACHE/kube-assets" 2>/dev/null | sed "s|$work/||"
for b in kube-apiserver cluster-api-manager capm3-manager baremetal-operator; do
  printf '%-20s %s MB\n' "$b" "$(( $(stat -L -c %s "$work/assets/$b") / 1000000 ))"
done
[[ "${1:-}" != --keep ]] || echo "caches kept in $work"
