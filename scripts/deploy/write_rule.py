#!/usr/bin/env python3
"""Writes deploy/overlays/prometheus-operator/prometheusrule.yaml from the plain rules
(deploy/prometheus/shmlink.rules.yml): the PrometheusRule carries exactly their groups.

    scripts/deploy/write_rule.py     (or scripts/test-deploy.sh --write-rule, then every check)
"""
import os
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RULE = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else None
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
RULE = RULE or "deploy/overlays/prometheus-operator/prometheusrule.yaml"
from deploycheck import RUNBOOK_BASE, RUNBOOK_PLACEHOLDER  # noqa: E402  (it moves to the root too)

groups = yaml.safe_load(open("deploy/prometheus/shmlink.rules.yml"))["groups"]
# The runbooks' base becomes the placeholder the overlay's kustomize replacement fills.
for g in groups:
    for r in g["rules"]:
        url = r.get("annotations", {}).get("runbook_url")
        if url:
            assert url.startswith(RUNBOOK_BASE + "/"), f"{r['alert']}: runbook_url {url} is not under {RUNBOOK_BASE}"
            r["annotations"]["runbook_url"] = RUNBOOK_PLACEHOLDER + url[len(RUNBOOK_BASE):]
doc = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PrometheusRule",
    "metadata": {"name": "shmlink", "labels": {"app.kubernetes.io/name": "shmlink",
                                               "app.kubernetes.io/part-of": "shmlink"}},
    "spec": {"groups": groups},
}


class Dumper(yaml.SafeDumper):
    pass


def text(dumper, s):
    style = "|" if "\n" in s else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


Dumper.add_representer(str, text)
with open(RULE, "w") as f:
    f.write("# Generated from deploy/prometheus/shmlink.rules.yml by scripts/test-deploy.sh --write-rule;\n"
            "# edit that file, not this one. RUNBOOK_BASE_URL is filled by the kustomization's replacements\n"
            "# from runbook-base-url.yaml.\n")
    yaml.dump(doc, f, Dumper=Dumper, sort_keys=False, width=100)
print(f"wrote {os.path.relpath(RULE)}")
