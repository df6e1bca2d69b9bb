#!/usr/bin/env python3
"""Copies what the chart serves from files of the repository into charts/shmlink/files/ (Helm
reads only files inside the chart): the plain alert rules (deploy/prometheus/shmlink.rules.yml)
the Grafana dashboards (dashboards/*.json), and the admission webhook's configuration and policy
(deploy/components/admission/webhook.yaml, admission-policy/policy.yaml: their CEL in one
place), byte for byte. With --check it changes nothing
and fails when a copy differs, is missing or is left over (scripts/deploy/helm.py runs that).

    scripts/deploy/helm_files.py [--check]
"""
import glob
import os
import sys

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FILES = "charts/shmlink/files"
wanted = {
    "deploy/prometheus/shmlink.rules.yml": f"{FILES}/shmlink.rules.yml",
    "deploy/components/admission/webhook.yaml": f"{FILES}/admission/webhook.yaml",
    "deploy/components/admission-policy/policy.yaml": f"{FILES}/admission/policy.yaml",
}
for path in sorted(glob.glob("dashboards/*.json")):
    wanted[path] = f"{FILES}/dashboards/{os.path.basename(path)}"
check = sys.argv[1:] == ["--check"]
stale = []
for source, copy in wanted.items():
    data = open(source, "rb").read()
    if os.path.exists(copy) and open(copy, "rb").read() == data:
        continue
    stale.append(copy)
    if not check:
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        open(copy, "wb").write(data)
extra = set(glob.glob(f"{FILES}/dashboards/*")) - set(wanted.values())
for path in sorted(extra):
    stale.append(path)
    if not check:
        os.remove(path)
if check and stale:
    sys.exit(f"FAIL: the chart's copies differ from their sources: {stale}; run scripts/deploy/helm_files.py")
print(f"   {'ok' if check else 'wrote'}: {len(wanted)} files" + ("" if check else f" ({len(stale)} changed)"))
