#!/usr/bin/env python3
"""Splits one `kubectl kustomize` output into PREFIX.core.yaml (what Kubernetes' schema knows),
PREFIX.crs.yaml (the Prometheus Operator's custom resources) and PREFIX.cert-manager.yaml
(cert-manager's), and names what is in each.
scripts/deploy/kustomize.sh runs it.

    scripts/deploy/split.py BUILT.yaml PREFIX
"""
import sys

import yaml

from deploycheck import is_cert_manager, is_core, is_custom_resource, load

docs = load(sys.argv[1])
core = [d for d in docs if is_core(d)]
crs = [d for d in docs if is_custom_resource(d)]
cert_manager = [d for d in docs if is_cert_manager(d)]
yaml.safe_dump_all(core, open(sys.argv[2] + ".core.yaml", "w"), sort_keys=False)
yaml.safe_dump_all(crs, open(sys.argv[2] + ".crs.yaml", "w"), sort_keys=False)
yaml.safe_dump_all(cert_manager, open(sys.argv[2] + ".cert-manager.yaml", "w"), sort_keys=False)
print(f"   {len(core)} core objects: " + ", ".join(d["kind"] for d in core))
if crs:
    print(f"   {len(crs)} custom resources: " + ", ".join(d["kind"] for d in crs))
if cert_manager:
    print(f"   {len(cert_manager)} cert-manager objects: " + ", ".join(d["kind"] for d in cert_manager))
