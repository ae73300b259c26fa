"""`make demo-cluster`: the whole system on one machine, no real cluster.

The fake API server stands in for Kubernetes; the Helm chart's rendered
manifests are applied with kubectl; the operator runs as the chart's
service account under the chart's RBAC; this script plays the kubelet for one
agent pod (it starts the sidecar the injector put in the pod, with the pod's
own minted token) and an agent (the unmodified Python MCP SDK). Then: a
policy, a blocked call, an ask approved with `kubectl patch
--subresource=status`, and the ToolConnection's health in `kubectl get`.

Run from the repository root with the project's Python (target/pyenv).
"""
import asyncio
import base64
import json
import os
import shutil
import signal
import socket
import ssl
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
USERS = 'alice-token,alice,u-alice,"approvers"\n'

work = tempfile.mkdtemp(prefix="aip-demo-cluster-")
procs = []


def step(title):
    print(f"\n{BOLD}== {title}{END}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name, argv, env=None):
    log = open(os.path.join(work, f"{name}.log"), "w")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
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


def kubectl(*args, user="admin", stdin=None, show=True, check=True):
    """Runs kubectl as `user`, echoing the command as a person would type it."""
    if show:
        shown = " ".join(a if " " not in a and "{" not in a else f"'{a}'" for a in args)
        who = "" if user == "admin" else f"{DIM}(as {user}){END} "
        print(f"   {who}$ kubectl {shown}", flush=True)
    env = {**os.environ, "KUBECONFIG": os.path.join(work, "cluster", f"{user}.kubeconfig"),
           "PATH": f"{os.path.abspath(BIN)}:{TOOLS}:{os.environ['PATH']}"}
    out = subprocess.run([f"{TOOLS}/kubectl", *args], input=stdin, capture_output=True, text=True, env=env)
    if check and out.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)} failed:\n{out.stderr}")
    if show:
        for line in (out.stdout + out.stderr).rstrip().splitlines():
            print(f"     {line}")
    return out.stdout


def api(path, body):
    """POSTs to the API server as the administrator (token requests)."""
    config = open(os.path.join(work, "cluster", "admin.kubeconfig")).read()
    server = next(l.split("server:")[1].strip() for l in config.splitlines() if "server:" in l)
    token = next(l.split("token:")[1].strip() for l in config.splitlines() if "token:" in l)
    context = ssl.create_default_context(cafile=os.path.join(work, "cluster", "ca.crt"))
    request = urllib.request.Request(server + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
    return json.load(urllib.request.urlopen(request, context=context)), server


def token_for(namespace, account, body):
    minted, server = api(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", body)
    return minted["status"]["token"], server


def chart_manifests(webhook_port):
    """The chart rendered, each webhook's Service reference turned into a
    loopback URL (there is no cluster network here)."""
    out = subprocess.run([f"{TOOLS}/helm", "template", "aip", "charts/aip", "--namespace", "aip-system",
                          "--include-crds"],
                         capture_output=True, text=True, check=True).stdout
    docs = []
    for doc in out.split("\n---"):
        obj = yaml_load(doc)
        if not obj:
            continue
        for hook in obj.get("webhooks", []):
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://localhost:{webhook_port}{path}"}
        docs.append(obj)
    return docs


def yaml_load(text):
    # PyYAML arrives with kubernetes-validate in the project's virtualenv.
    import yaml
    return yaml.safe_load(text)


async def call(session, name, arguments):
    try:
        result = await session.call_tool(name, arguments)
        text = " ".join(c.text for c in result.content if getattr(c, "text", None))
        return f"result: {text}"
    except Exception as exc:
        error = getattr(exc, "error", None)
        return f"error {error.code}: {error.message}" if error else f"error: {exc}"


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


def pending_request():
    for _ in range(300):
        names = kubectl("get", "approvalrequests", "-n", "agents", "-o",
                        'jsonpath={.items[?(@.status.decision=="Pending")].metadata.name}', show=False).split()
        if names:
            return names[0]
        time.sleep(0.1)
    raise SystemExit("no ApprovalRequest appeared")


def main():
    step("A Kubernetes API server (aip-fake-apiserver: real protocol, in memory)")
    users = os.path.join(work, "users.csv")
    open(users, "w").write(USERS)
    start("apiserver", [f"{BIN}/aip-fake-apiserver", "--token-file", users, "--out-dir", os.path.join(work, "cluster")])
    wait_for("the API server", lambda: os.path.exists(os.path.join(work, "cluster", "alice.kubeconfig")))
    kubectl("version", "--output=yaml", show=False)
    print("   users: admin (system:masters), alice (group approvers)")

    step("Install the Helm chart's manifests with kubectl")
    grpc, webhooks, metrics = free_port(), free_port(), free_port()
    docs = chart_manifests(webhooks)
    kubectl("apply", "-f", "-", show=False,
            stdin='{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"aip-system"}}')
    kubectl("apply", "-f", "-", stdin="\n".join(json.dumps(d) for d in docs))

    step("Run the operator as the chart's ServiceAccount, under the chart's RBAC")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    token, server = token_for("aip-system", "aip-operator", {"spec": {"expirationSeconds": 7200}})
    config = open(os.path.join(work, "cluster", "admin.kubeconfig")).read()
    admin_token = next(l.split("token:")[1].strip() for l in config.splitlines() if "token:" in l)
    operator_kubeconfig = os.path.join(work, "operator.kubeconfig")
    open(operator_kubeconfig, "w").write(config.replace(admin_token, token))
    start("operator", [f"{BIN}/aip-operator", *args, f"--grpc-listen=127.0.0.1:{grpc}",
                       f"--webhook-listen=127.0.0.1:{webhooks}", f"--admin-listen=127.0.0.1:{metrics}",
                       "--namespace=aip-system", "--pod-name=aip-operator-0", "--tls-extra-names=localhost"],
          env={"KUBECONFIG": operator_kubeconfig})
    wait_for("the operator", lambda: urllib.request.urlopen(f"http://127.0.0.1:{metrics}/readyz").status == 200)
    print(f"   aip-operator ready: gRPC :{grpc}, webhooks :{webhooks}, metrics :{metrics} "
          f"({len(args)} arguments from the chart's Deployment)")

    step("The platform team: an opted-in namespace, a ToolConnection, a grant, a policy")
    upstream = free_port()
    start("upstream", [f"{BIN}/aip-fault-server", "--config", "examples/cluster/upstream.yaml",
                       "--http", f"127.0.0.1:{upstream}", "--log", os.path.join(work, "upstream-attempts.jsonl")])
    wait_for("the MCP server", lambda: urllib.request.urlopen(f"http://127.0.0.1:{upstream}/healthz"))
    kubectl("apply", "-f", "examples/cluster/namespace.yaml")
    connection = open("examples/cluster/toolconnection.yaml").read().replace("UPSTREAM_URL", f"http://127.0.0.1:{upstream}/mcp")
    kubectl("apply", "-f", "-", stdin=connection)
    kubectl("aip", "grant", "fs", "-n", "agents")
    kubectl("apply", "-f", "examples/cluster/agentpolicy.yaml")
    kubectl("apply", "-f", "examples/cluster/approvers.yaml")

    step("An agent pod: the injector adds the gateway")
    kubectl("apply", "-f", "examples/cluster/agent-pod.yaml")
    pod = json.loads(kubectl("get", "pod", "agent-1", "-n", "agents", "-o", "json", show=False))
    sidecar = pod["spec"]["initContainers"][0]
    print(f"   initContainers: {[c['name'] for c in pod['spec']['initContainers']]} (restartPolicy: {sidecar['restartPolicy']})")
    print(f"   agent env: {pod['spec']['containers'][0]['env']}")

    step("Play the kubelet: start the injected sidecar with the pod's own token")
    token, _ = token_for("agents", "agent", {"spec": {
        "audiences": ["aip.io/sidecar"], "expirationSeconds": 3600,
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "agent-1", "uid": pod["metadata"]["uid"]}}})
    token_file = os.path.join(work, "sidecar-token")
    open(token_file, "w").write(token)
    listen, admin = free_port(), free_port()
    rewrite = {"--listen": f"127.0.0.1:{listen}", "--admin": f"127.0.0.1:{admin}",
               "--operator": f"https://127.0.0.1:{grpc}", "--token-file": token_file}
    argv = list(sidecar["args"])
    for i, a in enumerate(argv[:-1]):
        if a in rewrite:
            argv[i + 1] = rewrite[a]
    argv += ["--operator-server-name", "localhost"]
    env = {e["name"]: e["value"] for e in sidecar.get("env", [])}
    start("sidecar", [f"{BIN}/aip-sidecar", *argv], env=env)
    wait_for("the sidecar's startup probe (/readyz)",
             lambda: urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz").status == 200)
    kubectl("wait", "-n", "agents", "agentpolicy/files", "--for=jsonpath={.status.synced}=1/1", "--timeout=30s")
    kubectl("wait", "-n", "agents", "toolconnection/fs", "--for=jsonpath={.status.health.state}=Healthy", "--timeout=30s")

    asyncio.run(agent(f"http://127.0.0.1:{listen}/mcp"))

    step("What the cluster says")
    kubectl("get", "aip", "-n", "agents")
    kubectl("get", "events.events.k8s.io", "-n", "agents", "-o",
            'jsonpath={range .items[*]}{.reason}{"\\t"}{.regarding.kind}/{.regarding.name}{"\\t"}{.note}{"\\n"}{end}')
    attempts = sum(1 for _ in open(os.path.join(work, "upstream-attempts.jsonl")))
    print(f"\n   The file service saw {attempts} tool calls: the blocked one never left the pod.")


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
