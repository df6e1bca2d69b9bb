#!/usr/bin/env python3
"""Every alert has a severity and a runbook_url naming docs/runbooks/<alert>.md, which exists,
is titled by the alert, says its severity and has the three sections; the index lists them all.
The few pages for an Event that no alert pages on (EVENTS) are held to the same shape, saying
the Event's type, and listed in the index's own table; any other page without an alert fails.

    scripts/deploy/runbooks.py
"""
import os

import yaml

from deploycheck import RUNBOOK_BASE, check

BASE = RUNBOOK_BASE + "/"
# Event reason -> its type: the agent's own actions an operator must be able to read and undo,
# where the GPU behind them already pages under its own alert.
EVENTS = {"GpuDeviceTainted": "Warning"}
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
check(not set(EVENTS) & set(names), f"an Event page that is an alert too: {sorted(set(EVENTS) & set(names))}")
check(pages == set(names) | set(EVENTS), f"runbooks without an alert: {sorted(pages - set(names) - set(EVENTS))};"
      f" missing: {sorted(set(EVENTS) - pages)}")
index = open("docs/runbooks/README.md").read()
for reason, kind in EVENTS.items():
    text = open(f"docs/runbooks/{reason}.md").read()
    check(text.startswith(f"# {reason}\n") and f"**Event** {kind}" in text, f"{reason}.md: title or **Event** {kind}")
    for section in ("## What it means", "## Confirm", "## What to do"):
        check(section in text, f"{reason}.md: no {section!r}")
    check(f"| `{reason}` | {kind} | [{reason}.md]({reason}.md) |" in index,
          f"docs/runbooks/README.md does not list the Event {reason} as {kind}")
for r in alerts:
    check(f"| `{r['alert']}` | {r['labels']['severity']} | [{r['alert']}.md]({r['alert']}.md) |" in index,
          f"docs/runbooks/README.md does not list {r['alert']} as {r['labels']['severity']}")
print(f"   ok ({len(alerts)} alerts, {sum(r['labels']['severity'] == 'critical' for r in alerts)} critical;"
      f" {len(EVENTS)} Event page(s))")
