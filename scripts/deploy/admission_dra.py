#!/usr/bin/env python3
"""The admission-dra component (deploy/components/admission-dra, used by
deploy/overlays/admission-dra) gives the webhook exactly what its DRA lookup reads: a
ServiceAccount bound to get (nothing else) on resourceclaimtemplates, resourceclaims and
deviceclasses of resource.k8s.io, and the Deployment that mounts its token; everything else of
the admission overlay is unchanged.

    scripts/deploy/admission_dra.py [OVERLAY_CORE_YAML [ADMISSION_CORE_YAML]]
"""
from deploycheck import arg, check, core

NAME = "shmlink-admission"
RULES = [{"apiGroups": ["resource.k8s.io"],
          "resources": ["resourceclaimtemplates", "resourceclaims", "deviceclasses"], "verbs": ["get"]}]

dra = core(arg(1), "deploy/overlays/admission-dra")
plain = core(arg(2), "deploy/overlays/admission")
by = {(d["kind"], d["metadata"]["name"]): d for d in dra}
role = by[("ClusterRole", "shmlink-admission-dra")]
check(role["rules"] == RULES, f"the DRA lookup's ClusterRole is not get on the three kinds: {role['rules']}")
binding = by[("ClusterRoleBinding", "shmlink-admission-dra")]
check(binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": "shmlink"}],
      f"binding subjects {binding['subjects']}")
check(("ServiceAccount", NAME) in by, "no ServiceAccount for the webhook")
pod = by[("Deployment", NAME)]["spec"]["template"]["spec"]
check(pod.get("automountServiceAccountToken") is True and pod.get("serviceAccountName") == NAME,
      "the webhook does not mount its ServiceAccount's token")
# Nothing else differs from the admission overlay.
before = {(d["kind"], d["metadata"]["name"]): d for d in plain}
added = {("ServiceAccount", NAME), ("ClusterRole", "shmlink-admission-dra"),
         ("ClusterRoleBinding", "shmlink-admission-dra")}
check(set(by) == set(before) | added, f"objects: {sorted(set(by) ^ set(before))}")
for key, d in before.items():
    if key == ("Deployment", NAME):
        continue
    check(by[key] == d, f"{key} changed")
print("   ok: the DRA lookup's ServiceAccount gets only get on resource claims, templates and classes")
