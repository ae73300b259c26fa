#!/usr/bin/env bash
# Builds go-containerregistry's crane — the tool `make images` assembles the
# image archives with — from its published Go module (tools/images/go.mod,
# a `tool` directive) into target/tools/crane. Keyed by a hash of go.mod,
# go.sum and this script: an unchanged module costs nothing. The first
# build downloads the modules from the Go module proxy (a few MB, seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
module=tools/images
out=target/tools/crane
key=$(cat "$module/go.mod" "$module/go.sum" "$0" | sha256sum | cut -c1-16)
if [ -x "$out" ] && [ -f "$out.key" ] && [ "$(cat "$out.key")" = "$key" ]; then
  exit 0
fi
command -v go >/dev/null || {
  echo "ensure-crane: go is not on PATH (Go 1.26 or newer builds crane for make images)" >&2
  exit 1
}
echo "building crane from Go modules ($module) into $out ..."
mkdir -p "$(dirname "$out")"
rm -f "$out.key"
. scripts/go-scratch.sh
go_scratch crane
(cd "$module" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "../../$out" \
  github.com/google/go-containerregistry/cmd/crane)
echo "$key" > "$out.key"
"$out" version
