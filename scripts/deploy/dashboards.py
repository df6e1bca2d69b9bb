#!/usr/bin/env python3
"""dashboards/*.json are Grafana JSON: the template variables (datasource, cluster, job, node,
namespace), no panel repeated per node, every selector narrowed by cluster and job, unique ids.

    scripts/deploy/dashboards.py
"""
import glob
import json
import re
import sys

import deploycheck  # noqa: F401  (it moves to the repository's root)

paths = glob.glob("dashboards/*.json")
if not paths:
    sys.exit("FAIL: no dashboards/*.json")
for path in paths:
    d = json.load(open(path))
    names = {v["name"] for v in d["templating"]["list"]}
    # cluster and job: one Grafana over many Prometheus (kubernetes-mixin's convention).
    if not {"datasource", "cluster", "job", "node", "namespace"} <= names:
        sys.exit(f"FAIL: {path}: template variables {sorted(names)}")
    panels = [p for p in d["panels"] if p["type"] != "row"]
    for p in panels:
        # A panel repeated per node is a panel per node: 1,000 of them on a big cluster.
        if p.get("repeat"):
            sys.exit(f"FAIL: {path}: panel {p['title']} repeats per {p['repeat']}")
        for t in p.get("targets", []):
            if not t.get("expr"):
                sys.exit(f"FAIL: {path}: panel {p['title']} has a target without expr")
            # Every selector of a series narrows by cluster and job.
            for sel in re.findall(r"([a-z_:]+)\{([^}]*)\}", t["expr"]):
                if 'cluster=~"$cluster"' not in sel[1] or 'job=~"$job"' not in sel[1]:
                    sys.exit(f"FAIL: {path}: panel {p['title']}: {sel[0]}{{{sel[1]}}} lacks the cluster or job variable")
    ids = [p["id"] for p in d["panels"]]
    if len(ids) != len(set(ids)):
        sys.exit(f"FAIL: {path}: duplicate panel ids")
    print(f"   {path}: {len(panels)} panels")
