#!/usr/bin/env python3
"""Every alert has a severity and a runbook_url naming docs/runbooks/<alert>.md, which exists,
is titled by the alert, says its severity and has the three sections; the index lists them all.

    scripts/deploy/runbooks.py
"""
import os

import yaml

from deploycheck import RUNBOOK_BASE, check

BASE = RUNBOOK_BASE + "/"
groups = yaml.safe_load(open("deploy/prometheus/shmlink.rules.yml"))["groups"]
alerts = [r for g in groups for r in g["rules"] if "alert" in r]
names = [r["alert"] for r in alerts]
check(len(names) == len(set(names)), f"an alert name twice: {names}")
for r in alerts:
    a = r["alert"]
    check(r.get("labels", {}).get("severity") in ("warning", "critical"), f"{a}: severity")
    url = r.get("annotations", {}).get("runbook_url", "")
    check(url == f"{BASE}{a}.md", f"{a}: runbook_url {url!r} is not {BASE}{a}.md")
    path = os.path.join("docs/runbooks", url[len(BASE):])
    check(os.path.isfile(path), f"{a}: {path} does not exist")
    text = open(path).read()
    check(text.startswith(f"# {a}\n"), f"{path}: its title is not the alert's name")
    check(f"**Severity** {r['labels']['severity']}" in text, f"{path}: does not say severity {r['labels']['severity']}")
    for section in ("## What it means", "## Confirm", "## What to do"):
        check(section in text, f"{path}: no {section!r}")
pages = {f[:-3] for f in os.listdir("docs/runbooks") if f.endswith(".md") and f != "README.md"}
check(pages == set(names), f"runbooks without an alert: {sorted(pages - set(names))}")
index = open("docs/runbooks/README.md").read()
for r in alerts:
    check(f"| `{r['alert']}` | {r['labels']['severity']} | [{r['alert']}.md]({r['alert']}.md) |" in index,
          f"docs/runbooks/README.md does not list {r['alert']} as {r['labels']['severity']}")
print(f"   ok ({len(alerts)} alerts, {sum(r['labels']['severity'] == 'critical' for r in alerts)} critical)")
