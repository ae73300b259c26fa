"""`make demo-cluster`: the whole system on one real Kubernetes node on this
machine.

`aip-node run` (e2e/kube-test) starts the node — the genuine control plane,
containerd, runc, the CNI bridge, a kubelet, kube-proxy and CoreDNS, in
network and mount namespaces of its own, with the images of `make images`
imported — and runs this script inside its network. The script does what
docs/quickstart.md tells a platform engineer to do: `helm install` of the
chart as it ships (the operator runs as a pod from its image), `kubectl
apply -k examples/cluster`, `kubectl aip grant`; the kubelet runs the agent
Job's pod with the injected gateway as a native sidecar; the agent (the
official MCP Go SDK's client, in its own container) makes an allowed, a
blocked and a held call; alice approves the held one with `kubectl aip
approve`; the Job completes; kubectl shows what happened. Then it runs the
Job again (deleted and made anew), as a platform team reruns an agent: the
tool server answers every run, and the policy reads Ready after each.

Run from the repository root; needs only Python 3.
"""
import json
import os
import subprocess
import sys
import time

BIN = os.path.abspath(os.environ.get("BIN", "target/debug"))
TOOLS = os.path.abspath("target/bin")
NODE = os.environ.get("AIP_TEST_NODE")
BOLD, DIM, END = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")
started = time.monotonic()


def step(title):
    print(f"\n{BOLD}== {title}{END}  {DIM}({time.monotonic() - started:.1f} s){END}", flush=True)


def shown(args):
    return " ".join(a if " " not in a and "{" not in a else f"'{a}'" for a in args)


def tool(name, *args, user="admin", show=True, check=True, until=None):
    """Runs kubectl or helm as `user`, echoing the command as a person
    would type it. `until`: (prefix, command) — the output is cut at the
    line starting with prefix, and the command that shows the rest named."""
    if show:
        who = "" if user == "admin" else f"{DIM}(as {user}){END} "
        print(f"   {who}$ {name} {shown(args)}", flush=True)
    env = {**os.environ, "KUBECONFIG": os.path.join(NODE, "controlplane", f"{user}.kubeconfig"),
           "PATH": f"{BIN}:{TOOLS}:{os.environ['PATH']}"}
    out = subprocess.run([f"{TOOLS}/{name}", *args], capture_output=True, text=True, env=env)
    if check and out.returncode != 0:
        raise SystemExit(f"{name} {' '.join(args)} failed:\n{out.stdout}{out.stderr}")
    if show:
        for line in (out.stdout + out.stderr).rstrip().splitlines():
            if until and line.startswith(until[0]):
                print(f"     {line} ... (in full: {until[1]})")
                break
            print(f"     {line}")
    return out.stdout


def kubectl(*args, **kwargs):
    return tool("kubectl", *args, **kwargs)


def until(what, check, seconds=180):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    kubectl("get", "pods", "-A", "-o", "wide")
    raise SystemExit(f"timed out waiting for {what} (the node's logs: {NODE})")


def agent_log():
    return kubectl("logs", "-n", "agents", "job/agent", "-c", "agent", show=False, check=False)


def events():
    """The namespace's Events in order, each once. Warnings about a
    ToolConnection that is Healthy now (the NeedsCredentials recorded before
    `kubectl aip grant`) are history, not advice: left out, and said so."""
    print("   $ kubectl get events -n agents --sort-by=.lastTimestamp   (the operator's, each once)", flush=True)
    items = json.loads(kubectl("get", "events", "-n", "agents", "-o", "json", show=False))["items"]
    when = lambda e: e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"]
    healthy = set(kubectl("get", "toolconnections", "-n", "agents", "-o",
                          'jsonpath={.items[?(@.status.health.state=="Healthy")].metadata.name}', show=False).split())
    seen, dropped = set(), set()
    for e in sorted(items, key=when):
        source = (e.get("reportingComponent") or e.get("source", {}).get("component") or "")
        if not source.startswith("aip"):
            continue  # the kubelet's and the scheduler's: kubectl describe pod has them
        obj = e["involvedObject"]
        if e.get("type") == "Warning" and obj["kind"] == "ToolConnection" and obj["name"] in healthy:
            dropped.add(f"{e['reason']} on {obj['name']}")
            continue
        if (e["reason"], e.get("message", "")) in seen:
            continue
        seen.add((e["reason"], e.get("message", "")))
        print(f"     {e['reason']} on {obj['kind']}/{obj['name']}:\n       {e.get('message', '')}")
    for d in sorted(dropped):
        print(f"     ({d}, from before the grant, left out: the connection is Healthy now)")


def run_the_job(first):
    """The agent Job's pod, its calls, a person's approval; the Job Complete
    (its agent exits non-zero when a call did not end as the example
    expects, and then the Job fails and this says so) and the policy Ready
    afterwards: a finished pod no longer counts as governed."""
    if first:
        step("The agent's pod: the injector added the gateway, the kubelet runs it first")
    pod = until("the agent's pod", lambda: json.loads(kubectl(
        "get", "pods", "-n", "agents", "-l", "job-name=agent", "-o", "json", show=False))["items"])[0]
    if first:
        init = {c["name"]: c for c in pod["spec"]["initContainers"]}
        sidecar = init["aip-sidecar"]
        print(f"   initContainers: {', '.join(init)}")
        if "aip-lock-check" in init:
            print(f"     aip-lock-check: `{' '.join(init['aip-lock-check']['args'])}` as user "
                  f"{init['aip-lock-check']['securityContext']['runAsUser']}: the pod proves its egress lock first")
        print(f"     {sidecar['name']}: restartPolicy {sidecar['restartPolicy']} (a native sidecar), "
              f"startup probe {sidecar['startupProbe']['httpGet']['path']}, user "
              f"{sidecar['securityContext']['runAsUser']}")
        env = ", ".join(f"{e['name']}={e.get('value', '')}" for e in pod["spec"]["containers"][0].get("env", []))
        print(f"   the agent container's environment: {env}")
        step("The agent (the official MCP Go SDK's client) calls its tools through the gateway")
    log = until("the agent's held call", lambda: "waiting for a person" in agent_log() and agent_log())
    for line in log.splitlines():
        print(f"   {line}")

    if first:
        step("A person decides the held call")
    tool("kubectl", "aip", "approvals", "-n", "agents", user="alice")
    name = kubectl("get", "approvalrequests", "-n", "agents", "-o",
                   'jsonpath={.items[?(@.status.decision=="Pending")].metadata.name}', show=False).split()[0]
    tool("kubectl", "aip", "approve", name, "-n", "agents", "--reason", "old report, fine", user="alice")
    print("   $ kubectl wait -n agents job/agent --for=condition=Complete --timeout=180s")
    state = until("the Job to finish", lambda: {"Complete", "Failed"} & set(kubectl(
        "get", "job/agent", "-n", "agents", "-o", "jsonpath={.status.conditions[*].type}", show=False).split()))
    for line in agent_log().splitlines()[-2:]:
        print(f"   {line}")
    if "Complete" not in state:
        kubectl("get", "job,pods", "-n", "agents", check=False)
        raise SystemExit("the agent Job failed: a call did not end as the example expects (its log is above)")
    print("   job.batch/agent: Complete")
    kubectl("wait", "-n", "agents", "agentpolicy/files", "--for=condition=Ready", "--timeout=60s")


def main():
    if not NODE:
        raise SystemExit("run by `make demo-cluster` (aip-node run sets AIP_TEST_NODE)")
    step("A Kubernetes node on this machine")
    kubectl("get", "nodes", "-o", "wide")
    print("   users: admin (system:masters), alice (group approvers)")

    step("Install the Helm chart as it ships (the operator runs as a pod from its image), "
         "with the egress lock's CNI plugin on the node")
    # The node's own CNI directories and DNS server (a cluster of your own:
    # /opt/cni/bin, /etc/cni/net.d and Service kube-system/kube-dns, the
    # defaults).
    info = json.load(open(os.path.join(NODE, "node.json")))
    tool("helm", "install", "aip", "charts/aip", "--namespace", "aip-system", "--create-namespace",
         "--set", "egressLock.cni.enabled=true",
         "--set", f"egressLock.cni.binDir={os.path.join(NODE, 'cni-bin')}",
         "--set", f"egressLock.cni.confDir={os.path.join(NODE, 'cni')}",
         "--set", f"egressLock.clusterDNS[0]={info['node_address']}",
         "--wait", "--timeout", "5m", until=("NOTES:", "helm get notes aip -n aip-system"))
    kubectl("get", "pods", "-n", "aip-system", "-o", "wide")

    step("The example, as the quickstart applies it")
    kubectl("apply", "-k", "examples/cluster")
    kubectl("aip", "grant", "fs", "-n", "agents")

    run_the_job(first=True)

    step("Run it again: the Job deleted and made anew")
    kubectl("delete", "job", "agent", "-n", "agents", "--wait=true")
    kubectl("apply", "-k", "examples/cluster")
    run_the_job(first=False)

    step("What the cluster says")
    kubectl("get", "aip", "-n", "agents")
    kubectl("get", "job,pods", "-n", "agents")
    events()
    calls = [l for l in kubectl("logs", "-n", "tools", "deployment/files", show=False).splitlines() if '"tool"' in l]
    print(f"\n   The file service saw {len(calls)} tool calls: the blocked one never left the agent's pod.")
    warnings = [l for l in kubectl("logs", "-n", "aip-system", "-l", "app.kubernetes.io/name=aip-operator",
                                   "--tail=-1", "--prefix", show=False).splitlines()
                if '"level":"WARN"' in l or '"level":"ERROR"' in l]
    print(f"   The operator logged {len(warnings)} warnings and errors.")
    for w in warnings:
        print(f"     {w}")
    print(f"   Done in {time.monotonic() - started:.1f} s, in real pods on a real node.")


if __name__ == "__main__":
    main()
