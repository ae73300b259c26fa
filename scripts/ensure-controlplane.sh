#!/usr/bin/env bash
# Builds the genuine Kubernetes the tests and `make demo-cluster` run on —
# the control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler, etcd) and the node's own parts (kubelet, kube-proxy) —
# from their published Go modules (e2e/controlplane/go.mod) into
# target/controlplane/, static, with the real version stamped in. The result
# is keyed by a hash of go.mod, go.sum and this script: an unchanged module
# costs nothing. The first build downloads about 1 GB of modules from the Go
# module proxy and compiles for 10-20 minutes on 2 cores; progress is shown.
set -euo pipefail
cd "$(dirname "$0")/.."
module=e2e/controlplane
out=target/controlplane
dns=e2e/coredns
key=$(cat "$module/go.mod" "$module/go.sum" "$dns/go.mod" "$dns/go.sum" "$dns/main.go" "$0" | sha256sum | cut -c1-16)
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy coredns)
built() {
  [ -f "$out/.key" ] && [ "$(cat "$out/.key")" = "$key" ] || return 1
  local b
  for b in "${binaries[@]}"; do [ -x "$out/$b" ] || return 1; done
}
if built; then exit 0; fi
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
. scripts/go-scratch.sh
go_scratch controlplane
started=$(date +%s)
progress() { # one line per 200 packages compiled, and any compiler error
  local n=0 line
  while IFS= read -r line; do
    case "$line" in *.go:[0-9]*:*|'# '*) echo "$line" ;; esac
    n=$((n + 1))
    if [ $((n % 200)) -eq 0 ]; then echo "  $n packages so far (${SECONDS}s)"; fi
  done
}
# One `go build` for all six, so that the compiler runs on both cores for
# the whole build; a main package's binary is named by the last element of
# its path, so etcd (go.etcd.io/etcd/server/v3, the major version dropped) arrives as `server`.
echo "building ${binaries[*]} from Go modules (Kubernetes $version) ..."
rm -f "$out/server"
(cd "$module" && CGO_ENABLED=0 go build -v -trimpath -ldflags "$ldflags" -o "../../$out/" \
  go.etcd.io/etcd/server/v3 \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-proxy) 2>&1 | progress
[ -x "$out/server" ] && mv "$out/server" "$out/etcd"
# CoreDNS, the node's cluster DNS: a module of its own (e2e/coredns), as
# its dependencies are not Kubernetes's.
echo "building coredns from Go modules ($(awk '$1 == "require" && $2 == "github.com/coredns/coredns" {print $3}' "$dns/go.mod")) ..."
(cd "$dns" && CGO_ENABLED=0 go build -v -trimpath -ldflags "-s -w" -o "../../$out/coredns" .) 2>&1 | progress
for b in "${binaries[@]}"; do
  [ -x "$out/$b" ] || { echo "ensure-controlplane: building $b failed" >&2; exit 1; }
done
echo "$key" > "$out/.key"
echo "Kubernetes $version built in $(( $(date +%s) - started ))s:"
"$out/kube-apiserver" --version
# sed reads everything: with `head -1` etcd could die of SIGPIPE and, with
# pipefail, fail a build that succeeded.
"$out/etcd" --version | sed -n 1p
