#!/usr/bin/env bash
# `make lint` for the Helm chart: helm lint --strict, then every rendered
# variant (and the CRDs) validated offline against the Kubernetes schemas
# with kubernetes-validate --strict (unknown fields are errors), and the
# NetworkPolicy checked against the webhooks and ports it must match.
set -euo pipefail
cd "$(dirname "$0")/.."
helm=target/bin/helm
validate=target/pyenv/bin/kubernetes-validate
chart=charts/aip
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

$helm lint --strict "$chart"
variants=(
  "default|"
  "cert-manager|--set tls.certManager.enabled=true --set serviceMonitor.enabled=true --set rbac.approverAggregatesToAdmin=true"
  "minimal|--set injection.enabled=false --set networkPolicy.enabled=false --set replicaCount=1 --set rbac.userRoles=false"
  "outside|--set service.externalName=localhost --set service.webhookPort=9443"
  "listeners|--set sidecar.adminAddress=0.0.0.0 --set sidecar.metricsAddress=:: --set sidecar.metricsPort=9090 --set-json networkPolicy.metrics.namespaceSelector={} --set networkPolicy.metrics.podSelector.matchLabels.app=prometheus --set networkPolicy.metrics.extraFrom[0].ipBlock.cidr=10.0.0.0/8 --set networkPolicy.grpc.extraFrom[0].ipBlock.cidr=192.168.0.0/16"
  "egress-lock|--set egressLock.cni.enabled=true --set egressLock.clusterDNS[0]=10.96.0.10 --set egressLock.clusterDNS[1]=fd00::a --set egressLock.cni.binDir=/var/lib/cni/bin"
)
for v in "${variants[@]}"; do
  name=${v%%|*}
  # shellcheck disable=SC2086
  $helm template aip "$chart" --namespace aip-system ${v#*|} > "$out/$name.yaml"
  # Kinds of other projects (cert-manager, Prometheus Operator) have no
  # schema here: warned about, not failed.
  $validate --strict --quiet "$out/$name.yaml"
  # What it admits, against the webhooks' selectors and the container's ports.
  target/pyenv/bin/python scripts/check-networkpolicy.py "$out/$name.yaml"
  echo "rendered manifests valid: $name ($(grep -c '^kind:' "$out/$name.yaml") objects)"
done
$validate --strict --quiet "$chart/crds/aip.io.yaml"
echo "chart lint: ok"
