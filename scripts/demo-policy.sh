#!/usr/bin/env bash
# A walk through the example policies with the `aip` CLI: validation errors,
# allow, block, ask, protected paths, monitor mode, DLP, and conversion to a
# Kubernetes object. No cluster, no network. Every command is printed as it
# can be pasted into a shell from the repository root.
set -euo pipefail
AIP=${1:-target/debug/aip}
cd "$(dirname "$0")/.."

# Bold headings on a terminal only: a log or a pipe gets plain text.
if [ -t 1 ]; then BOLD=$'\033[1m' END=$'\033[0m'; else BOLD='' END=''; fi
step() { printf '\n%s== %s%s\n' "$BOLD" "$*" "$END"; }

# quote ARG: ARG as a shell reads it back — bare when it is only safe
# characters, else in single quotes.
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}
# run ARGS...: prints `$ aip ARGS` (with the binary's real path), then runs it.
run() {
  local shown="\$ $(quote "$AIP")" a
  for a in "$@"; do shown+=" $(quote "$a")"; done
  printf '%s\n' "$shown"
  "$AIP" "$@"
}
call() { # call POLICY TOOL ARGS-JSON [extra aip args...]
  local policy=$1 tool=$2 args=$3; shift 3
  run policy eval "$policy" \
    --request "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"$tool\",\"arguments\":$args}}" "$@"
}

step "Validate the example policies (the last one is broken on purpose)"
run policy check examples/filesystem-readonly.yaml examples/github-agent.yaml examples/monitor-rollout.yaml
run policy check examples/invalid-policy.yaml || echo "(exit $? — every error names its field)"

step "A read inside /workspace is allowed"
call examples/filesystem-readonly.yaml read_file '{"path":"/workspace/README.md"}'

step "Writing is blocked by a tool rule"
call examples/filesystem-readonly.yaml write_file '{"path":"/workspace/x","content":"hi"}'

step "A read outside the allowed directories fails argument validation"
call examples/filesystem-readonly.yaml read_file '{"path":"/etc/passwd"}'

step "Credentials are protected however the path is spelled"
call examples/filesystem-readonly.yaml list_directory "{\"path\":\"/workspace/..${HOME:-/root}/./.ssh\"}"
call examples/filesystem-readonly.yaml search_files '{"path":"file:///workspace","pattern":"~/%2Eaws/credentials"}'

step "Case and Unicode tricks do not get around a block (fullwidth letters)"
call examples/github-agent.yaml 'ｄｅｌｅｔｅ_repository' '{"owner":"acme","repo":"api"}'

step "Merging needs a person: ASK, then the answers"
call examples/github-agent.yaml merge_pull_request '{"owner":"acme","merge_method":"squash"}'
call examples/github-agent.yaml merge_pull_request '{"owner":"acme","merge_method":"squash"}' --approval deny
call examples/github-agent.yaml merge_pull_request '{"owner":"acme","merge_method":"squash"}' --approval timeout

step "Monitor mode forwards what enforce mode would block, and records it"
call examples/monitor-rollout.yaml run_query '{"query":"DELETE FROM users"}'

step "...but methods outside allowed_methods stay blocked"
run policy eval examples/monitor-rollout.yaml \
  --request '{"jsonrpc":"2.0","id":"r7","method":"resources/read","params":{"uri":"file:///etc/passwd"}}'

step "DLP redacts tool results before the agent sees them"
run policy redact examples/github-agent.yaml \
  --result '{"content":[{"type":"text","text":"token ghp_0123456789abcdefghijABCDEFGHIJ012345 by ops@acme.io"}]}'

step "The same file, ready for kubectl apply (the first 12 lines)"
run policy convert examples/github-agent.yaml --namespace agents | head -12
echo "..."
