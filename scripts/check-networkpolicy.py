"""Checks the chart's rendered NetworkPolicy against the rest of the render
(scripts/lint-chart.sh runs it on each variant): kubernetes-validate says
it is a valid object; this says it admits whom the chart means.

- The gRPC port admits exactly the selectors the injection webhooks use,
  so a change to one without the other fails here instead of leaving
  sidecars cut off from the operator.
- The webhook port admits every source (the API server's cannot be named).
- Every port it names is a named port of the operator's container: a
  NetworkPolicy port that resolves to nothing admits nothing, silently.

Usage: check-networkpolicy.py RENDERED.yaml
"""
import sys

import yaml


def fail(message):
    raise SystemExit(f"{sys.argv[1]}: NetworkPolicy: {message}")


def main():
    docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    if not policies:
        print("no NetworkPolicy rendered (networkPolicy.enabled=false)")
        return
    (policy,) = policies
    spec = policy["spec"]
    if spec.get("policyTypes") != ["Ingress"]:
        fail(f"policyTypes is {spec.get('policyTypes')}, expected [Ingress]")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    operator = deployment["spec"]["template"]["spec"]["containers"][0]
    named = {p["name"] for p in operator["ports"]}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selected = spec["podSelector"]["matchLabels"]
    if any(labels.get(k) != v for k, v in selected.items()):
        fail(f"podSelector {selected} does not select the operator's pods ({labels})")

    rules = {}
    for rule in spec["ingress"]:
        for port in rule["ports"]:
            if port["port"] not in named:
                fail(f"port {port['port']!r} is not a port of the operator's container ({sorted(named)})")
            rules[port["port"]] = rule
    if set(rules) != {"grpc", "webhooks", "metrics"}:
        fail(f"rules for {sorted(rules)}, expected grpc, webhooks and metrics")
    if "from" in rules["webhooks"]:
        fail("the webhook port must admit every source: the API server's address cannot be selected")

    peers = rules["grpc"].get("from", [])
    mutating = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    hooks = {w["name"]: w for d in mutating for w in d["webhooks"]}
    if "namespaces.inject.aip.io" in hooks:
        by_namespace = {"namespaceSelector": {"matchLabels": hooks["namespaces.inject.aip.io"]["namespaceSelector"]["matchLabels"]}}
        by_pod = {"namespaceSelector": {}, "podSelector": {"matchLabels": hooks["pods.inject.aip.io"]["objectSelector"]["matchLabels"]}}
        for want in (by_namespace, by_pod):
            if want not in peers:
                fail(f"the gRPC port does not admit {want}, whom the injection webhook gives a sidecar; it admits {peers}")
    if not peers:
        fail("the gRPC port admits every source")
    if not rules["metrics"].get("from"):
        fail("the metrics port admits every source")
    print(f"NetworkPolicy: gRPC from {len(peers)} peer(s) matching the injection webhooks, "
          f"webhooks from anywhere, metrics from {len(rules['metrics']['from'])} peer(s)")


if __name__ == "__main__":
    main()
