#!/usr/bin/env python3
"""The admission objects keep the shared design (docs/admission.md) wherever they are rendered:
  - MutatingWebhookConfiguration shmlink-admission: three webhooks default/warn/mutate
    .admission.shmlink.io to /mutate, /mutate/warn, /mutate/mutate by the namespace label
    shmlink.io/admission (default: none of off|warn|mutate, not kube-system), all Ignore,
    sideEffects None, 3 s, v1, reinvocation IfNeeded, Pod CREATE only; its caBundle from
    cert-manager (inject-ca-from naming the Certificate) or given (the Helm value);
  - the Service (443 -> the https port) selects the Deployment's Pods; the PDB keeps one;
  - the NetworkPolicy admits only addresses (the API server's) on 8443 and the scraper on 9479;
  - the Deployment: `admit` with the serving Secret at /tls and --mode; restricted security
    context; HTTPS probes on /healthz; no API token; spread over nodes;
  - the Certificate: the Service's DNS names, ECDSA, rotationPolicy Always, renewBefore well
    inside its duration, its Secret the one the Pods mount;
  - the ValidatingAdmissionPolicy: Pod CREATE, Ignore, a Warn-only binding skipping namespaces
    labelled off.

    scripts/deploy/admission.py CORE_YAML [CERT_MANAGER_YAML] [--mode warn] [--name shmlink-admission --namespace shmlink]
    scripts/deploy/admission.py --policy CORE_YAML
"""
import argparse
import os
import re
import sys

# The arguments as given, and each as a path from where this was started: deploycheck makes every
# argument a path and moves to the repository's root, which this script's options are not.
RAW = sys.argv[1:]
ABSOLUTE = {a: os.path.abspath(a) for a in RAW}
from deploycheck import check, load  # noqa: E402

HOOKS = {
    "default.admission.shmlink.io": ("/mutate", [
        {"key": "shmlink.io/admission", "operator": "NotIn", "values": ["off", "warn", "mutate"]},
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]),
    "warn.admission.shmlink.io": ("/mutate/warn", [{"key": "shmlink.io/admission", "operator": "In", "values": ["warn"]}]),
    "mutate.admission.shmlink.io": ("/mutate/mutate", [{"key": "shmlink.io/admission", "operator": "In", "values": ["mutate"]}]),
}
POD_CREATE = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}


def one(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    check(len(found) == 1, f"{len(found)} {kind} objects")
    return found[0]


def hours(duration):
    m = re.fullmatch(r"(\d+)h", duration)
    check(m, f"duration {duration} (write it in hours)")
    return int(m.group(1))


def webhook(docs, a, certificate):
    mwc = one(docs, "MutatingWebhookConfiguration")
    check(mwc["metadata"]["name"] == a.name, f"webhook configuration name {mwc['metadata']['name']}")
    hooks = {h["name"]: h for h in mwc["webhooks"]}
    check(list(hooks) == list(HOOKS), f"webhooks {list(hooks)}")
    for name, (path, selector) in HOOKS.items():
        h = hooks[name]
        check(h["failurePolicy"] == "Ignore" and h["sideEffects"] == "None" and h["timeoutSeconds"] == 3
              and h["admissionReviewVersions"] == ["v1"] and h["reinvocationPolicy"] == "IfNeeded", f"{name} settings")
        check([{k: v for k, v in r.items() if k != "scope"} for r in h["rules"]] == [POD_CREATE], f"{name} rules {h['rules']}")
        check(h["namespaceSelector"] == {"matchExpressions": selector}, f"{name} namespaceSelector")
        check(h["clientConfig"]["service"] == {"name": a.name, "namespace": a.namespace, "path": path, "port": 443},
              f"{name} service {h['clientConfig']['service']}")
        check({c["name"] for c in h.get("matchConditions", [])} == {"not-opted-out", "uses-gpus-or-sized"}, f"{name} matchConditions")
        if certificate:
            check("caBundle" not in h["clientConfig"], f"{name}: a caBundle next to cert-manager's injection")
        else:
            check(h["clientConfig"].get("caBundle") == a.ca_bundle, f"{name}: caBundle")
    inject = mwc["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from")
    if certificate:
        md = certificate["metadata"]
        check(inject == f"{md['namespace']}/{md['name']}", f"inject-ca-from {inject} is not the Certificate")
    else:
        check(inject is None, "inject-ca-from without cert-manager")


def deployment(docs, a):
    dep = one(docs, "Deployment")
    check(dep["metadata"]["name"] == a.name and dep["metadata"]["namespace"] == a.namespace, "Deployment name")
    check(dep["spec"]["replicas"] == a.replicas, f"replicas {dep['spec']['replicas']}")
    pod = dep["spec"]["template"]["spec"]
    check(pod.get("automountServiceAccountToken") is False, "the webhook needs no API token")
    check(pod["securityContext"]["runAsNonRoot"] is True
          and pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, "Pod securityContext")
    spread = pod["topologySpreadConstraints"][0]
    check(spread["topologyKey"] == "kubernetes.io/hostname"
          and spread["labelSelector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items(), "spread over nodes")
    (c,) = pod["containers"]
    check(c["args"] == ["admit", "--listen", "0.0.0.0:8443", "--tls-cert-file", "/tls/tls.crt",
                        "--tls-key-file", "/tls/tls.key", "--mode", a.mode], f"args {c['args']}")
    sc = c["securityContext"]
    check(sc == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
          f"container securityContext {sc}")
    for probe in ("readinessProbe", "livenessProbe"):
        check(c[probe]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}, f"{probe}")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports == {"https": 8443, "metrics": 9479}, f"ports {ports}")
    check(c["resources"]["requests"] and c["resources"]["limits"]["memory"], "requests and a memory limit")
    check(c["volumeMounts"] == [{"name": "tls", "mountPath": "/tls", "readOnly": True}], "the Secret at /tls")
    secret = next(v for v in pod["volumes"] if v["name"] == "tls")["secret"]["secretName"]
    return dep, secret


def service_and_pdb(docs, dep, a):
    labels = dep["spec"]["template"]["metadata"]["labels"]
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == a.name)
    check(svc["spec"]["selector"].items() <= labels.items(), "the Service selects the webhook's Pods")
    https = next(p for p in svc["spec"]["ports"] if p["name"] == "https")
    check(https["port"] == 443 and https["targetPort"] == "https", f"Service port {https}")
    pdb = one(docs, "PodDisruptionBudget")
    check(pdb["spec"]["minAvailable"] == 1 and pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), "PDB")
    return svc


def network_policy(docs, dep, a):
    """Only the API server, by ipBlock peers alone (no selector a Pod could match), on the
    webhook's port; the scraper (a namespace AND Pod labels, neither empty) on the metrics port."""
    np = next((d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == a.name), None)
    check(np is not None, f"no NetworkPolicy {a.name}")
    spec = np["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    check(spec["podSelector"]["matchLabels"] and spec["podSelector"]["matchLabels"].items() <= labels.items(),
          "the NetworkPolicy does not select the webhook's Pods")
    check(spec["policyTypes"] == ["Ingress"], f"policyTypes {spec['policyTypes']}")
    api, scrape = spec["ingress"]
    check(api["ports"] == [{"port": 8443, "protocol": "TCP"}], f"the API server's ports {api['ports']}")
    check(api["from"] and all(set(peer) == {"ipBlock"} and "except" not in peer["ipBlock"] for peer in api["from"]),
          f"the webhook's port is open to more than addresses: {api['from']}")
    check(all(not peer["ipBlock"]["cidr"].endswith("/0") for peer in api["from"]), "the webhook's port is open to every address")
    (peer,) = scrape["from"]
    check(set(peer) == {"namespaceSelector", "podSelector"}
          and all(sel.get("matchLabels") for sel in peer.values()), f"the metrics port's peer {peer}")
    check(scrape["ports"] == [{"port": 9479, "protocol": "TCP"}], f"the metrics port {scrape['ports']}")
    return [peer["ipBlock"]["cidr"] for peer in api["from"]]


def certificate_of(cm_docs, a, secret):
    cert = one(cm_docs, "Certificate")
    issuer = one(cm_docs, "Issuer")
    spec = cert["spec"]
    check(cert["metadata"]["name"] == a.name + "-tls" and spec["secretName"] == secret, "the Certificate's Secret is the one mounted")
    svc = f"{a.name}.{a.namespace}.svc"
    check(svc in spec["dnsNames"] and all(n.startswith(svc) for n in spec["dnsNames"]), f"dnsNames {spec['dnsNames']}")
    check(spec["privateKey"]["algorithm"] == "ECDSA" and spec["privateKey"]["rotationPolicy"] == "Always", "ECDSA, rotationPolicy Always")
    # Renewed with at least a week left, and the 7-day alert still firing only on a failed renewal.
    check(24 * 7 < hours(spec["renewBefore"]) <= hours(spec["duration"]) // 2, f"renewBefore {spec['renewBefore']}")
    check(spec["issuerRef"] == {"kind": "Issuer", "name": issuer["metadata"]["name"]} and "selfSigned" in issuer["spec"], "issuer")
    return cert


def policy(docs):
    vap = one(docs, "ValidatingAdmissionPolicy")
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    spec = vap["spec"]
    check(spec["failurePolicy"] == "Ignore", "a CEL error never refuses a Pod")
    check(spec["matchConstraints"]["resourceRules"] == [POD_CREATE], "Pod CREATE")
    check(binding["spec"]["policyName"] == vap["metadata"]["name"] and binding["spec"]["validationActions"] == ["Warn"], "binding")
    check(binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
          == [{"key": "shmlink.io/admission", "operator": "NotIn", "values": ["off"]}], "binding skips namespaces labelled off")
    print(f"   the policy: Pod CREATE, Ignore, {len(spec['validations'])} validations, a Warn-only binding")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("core")
    p.add_argument("cert_manager", nargs="?")
    p.add_argument("--policy", action="store_true")
    p.add_argument("--mode", default="warn")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--name", default="shmlink-admission")
    p.add_argument("--namespace", default="shmlink")
    p.add_argument("--ca-bundle")
    a = p.parse_args(RAW)
    a.core = ABSOLUTE[a.core]
    a.cert_manager = a.cert_manager and ABSOLUTE[a.cert_manager]
    docs = load(a.core)
    if a.policy:
        policy(docs)
        return
    dep, secret = deployment(docs, a)
    service_and_pdb(docs, dep, a)
    api_server = network_policy(docs, dep, a)
    cert = certificate_of(load(a.cert_manager), a, secret) if a.cert_manager else None
    webhook(docs, a, cert)
    print(f"   {a.name}: 3 webhooks by namespace label, Ignore/3s; {a.replicas} restricted replicas in --mode {a.mode};"
          + (" cert-manager's ECDSA certificate injected" if cert else " the given caBundle")
          + f"; only {', '.join(api_server)} may call it")


main()
