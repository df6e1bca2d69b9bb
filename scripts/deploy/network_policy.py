#!/usr/bin/env python3
"""The base NetworkPolicy admits only the scraper's selectors (a namespace AND pod labels, neither
empty), on the agent's port 9477.

    scripts/deploy/network_policy.py [BASE_CORE_YAML]     (default: builds deploy/base)
"""
from deploycheck import arg, core
from deploycheck import check as _check


def check(cond, what):
    _check(cond, f"NetworkPolicy: {what}")


docs = {(d["kind"], d["metadata"]["name"]): d for d in core(arg(1), "deploy/base")}
check(("NetworkPolicy", "shmlink") in docs, "no NetworkPolicy shmlink in the base")
np = docs["NetworkPolicy", "shmlink"]["spec"]
ds = docs["DaemonSet", "shmlink"]
check(np["podSelector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items(), "it does not select the agents")
check(np["policyTypes"] == ["Ingress"], f"policyTypes {np['policyTypes']}")
(rule,) = np["ingress"]
(peer,) = rule["from"]
# Both selectors in one peer (namespace AND labels); neither may be empty (an empty selector is everything).
check(set(peer) == {"namespaceSelector", "podSelector"}, f"the peer is {peer}")
for sel in peer.values():
    check(sel.get("matchLabels") or sel.get("matchExpressions"), f"an empty selector admits everything: {peer}")
check(rule["ports"] == [{"port": 9477, "protocol": "TCP"}], f"ports {rule['ports']}")
(c,) = ds["spec"]["template"]["spec"]["containers"]
check([p["containerPort"] for p in c["ports"]] == [9477], "the agent's port is not the one admitted")
print(f"   ok: {peer}")
