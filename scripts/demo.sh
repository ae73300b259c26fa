#!/usr/bin/env bash
# `make demo`: the aip gateway in front of a scripted MCP server, driven by
# the unmodified Python MCP SDK. No cluster, no network beyond loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/debug}
PYTHON=${PYTHON:-target/pyenv/bin/python}

work=$(mktemp -d)
# What the gateway and the server recorded stays after the demo.
keep=target/demo
mkdir -p "$keep"
rm -f "$keep/audit.jsonl" "$keep/upstream-attempts.jsonl"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { # wait_for URL: until it answers (bounded)
  for _ in $(seq 1 100); do
    if "$PYTHON" -c "import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)" "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "timed out waiting for $1" >&2; return 1
}

echo "starting aip-fault-server (a scripted inventory MCP server) and aip-sidecar in front of it ..."
upstream_port=$(free_port); agent_port=$(free_port); admin_port=$(free_port)
sed "s|UPSTREAM_URL|http://127.0.0.1:${upstream_port}/mcp|" examples/gateway/gateway.yaml > "$work/gateway.yaml"

"$BIN/aip-fault-server" --config examples/gateway/faults.yaml --http "127.0.0.1:${upstream_port}" \
  --log "$keep/upstream-attempts.jsonl" 2>/dev/null &
pids+=($!)
wait_for "http://127.0.0.1:${upstream_port}/healthz"

RUST_LOG=warn "$BIN/aip-sidecar" run --config "$work/gateway.yaml" \
  --listen "127.0.0.1:${agent_port}" --admin "127.0.0.1:${admin_port}" \
  --audit "$keep/audit.jsonl" --approval-token-file "$work/approval-token" 2>/dev/null &
pids+=($!)
wait_for "http://127.0.0.1:${admin_port}/readyz"
# Until its first health check passes, a connection lists no tools.
for _ in $(seq 1 100); do
  if "$PYTHON" -c "import json,sys,urllib.request; c=json.load(urllib.request.urlopen(sys.argv[1]))['connections']; sys.exit(0 if c and c[0]['health']['state']=='Healthy' else 1)" "http://127.0.0.1:${admin_port}/connections"; then break; fi
  sleep 0.1
done

echo "aip gateway on http://127.0.0.1:${agent_port}/mcp, in front of a scripted inventory server"
"$PYTHON" scripts/demo_agent.py "http://127.0.0.1:${agent_port}/mcp" "http://127.0.0.1:${admin_port}" "$work/approval-token"

if [ -t 1 ]; then printf '\n\033[1m== What the gateway recorded\033[0m\n'; else printf '\n== What the gateway recorded\n'; fi
echo "   audit lines:    $(wc -l < "$keep/audit.jsonl") (decisions, DLP events, upstream failures; arguments redacted)"
# Whole records, one per line, for the blocks and the upstream failure.
grep -h '"event":"UPSTREAM_FAILURE"\|"decision":"BLOCK"' "$keep/audit.jsonl" | sed 's/^/   /'
echo "   upstream calls: $(wc -l < "$keep/upstream-attempts.jsonl") (each agent call reached the server at most once)"
"$PYTHON" -c "import json,sys,urllib.request; print('   connection:', json.dumps(json.load(urllib.request.urlopen(sys.argv[1]))['connections'][0]['health']))" "http://127.0.0.1:${admin_port}/connections"
echo "   the whole audit log: $keep/audit.jsonl; the server's attempts: $keep/upstream-attempts.jsonl"
