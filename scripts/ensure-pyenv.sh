#!/usr/bin/env bash
# Creates target/pyenv, a virtualenv holding the pinned Python MCP SDK for
# the interop tests and the demo agent, and kubernetes-validate for `make
# lint`. `python3 -m venv` bootstraps pip with
# ensurepip, which some Pythons lack or cannot run (a distribution Python
# without python3-venv, a sandbox that refuses it); then the virtualenv is
# made without pip and the interpreter's own pip installs into it.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=target/pyenv
# Everything comes from scripts/requirements.lock: every package of the
# closure pinned with the sha256 of each file PyPI serves, so pip refuses
# anything else (scripts/lock-python.sh regenerates it).
lock=scripts/requirements.lock
reqs=(--require-hashes -r "$lock")
for pin in $(grep -hv '^#' e2e/fault-server/tests/requirements.txt scripts/requirements-lint.txt); do
  name=${pin%%==*}
  if ! grep -qi "^${name//_/-}==${pin#*==} " "$lock" && ! grep -qi "^${name}==${pin#*==} " "$lock"; then
    echo "error: $lock does not pin $pin: run scripts/lock-python.sh" >&2
    exit 1
  fi
done
# The pinned MCP SDK needs Python 3.10 or newer; an older one fails deep in
# pip's resolver with a message that does not say so.
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
  echo "error: python3 is $(python3 -c 'import platform; print(platform.python_version())'); the pinned MCP SDK (mcp 2.x) needs Python 3.10 or newer" >&2
  exit 1
}
echo "creating $env_dir: the Python MCP SDK and kubernetes-validate from PyPI (every file checked against $lock; about 20 s) ..."
rm -rf "$env_dir"
if log=$(python3 -m venv "$env_dir" 2>&1); then
  "$env_dir/bin/python3" -m pip install --quiet --disable-pip-version-check "${reqs[@]}"
else
  echo "python3 -m venv failed; retrying without ensurepip:" >&2
  printf '%s\n' "$log" | tail -n 5 >&2
  rm -rf "$env_dir"
  python3 -m venv --without-pip "$env_dir"
  python3 -m pip --python "$env_dir/bin/python3" install --quiet --disable-pip-version-check "${reqs[@]}"
fi
"$env_dir/bin/python3" -c 'import mcp, kubernetes_validate, sys; print("  ready:", sys.executable)'
touch "$env_dir/.installed"
