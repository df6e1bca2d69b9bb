#!/usr/bin/env python3
"""The custom resources of a build (ServiceMonitor, PrometheusRule) use only fields the Prometheus
Operator's CRDs (monitoring.coreos.com/v1) define and what shmlink needs of them; the
PrometheusRule carries exactly the groups of deploy/prometheus/shmlink.rules.yml. With
RULE_GROUPS_OUT it writes those groups there, for `promtool check rules`.

    scripts/deploy/custom_resources.py DIR [CRS_YAML CORE_YAML [RULE_GROUPS_OUT]]
    e.g. scripts/deploy/custom_resources.py deploy/overlays/prometheus-operator
"""
import sys

import yaml

from deploycheck import RUNBOOK_BASE, arg, check, core, custom_resources, runbook_base_value

directory = sys.argv[1]
ADMISSION = "shmlink-admission"
all_crs = custom_resources(arg(2), directory)
# The admission webhook's ServiceMonitor (deploy/components/admission/servicemonitor) is checked
# on its own, below; the rest concerns the agent's.
admission_sms = [d for d in all_crs if d["kind"] == "ServiceMonitor" and d["metadata"]["name"].endswith(ADMISSION)]
crs = {d["kind"]: d for d in all_crs if d not in admission_sms}
core_docs = core(arg(3), directory)
check(set(crs) == {"ServiceMonitor", "PrometheusRule"}, f"custom resources {sorted(crs)}")
for d in crs.values():
    check(d["apiVersion"] == "monitoring.coreos.com/v1", f"{d['kind']} apiVersion")
    check(d["metadata"].get("name") and d["metadata"].get("namespace") == "shmlink", f"{d['kind']} metadata")
    check(set(d) <= {"apiVersion", "kind", "metadata", "spec"}, f"{d['kind']} top-level fields")
sm = crs["ServiceMonitor"]["spec"]
check(set(sm) <= {"jobLabel", "selector", "namespaceSelector", "endpoints", "targetLabels", "podTargetLabels"}, f"ServiceMonitor spec fields {sorted(sm)}")
check(isinstance(sm["selector"].get("matchLabels"), dict), "ServiceMonitor spec.selector (required)")
check(sm["endpoints"], "ServiceMonitor endpoints")
svc = next(d for d in core_docs if d["kind"] == "Service" and not d["metadata"]["name"].endswith(ADMISSION))
check(sm["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items(), "ServiceMonitor selects the Service")
check(sm["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]], "ServiceMonitor namespaceSelector")
check(sm["jobLabel"] in svc["metadata"]["labels"], "jobLabel is a label of the Service")
ports = {p["name"] for p in svc["spec"]["ports"]}
for ep in sm["endpoints"]:
    check(ep["port"] in ports, f"endpoint port {ep['port']} is a port of the Service")
    check(ep.get("honorLabels") is True, "honorLabels: the workload's namespace/pod/container labels")
    check(set(ep) <= {"port", "path", "interval", "scrapeTimeout", "honorLabels", "relabelings", "metricRelabelings", "scheme", "bearerTokenFile", "tlsConfig"}, f"endpoint fields {sorted(ep)}")
    for r in ep.get("relabelings", []):
        check(set(r) <= {"sourceLabels", "targetLabel", "regex", "replacement", "action", "separator", "modulus"}, f"relabeling fields {sorted(r)}")
pr = crs["PrometheusRule"]["spec"]
check(set(pr) == {"groups"}, "PrometheusRule spec has groups only")
for g in pr["groups"]:
    check(set(g) <= {"name", "interval", "rules", "partial_response_strategy", "limit"} and g.get("name"), f"group fields {sorted(g)}")
    for r in g["rules"]:
        check(set(r) <= {"alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for"}, f"rule fields {sorted(r)}")
        check(("alert" in r) != ("record" in r) and r.get("expr"), f"rule {r}")
plain = yaml.safe_load(open("deploy/prometheus/shmlink.rules.yml"))["groups"]
# Each runbook_url is the operator's base (runbook-base-url.yaml) and the plain rule's page.
base = runbook_base_value()
for g in plain:
    for r in g["rules"]:
        if "runbook_url" in r.get("annotations", {}):
            r["annotations"]["runbook_url"] = base + r["annotations"]["runbook_url"][len(RUNBOOK_BASE):]
check(pr["groups"] == plain, "the PrometheusRule's groups differ from deploy/prometheus/shmlink.rules.yml: run scripts/test-deploy.sh --write-rule")
for asm in admission_sms:
    asvc = next(d for d in core_docs if d["kind"] == "Service" and d["metadata"]["name"].endswith(ADMISSION))
    spec = asm["spec"]
    check(spec["selector"]["matchLabels"].items() <= asvc["metadata"]["labels"].items(), "the admission ServiceMonitor selects its Service")
    check(spec["namespaceSelector"]["matchNames"] == [asvc["metadata"]["namespace"]], "admission ServiceMonitor namespaceSelector")
    # The job is the label's value, which the ShmlinkAdmission* alerts select (job=~".*shmlink-admission.*").
    check(ADMISSION in asvc["metadata"]["labels"][spec["jobLabel"]], "admission ServiceMonitor jobLabel")
    check([ep["port"] for ep in spec["endpoints"]] == ["metrics"]
          and "metrics" in {p["name"] for p in asvc["spec"]["ports"]}, "admission ServiceMonitor scrapes the metrics port")
if arg(4):
    yaml.safe_dump({"groups": pr["groups"]}, open(arg(4), "w"), sort_keys=False)
print(f"   ok ({len(pr['groups'])} groups, the same as the plain rules)"
      + (f"; the admission ServiceMonitor scrapes its Service's metrics port" if admission_sms else ""))
