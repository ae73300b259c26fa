"""`make demo-cluster`: the whole system on one machine, on the genuine
Kubernetes control plane.

etcd, kube-apiserver and kube-controller-manager (built from their Go
modules by scripts/ensure-controlplane.sh) run on loopback, started by
aip-kube-test's control_plane example; `helm install` installs the chart,
its Service pointing the API server at this host; the operator runs as the
chart's service account under the chart's RBAC; there is no kubelet, so this
script plays it for one agent pod (it starts the sidecar the injector put in
the pod, with a token bound to the pod) and an agent (the unmodified Python
MCP SDK). Then: a policy, a blocked call, an ask approved with `kubectl patch
--subresource=status`, and the ToolConnection's health in `kubectl get`.

Run from the repository root with the project's Python (target/pyenv).
"""
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

BIN = os.environ.get("BIN", "target/debug")
TOOLS = os.path.abspath("target/bin")
BOLD, DIM, END = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")

work = tempfile.mkdtemp(prefix="aip-demo-cluster-")
procs = []
kubeconfigs = {}


def step(title):
    print(f"\n{BOLD}== {title}{END}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name, argv, env=None, stdout=None):
    log = open(os.path.join(work, f"{name}.log"), "w")
    p = subprocess.Popen(argv, stdout=stdout or log, stderr=subprocess.STDOUT if stdout is None else log,
                         env={**os.environ, **(env or {})}, text=True)
    procs.append(p)
    return p


def wait_for(what, check, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what} (logs in {work})")


def shown(args):
    return " ".join(a if " " not in a and "{" not in a else f"'{a}'" for a in args)


def tool(name, *args, user="admin", stdin=None, show=True, check=True, until=None):
    """Runs kubectl or helm as `user`, echoing the command as a person would
    type it. `until`: (prefix, command) — the output is cut at the line
    starting with prefix, and the command that shows the rest is named."""
    if show:
        who = "" if user == "admin" else f"{DIM}(as {user}){END} "
        print(f"   {who}$ {name} {shown(args)}", flush=True)
    env = {**os.environ, "KUBECONFIG": kubeconfigs[user],
           "PATH": f"{os.path.abspath(BIN)}:{TOOLS}:{os.environ['PATH']}",
           "HELM_CACHE_HOME": os.path.join(work, "helm", "cache"),
           "HELM_CONFIG_HOME": os.path.join(work, "helm", "config"),
           "HELM_DATA_HOME": os.path.join(work, "helm", "data")}
    out = subprocess.run([f"{TOOLS}/{name}", *args], input=stdin, capture_output=True, text=True, env=env)
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


def helm(*args, **kwargs):
    return tool("helm", *args, **kwargs)


def control_plane():
    """Starts etcd, kube-apiserver and kube-controller-manager (the
    control_plane example of aip-kube-test); reads where each user's
    kubeconfig is. The processes go when it is stopped (or dies)."""
    example = os.path.join(BIN, "examples", "control_plane")
    if not os.path.exists(example):
        raise SystemExit(f"{example} is missing: run `make demo-cluster`, which builds it")
    p = start("control-plane", [example], stdout=subprocess.PIPE)
    started = time.monotonic()
    for line in p.stdout:
        line = line.rstrip()
        if line.startswith("KUBECONFIG="):
            path, _, comment = line[len("KUBECONFIG="):].partition("  # ")
            kubeconfigs[comment.split(",")[0]] = path
        elif line.startswith("logs, certificates and keys:"):
            print(f"   {line}")
        elif line.startswith("https://"):
            print(f"   {line}")
        elif line.startswith("Ctrl-C"):
            return time.monotonic() - started
    raise SystemExit(f"the control plane did not start; see {work}/control-plane.log")


def token_kubeconfig(name, token):
    """The administrator's kubeconfig with another bearer token."""
    import yaml  # PyYAML arrives with kubernetes-validate in the project's virtualenv.
    config = yaml.safe_load(open(kubeconfigs["admin"]))
    for user in config["users"]:
        user["user"] = {"token": token}
    path = os.path.join(work, f"{name}.kubeconfig")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    kubeconfigs[name] = path
    return path


def yaml_docs(text):
    import yaml
    return [d for d in yaml.safe_load_all(text) if d]


async def call(session, name, arguments):
    try:
        result = await session.call_tool(name, arguments)
        text = " ".join(c.text for c in result.content if getattr(c, "text", None))
        return f"result: {text}"
    except Exception as exc:
        error = getattr(exc, "error", None)
        if error is None:
            return f"error: {exc}"
        # The policy's reason travels in error.data (AIP's error object).
        data = error.data if isinstance(error.data, dict) else {}
        reason = f" ({data['reason']})" if data.get("reason") else ""
        return f"error {error.code}: {error.message}{reason}"


async def agent(url):
    async with streamable_http_client(url) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            step("The agent lists its tools (delete waits for a person)")
            for tool in (await session.list_tools()).tools:
                print(f"   {tool.name}: {tool.description}")
            step("Allowed: fs_read_file")
            print("   " + await call(session, "fs_read_file", {"path": "/reports/q3.txt"}))
            step("Blocked: fs_chmod is not in allowed_tools")
            print("   " + await call(session, "fs_chmod", {"path": "/etc/passwd", "mode": "777"}))
            step("Held: fs_delete_file waits for an approver; the agent's other calls do not")
            held = asyncio.create_task(call(session, "fs_delete_file", {"path": "/tmp/old.log"}))
            name = await asyncio.to_thread(pending_request)
            kubectl("get", "approvalrequests", "-n", "agents")
            print("   " + await call(session, "fs_read_file", {"path": "/reports/q4.txt"}) + "   (meanwhile)")
            kubectl("patch", "approvalrequest", name, "-n", "agents", "--subresource=status", "--type=merge",
                    "-p", '{"status":{"decision":"Approved","reason":"old log, fine"}}', user="alice")
            print("   " + await held)
            kubectl("get", "approvalrequest", name, "-n", "agents", "-o",
                    "jsonpath={.status.decision} by {.status.decidedBy} at {.status.decidedAt}{\"\\n\"}")


def events():
    """The namespace's Events in order, each once: the operator records an
    approval's Events on the ApprovalRequest and on the pod, so one line
    names both; a repeated Event is one line with its count. Warnings about
    a ToolConnection that is Healthy now are left out: the NeedsCredentials
    the operator recorded before the demo's `kubectl aip grant` is history,
    not advice."""
    print("   $ kubectl get events -n agents --sort-by=.lastTimestamp   (each once)", flush=True)
    items = json.loads(kubectl("get", "events", "-n", "agents", "-o", "json", show=False))["items"]
    when = lambda e: e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"]
    healthy = set(kubectl("get", "toolconnections", "-n", "agents", "-o",
                          'jsonpath={.items[?(@.status.health.state=="Healthy")].metadata.name}', show=False).split())
    lines, dropped = {}, []
    for e in sorted(items, key=when):
        obj = e["involvedObject"]
        if e.get("type") == "Warning" and obj["kind"] == "ToolConnection" and obj["name"] in healthy:
            dropped.append(f"{e['reason']} on {obj['name']}")
            continue
        key = (e["reason"], e.get("message", ""))
        objects, count = lines.get(key, ([], 0))
        if f"{obj['kind']}/{obj['name']}" not in objects:
            objects.append(f"{obj['kind']}/{obj['name']}")
        else:
            count += max(e.get("count") or 1, 1)
        lines[key] = (objects, max(count, 1))
    for (reason, message), (objects, count) in lines.items():
        times = f" (x{count})" if count > 1 else ""
        print(f"     {reason}{times} on {', '.join(objects)}:\n       {message}")
    for d in sorted(set(dropped)):
        print(f"     ({d}, from before the grant, left out: the connection is Healthy now)")


def pending_request():
    for _ in range(300):
        names = kubectl("get", "approvalrequests", "-n", "agents", "-o",
                        'jsonpath={.items[?(@.status.decision=="Pending")].metadata.name}', show=False).split()
        if names:
            return names[0]
        time.sleep(0.1)
    raise SystemExit("no ApprovalRequest appeared")


def main():
    step("A Kubernetes control plane: the genuine etcd, kube-apiserver and kube-controller-manager")
    print("   starting them on loopback ...", flush=True)
    took = control_plane()
    version = json.loads(kubectl("version", "--output=json", show=False))["serverVersion"]["gitVersion"]
    print(f"   Kubernetes {version}, ready in {took:.1f} s (no scheduler, no kubelet: pods stay Pending)")
    print("   users: admin (system:masters), alice (group approvers)")

    step("Install the Helm chart (its Service points the API server's webhook calls at this host)")
    grpc, webhooks, metrics = free_port(), free_port(), free_port()
    helm("install", "aip", "charts/aip", "--namespace", "aip-system", "--create-namespace",
         "--set", "service.externalName=localhost", "--set", f"service.webhookPort={webhooks}",
         until=("NOTES:", "helm get notes aip -n aip-system"))

    step("Run the operator as the chart's ServiceAccount, under the chart's RBAC")
    manifest = yaml_docs(helm("get", "manifest", "aip", "--namespace", "aip-system", show=False))
    deployment = next(d for d in manifest if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    token = kubectl("create", "token", "aip-operator", "-n", "aip-system", "--duration=2h", show=False).strip()
    operator_kubeconfig = token_kubeconfig("operator", token)
    start("operator", [f"{BIN}/aip-operator", *args, f"--grpc-listen=127.0.0.1:{grpc}",
                       f"--webhook-listen=127.0.0.1:{webhooks}", f"--admin-listen=127.0.0.1:{metrics}"],
          env={"KUBECONFIG": operator_kubeconfig, "POD_NAMESPACE": "aip-system", "POD_NAME": "aip-operator-0"})
    wait_for("the operator", lambda: urllib.request.urlopen(f"http://127.0.0.1:{metrics}/readyz").status == 200)
    print(f"   aip-operator ready: gRPC :{grpc}, webhooks :{webhooks}, metrics :{metrics} "
          f"({len(args)} arguments from the chart's Deployment)")

    step("The platform team: an opted-in namespace, a ToolConnection, a grant, a policy")
    upstream = free_port()
    start("upstream", [f"{BIN}/aip-fault-server", "--config", "examples/cluster/upstream.yaml",
                       "--http", f"127.0.0.1:{upstream}", "--log", os.path.join(work, "upstream-attempts.jsonl")])
    wait_for("the MCP server", lambda: urllib.request.urlopen(f"http://127.0.0.1:{upstream}/healthz"))
    kubectl("apply", "-f", "examples/cluster/namespace.yaml")
    connection = open("examples/cluster/toolconnection.yaml").read().replace(
        "http://files.tools.svc.cluster.local:8080/mcp", f"http://127.0.0.1:{upstream}/mcp")
    kubectl("apply", "-f", "-", stdin=connection)
    kubectl("aip", "grant", "fs", "-n", "agents")
    kubectl("apply", "-f", "examples/cluster/agentpolicy.yaml")
    kubectl("apply", "-f", "examples/cluster/approvers.yaml")

    step("An agent pod: the API server calls the injector, which adds the gateway")
    kubectl("apply", "-f", "examples/cluster/agent-pod.yaml")
    pod = json.loads(kubectl("get", "pod", "agent-1", "-n", "agents", "-o", "json", show=False))
    sidecar = pod["spec"]["initContainers"][0]
    names = ", ".join(c["name"] for c in pod["spec"]["initContainers"])
    print(f"   initContainers: {names} (restartPolicy: {sidecar['restartPolicy']}: a native sidecar)")
    env = ", ".join(f"{e['name']}={e.get('value', '')}" for e in pod["spec"]["containers"][0].get("env", []))
    print(f"   the agent container's environment: {env}")

    step("Play the kubelet: start the injected sidecar with a token bound to the pod")
    token = kubectl("create", "token", "agent", "-n", "agents", "--audience=aip.io/sidecar", "--duration=1h",
                    "--bound-object-kind=Pod", "--bound-object-name=agent-1",
                    f"--bound-object-uid={pod['metadata']['uid']}", show=False).strip()
    token_file = os.path.join(work, "sidecar-token")
    open(token_file, "w").write(token)
    # Every listener on loopback here: the kubelet would probe the pod's IP.
    listen, admin, probes = free_port(), free_port(), free_port()
    rewrite = {"--listen": f"127.0.0.1:{listen}", "--admin": f"127.0.0.1:{admin}",
               "--metrics-listen": f"127.0.0.1:{probes}",
               "--operator": f"https://127.0.0.1:{grpc}", "--token-file": token_file}
    argv = list(sidecar["args"])
    for i, a in enumerate(argv[:-1]):
        if a in rewrite:
            argv[i + 1] = rewrite[a]
    # The operator's certificate names its Service; the sidecar dials loopback.
    argv += ["--operator-server-name", "aip-operator.aip-system.svc"]
    env = {e["name"]: e["value"] for e in sidecar.get("env", [])}
    start("sidecar", [f"{BIN}/aip-sidecar", *argv], env=env)
    wait_for("the sidecar's startup probe (/readyz)",
             lambda: urllib.request.urlopen(f"http://127.0.0.1:{probes}/readyz").status == 200)
    kubectl("wait", "-n", "agents", "agentpolicy/files", "--for=jsonpath={.status.synced}=1/1", "--timeout=30s")
    kubectl("wait", "-n", "agents", "toolconnection/fs", "--for=jsonpath={.status.health.state}=Healthy", "--timeout=30s")

    asyncio.run(agent(f"http://127.0.0.1:{listen}/mcp"))

    step("What the cluster says")
    kubectl("get", "aip", "-n", "agents")
    events()
    attempts = sum(1 for _ in open(os.path.join(work, "upstream-attempts.jsonl")))
    print(f"\n   The file service saw {attempts} tool calls: the blocked one never left the pod.")
    print(f"   All of it against Kubernetes {version}.")


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in reversed(procs):
            # The control plane stops (and reaps etcd and the rest) on Ctrl-C.
            p.send_signal(signal.SIGINT if p.args[0].endswith("control_plane") else signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
