#!/usr/bin/env bash
# Builds the MCP gateways the gateway benchmark measures beside the sidecar
# (sidecar/benches/gateway.rs, docs/performance.md) into target/tools:
#
#   mcp-proxy  MCP_PROXY_VERSION from crates.io, `cargo install --locked`
#              (its own Cargo.lock pins every crate); about 15-20 minutes
#              on 2 cores the first time, about 35 MB.
#   thv        ToolHive's CLI, THV_VERSION, `go install` of cmd/thv with
#              GOTOOLCHAIN=go1.27.3 (its own go.sum pins every module);
#              about 10 minutes the first time, about 180 MB.
#
# Each is keyed by its version and this script, so later runs cost
# nothing. ToolHive releases newer than v0.47.0 cannot be built here: they
# need module versions the Go module proxy refuses (docs/performance.md
# lists them). A peer that fails to build is reported and left out; the
# benchmark measures the others (AIP_BENCH_PEERS=0 leaves both out).
set -euo pipefail
cd "$(dirname "$0")/.."
MCP_PROXY_VERSION=0.6.0
THV_VERSION=v0.47.0
tools=target/tools
mkdir -p "$tools"
script_key=$(sha256sum "$0" | cut -c1-16)

fresh() { # <binary> <key>: whether the binary was built with this key
  [ -x "$1" ] && [ -f "$1.key" ] && [ "$(cat "$1.key")" = "$2" ]
}

proxy="$tools/mcp-proxy-$MCP_PROXY_VERSION/bin/mcp-proxy"
if ! fresh "$proxy" "$script_key"; then
  echo "building mcp-proxy $MCP_PROXY_VERSION from crates.io into $tools (cargo install --locked; the first time takes 15-20 minutes on 2 cores) ..."
  rm -f "$proxy.key"
  if cargo install --locked --quiet --version "$MCP_PROXY_VERSION" \
      --root "$tools/mcp-proxy-$MCP_PROXY_VERSION" mcp-proxy; then
    echo "$script_key" > "$proxy.key"
  else
    echo "ensure-bench-peers: mcp-proxy $MCP_PROXY_VERSION did not build; the benchmark leaves it out" >&2
  fi
fi

thv="$tools/thv-$THV_VERSION/thv"
if ! fresh "$thv" "$script_key"; then
  echo "building ToolHive $THV_VERSION (cmd/thv) from the Go module proxy into $tools (the first time takes about 10 minutes) ..."
  rm -f "$thv.key"
  if GOTOOLCHAIN=go1.27.3 CGO_ENABLED=0 GOBIN="$PWD/$tools/thv-$THV_VERSION" \
      go install -trimpath -ldflags "-s -w" "github.com/stacklok/toolhive/cmd/thv@$THV_VERSION"; then
    echo "$script_key" > "$thv.key"
  else
    echo "ensure-bench-peers: ToolHive $THV_VERSION did not build; the benchmark leaves it out" >&2
  fi
fi

# What was built, for the benchmark (sidecar/benches/peers): name -> binary
# and version; a peer that did not build is not listed.
{
  sep=""
  printf '{'
  for entry in "mcp-proxy|$proxy|$MCP_PROXY_VERSION" "thv|$thv|$THV_VERSION"; do
    IFS='|' read -r name bin version <<< "$entry"
    if [ -f "$bin.key" ]; then
      printf '%s"%s": {"bin": "%s", "version": "%s"}' "$sep" "$name" "$PWD/$bin" "$version"
      sep=", "
      echo "bench peer: $name $version ($bin)" >&2
    fi
  done
  printf '}\n'
} > "$tools/bench-peers.json.tmp"
mv "$tools/bench-peers.json.tmp" "$tools/bench-peers.json"
exit 0
