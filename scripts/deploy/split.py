#!/usr/bin/env python3
"""Splits one `kubectl kustomize` output into PREFIX.core.yaml (what Kubernetes' schema knows)
and PREFIX.crs.yaml (the Prometheus Operator's custom resources), and names what is in each.
scripts/deploy/kustomize.sh runs it.

    scripts/deploy/split.py BUILT.yaml PREFIX
"""
import sys

import yaml

from deploycheck import is_custom_resource, load

docs = load(sys.argv[1])
core = [d for d in docs if not is_custom_resource(d)]
crs = [d for d in docs if is_custom_resource(d)]
yaml.safe_dump_all(core, open(sys.argv[2] + ".core.yaml", "w"), sort_keys=False)
yaml.safe_dump_all(crs, open(sys.argv[2] + ".crs.yaml", "w"), sort_keys=False)
print(f"   {len(core)} core objects: " + ", ".join(d["kind"] for d in core))
if crs:
    print(f"   {len(crs)} custom resources: " + ", ".join(d["kind"] for d in crs))
