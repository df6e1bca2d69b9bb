#!/usr/bin/env python3
"""The runbooks' base URL is set in one place: with another value in the Prometheus Operator
overlay's runbook-base-url.yaml, every runbook_url of the built PrometheusRule is
`<that value>/<alert>.md`, no placeholder is left, and the ConfigMap itself is not output.

    scripts/deploy/runbook_base.py
"""
import os
import shutil
import subprocess
import tempfile

import yaml

from deploycheck import RUNBOOK_BASE_FILE, RUNBOOK_PLACEHOLDER, check

OTHER = "https://git.example.com/ops/shmlink/src/branch/main/docs/runbooks"
with tempfile.TemporaryDirectory() as tmp:
    for d in ("deploy", "dashboards"):
        shutil.copytree(d, os.path.join(tmp, d))
    path = os.path.join(tmp, RUNBOOK_BASE_FILE)
    doc = yaml.safe_load(open(path))
    doc["data"]["url"] = OTHER
    yaml.safe_dump(doc, open(path, "w"))
    out = subprocess.run(["kubectl", "kustomize", os.path.join(tmp, "deploy/overlays/prometheus-operator")],
                         check=True, capture_output=True, text=True).stdout
docs = [d for d in yaml.safe_load_all(out) if d]
check(not any(d["metadata"]["name"] == "shmlink-runbook-base-url" for d in docs),
      "the runbook base ConfigMap is output (it is local-config)")
check(RUNBOOK_PLACEHOLDER not in out, f"{RUNBOOK_PLACEHOLDER} left in the build")
(rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
for r in alerts:
    url = r["annotations"]["runbook_url"]
    check(url == f"{OTHER}/{r['alert']}.md", f"{r['alert']}: runbook_url {url}, not under {OTHER}")
print(f"   ok ({len(alerts)} runbook_urls follow {RUNBOOK_BASE_FILE})")
