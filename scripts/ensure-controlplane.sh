#!/usr/bin/env bash
# Builds the genuine Kubernetes control plane the tests and `make
# demo-cluster` run against — kube-apiserver, kube-controller-manager and
# etcd — from their published Go modules (e2e/controlplane/go.mod) into
# target/controlplane/, static, with the real version stamped in. The result
# is keyed by a hash of go.mod, go.sum and this script: an unchanged module
# costs nothing. The first build downloads about 1 GB of modules from the Go
# module proxy and compiles for 10-20 minutes on 2 cores; progress is shown.
set -euo pipefail
cd "$(dirname "$0")/.."
module=e2e/controlplane
out=target/controlplane
key=$(cat "$module/go.mod" "$module/go.sum" "$0" | sha256sum | cut -c1-16)
if [ -f "$out/.key" ] && [ "$(cat "$out/.key")" = "$key" ] \
  && [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-controller-manager" ] && [ -x "$out/etcd" ]; then
  exit 0
fi
command -v go >/dev/null || {
  echo "ensure-controlplane: go is not on PATH (Go 1.26 or newer builds the control plane)" >&2
  exit 1
}
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$module/go.mod")
[ -n "$version" ] || { echo "ensure-controlplane: no k8s.io/kubernetes version in $module/go.mod" >&2; exit 1; }
minor=$(echo "$version" | cut -d. -f2)
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
mkdir -p "$out"
rm -f "$out/.key"
started=$(date +%s)
progress() { # name: one line per 200 packages compiled, and any compiler error
  local n=0 line
  while IFS= read -r line; do
    case "$line" in *.go:[0-9]*:*|'# '*) echo "$line" ;; esac
    n=$((n + 1))
    if [ $((n % 200)) -eq 0 ]; then echo "  $1: $n packages so far (${SECONDS}s)"; fi
  done
}
build() { # name package
  echo "building $1 from Go modules (Kubernetes $version) ..."
  (cd "$module" && CGO_ENABLED=0 go build -v -trimpath -ldflags "$ldflags" -o "../../$out/$1" "$2") 2>&1 \
    | progress "$1"
  [ -x "$out/$1" ] || { echo "ensure-controlplane: building $1 failed" >&2; exit 1; }
}
build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
echo "$key" > "$out/.key"
echo "control plane $version built in $(( $(date +%s) - started ))s:"
"$out/kube-apiserver" --version
# sed reads everything: with `head -1` etcd could die of SIGPIPE and, with
# pipefail, fail a build that succeeded.
"$out/etcd" --version | sed -n 1p
