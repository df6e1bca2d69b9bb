#!/usr/bin/env python3
"""The grafana-dashboard overlay: one ConfigMap, labelled for Grafana's sidecar, holding every
dashboards/*.json unchanged.

    scripts/deploy/grafana_dashboard.py [OVERLAY_CORE_YAML]  (default: builds the overlay)
"""
import glob
import json
import os

from deploycheck import arg, core
from deploycheck import check as _check


def check(cond, what):
    _check(cond, f"grafana-dashboard: {what}")


cms = [d for d in core(arg(1), "deploy/overlays/grafana-dashboard") if d["kind"] == "ConfigMap"]
(cm,) = cms
check(cm["metadata"]["labels"].get("grafana_dashboard") == "1", "label grafana_dashboard: \"1\"")
check(cm["metadata"].get("namespace"), "namespace")
for path in glob.glob("dashboards/*.json"):
    key = os.path.basename(path)
    check(key in cm["data"], f"{key} is not in the ConfigMap")
    check(json.loads(cm["data"][key]) == json.load(open(path)), f"{key} differs from {path}")
print(f"   ok: ConfigMap {cm['metadata']['namespace']}/{cm['metadata']['name']} with {sorted(cm['data'])}")
