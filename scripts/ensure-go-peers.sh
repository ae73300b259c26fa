#!/usr/bin/env bash
# Builds the Go test peers of e2e/peers (real third-party readers and
# servers the tests talk to: encoding/json, the official MCP Go SDK and its
# conformance server) into target/peers/. The build is keyed by a hash of
# the module's files and this script, so an
# unchanged module costs nothing; the first build downloads the modules
# from the Go module proxy (about 20 s).
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/peers
key=$( (cd e2e/peers && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 \
  | sort -z | xargs -0 sha256sum; sha256sum ../../scripts/ensure-go-peers.sh) | sha256sum | cut -c1-16)
if [ -f "$out/.key" ] && [ "$(cat "$out/.key")" = "$key" ]; then
  exit 0
fi
command -v go >/dev/null || { echo "ensure-go-peers: go is not on PATH (Go 1.26 or newer is needed for the test peers)" >&2; exit 1; }
echo "building the Go test peers (e2e/peers) into $out ..."
mkdir -p "$out"
. scripts/go-scratch.sh
go_scratch peers
(cd e2e/peers && CGO_ENABLED=0 go build -trimpath -o "../../$out/" ./cmd/...)
# The official Go SDK's MCP conformance server, the reference the
# conformance suite's server scenarios expect (scripts/mcp-conformance.sh).
(cd e2e/peers && CGO_ENABLED=0 go build -trimpath -o "../../$out/mcp-conformance-server" \
  github.com/modelcontextprotocol/go-sdk/conformance/everything-server)
echo "$key" > "$out/.key"
ls "$out"
