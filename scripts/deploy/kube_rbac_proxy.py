#!/usr/bin/env python3
"""The kube-rbac-proxy overlay: the agent listens on the Pod's loopback only, the proxy serves
9477 with TLS and authorization (probes excepted), its RBAC is exactly what it needs, and the
ServiceMonitor scrapes over HTTPS with a token.

    scripts/deploy/kube_rbac_proxy.py [CORE_YAML CRS_YAML]   (default: builds the overlay)
"""
from deploycheck import arg, core, custom_resources, daemonset
from deploycheck import check as _check


def check(cond, what):
    _check(cond, f"kube-rbac-proxy: {what}")


OVERLAY = "deploy/overlays/kube-rbac-proxy"
docs = core(arg(1), OVERLAY)
crs = {d["kind"]: d for d in custom_resources(arg(2), OVERLAY)}
ds = daemonset(docs)
containers = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
check(set(containers) == {"shmlink", "kube-rbac-proxy"}, f"containers {sorted(containers)}")
agent, proxy = containers["shmlink"], containers["kube-rbac-proxy"]
listen = {e["name"]: e.get("value") for e in agent["env"]}["SHMLINK_LISTEN"]
check(listen.startswith("127.0.0.1:"), f"the agent listens on {listen}, not only on the Pod's loopback")
check(not agent.get("ports"), "the agent still declares a port")
args = proxy["args"]
check(f"--upstream=http://{listen}/" in args, f"the proxy's upstream is not the agent's {listen}: {args}")
check("--secure-listen-address=0.0.0.0:9477" in args, f"the proxy does not serve 9477: {args}")
check([(p["name"], p["containerPort"]) for p in proxy["ports"]] == [("metrics", 9477)], "the proxy's port")
for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
    get = agent[probe]["httpGet"]
    check(get["port"] == 9477 and get["scheme"] == "HTTPS" and get["path"] == path, f"{probe} {get}")
    check(any(a.startswith("--ignore-paths=") and path in a for a in args), f"{path} needs a token through the proxy")
sc = proxy["securityContext"]
check(sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"], f"proxy securityContext {sc}")
check(set(agent["securityContext"]["capabilities"].get("add", [])) <= {"SYS_PTRACE", "DAC_READ_SEARCH", "PERFMON"}, "agent capabilities")
roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
rules = sorted((r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in roles["shmlink-kube-rbac-proxy"]["rules"])
check(rules == [("authentication.k8s.io", "tokenreviews", ("create",)), ("authorization.k8s.io", "subjectaccessreviews", ("create",))], f"proxy rules {rules}")
check(roles["shmlink-metrics-reader"]["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}], "metrics-reader")
# The stored failures hold what the Pods' logs said: behind the proxy like /metrics, never let
# through without a token, readable only with a role of their own.
check(roles["shmlink-failures-reader"]["rules"] == [{"nonResourceURLs": ["/api/v1/failures"], "verbs": ["get"]}], "failures-reader")
for a in args:
    if a.startswith(("--ignore-paths=", "--allow-paths=")):
        check("/api" not in a and "*" not in a, f"/api/v1/failures passes the proxy unchecked: {a}")
binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == "shmlink-kube-rbac-proxy")
check(binding["subjects"] == [{"kind": "ServiceAccount", "name": "shmlink", "namespace": "shmlink"}], "binding")
(ep,) = crs["ServiceMonitor"]["spec"]["endpoints"]
check(ep["scheme"] == "https" and ep["bearerTokenFile"].endswith("/serviceaccount/token") and ep["port"] == "metrics", f"ServiceMonitor endpoint {ep}")
check(any(d["kind"] == "NetworkPolicy" for d in docs), "the NetworkPolicy is kept")
print("   ok")
