#!/bin/sh
# A caller that retries a CLI once after a failure — the part of an agent's
# tool wrapper that cli-transient-then-success.yaml rehearses. Run it with
# the mock's shims first on PATH; it never knows kubectl is mocked.
out=$(kubectl get deployment web -o name)
rc=$?
if [ "$rc" -ne 0 ]; then
    echo "kubectl exited $rc; retrying once" >&2
    out=$(kubectl get deployment web -o name)
    rc=$?
fi
if [ "$rc" -ne 0 ]; then
    echo "kubectl exited $rc again; giving up" >&2
    exit "$rc"
fi
echo "found $out"
