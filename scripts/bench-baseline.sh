#!/usr/bin/env bash
# `make bench`'s previous build: the aip-operator binary of an earlier
# commit, so that the scale benchmark measures the operator's propagation
# before and after a change in one run, on one control plane
# (operator/benches/scale.rs, AIP_BENCH_BASELINE_OPERATOR).
#
# AIP_BENCH_BASELINE_REV names the commit (default: the one below, the
# operator before issue 44's changes to approvals, capacity and the pod
# feed). Built once, from a git worktree of that commit in
# target/baseline/src-REV, into target/baseline/REV/aip-operator (release,
# --locked); later runs reuse it. The worktree is removed after the build.
# Prints the binary's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
rev="${AIP_BENCH_BASELINE_REV:-a2c8b02}"
full="$(git rev-parse --verify "$rev^{commit}")"
short="${full:0:12}"
out="target/baseline/$short"
if [ -x "$out/aip-operator" ]; then
  echo "$PWD/$out/aip-operator"
  exit 0
fi
src="target/baseline/src-$short"
mkdir -p target/baseline
git worktree remove --force "$src" 2>/dev/null || true
rm -rf "$src"
trap 'git worktree remove --force "$src" 2>/dev/null || rm -rf "$src"' EXIT
echo "building the previous build's aip-operator ($short) for the scale benchmark (release, once; minutes) ..." >&2
git worktree add --detach "$src" "$full" >&2
cargo build --locked --release -p aip-operator --manifest-path "$src/Cargo.toml" \
  --target-dir target/baseline/target >&2
mkdir -p "$out"
cp target/baseline/target/release/aip-operator "$out/aip-operator"
echo "$PWD/$out/aip-operator"
