#!/usr/bin/env python3
"""The Alertmanager example (deploy/alertmanager/alertmanager.yml) with the real Alertmanager:
`amtool check-config`, its routes (`amtool config routes test`), then a real
`prometheus-alertmanager` on a free loopback port with a temporary storage directory, given the
alerts the rules fire (v2 API) and asked which it inhibits:
  - GPU 7 down on gpu-node-7: GpuLinkDegraded{gpu="7"} active; pairs touching GPU 7 (at the
    peer_gpu end) suppressed by it, pair 1-2 of the same node active; pair 0-7 of another node
    active (inhibition is per node);
  - GPU 0 the culprit on gpu-node-0: its pair 0-3 (at the gpu end) suppressed;
  - pairs 0-1 and 2-3 with no culprit on gpu-node-9: nothing suppressed;
  - every pair failing on gpu-node-10: GpuAllPairsFailing active, the GPU and pair alerts
    there suppressed;
  - NVLink domain A paging (GpuFabricDomainDegraded): its nodes' GPU alerts suppressed, those of
    domain B and of a GPU with no domain active; a chassis paging (GpuChassisDegraded) likewise
    by its serial.
The tools missing: a loud SKIP, which fails under SHMLINK_E2E=require or CI.

    scripts/deploy/alertmanager.py
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from deploycheck import check

CONFIG = "deploy/alertmanager/alertmanager.yml"
missing = [t for t in ("prometheus-alertmanager", "amtool") if not shutil.which(t)]
if missing:
    print("#" * 72 + f"\nSKIP: {' '.join(missing)} not installed: the Alertmanager example was not run\n" + "#" * 72,
          file=sys.stderr)
    sys.exit(1 if os.environ.get("SHMLINK_E2E") == "require" or os.environ.get("CI") else 0)

subprocess.run(["amtool", "check-config", CONFIG], check=True, stdout=subprocess.DEVNULL)


def route(*labels):
    out = subprocess.run(["amtool", "config", "routes", "test", f"--config.file={CONFIG}", *labels],
                         check=True, capture_output=True, text=True).stdout
    return out.strip()


check(route("alertname=GpuLinkDegraded", "severity=critical", "gpu=7") == "shmlink-pager", "a culprit GPU pages")
check(route("alertname=ShmExhausted", "severity=warning", "namespace=ml") == "shmlink-tickets", "a workload's alert is a ticket")
check(route("alertname=GpuFabricDomainDegraded", "severity=critical", "cluster_uuid=a", "clique_id=1") == "shmlink-pager",
      "an NVLink domain pages")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alert(name, node, **labels):
    labels = {"alertname": name, "severity": "critical", "node": node, "job": "shmlink",
              "instance": f"{node}:9477", **{k: str(v) for k, v in labels.items()}}
    return {"labels": labels, "annotations": {"summary": name}}


def culprit(node, gpu):
    return alert("GpuLinkDegraded", node, gpu=gpu, peer_gpu=gpu)


def pair(node, a, b):
    return alert("GpuPairDegraded", node, gpu=a, peer_gpu=b)


# (alert, expected state)
CASES = [
    (culprit("gpu-node-7", 7), "active"),
    *[(pair("gpu-node-7", a, 7), "suppressed") for a in range(7)],
    (pair("gpu-node-7", 1, 2), "active"),
    (pair("gpu-node-8", 0, 7), "active"),
    (culprit("gpu-node-0", 0), "active"),
    (pair("gpu-node-0", 0, 3), "suppressed"),
    (pair("gpu-node-9", 0, 1), "active"),
    (pair("gpu-node-9", 2, 3), "active"),
    (alert("GpuAllPairsFailing", "gpu-node-10"), "active"),
    (culprit("gpu-node-10", 2), "suppressed"),
    (pair("gpu-node-10", 0, 1), "suppressed"),
    # The fleet: domain A (3 nodes) pages once; B's node and a GPU with no domain page alone.
    ({"labels": {"alertname": "GpuFabricDomainDegraded", "severity": "critical", "cluster_uuid": "uuid-a",
                 "clique_id": "1"}, "annotations": {"summary": "domain A"}}, "active"),
    *[(alert("GpuLinkDegraded", f"nvl-a-{n}", gpu=0, peer_gpu=0, cluster_uuid="uuid-a", clique_id=1), "suppressed")
      for n in range(3)],
    (alert("GpuXid", "nvl-a-0", gpu=0, xid=149, cluster_uuid="uuid-a", clique_id=1, severity="warning"), "suppressed"),
    (alert("GpuLinkDegraded", "nvl-a-9", gpu=0, peer_gpu=0, cluster_uuid="uuid-a", clique_id=2), "active"),
    (alert("GpuLinkDegraded", "nvl-b-0", gpu=0, peer_gpu=0, cluster_uuid="uuid-b", clique_id=1), "active"),
    (alert("GpuLinkDegraded", "hgx-0", gpu=3, peer_gpu=3), "active"),
    ({"labels": {"alertname": "GpuChassisDegraded", "severity": "critical", "chassis_serial": "CH-1"},
      "annotations": {"summary": "chassis CH-1"}}, "active"),
    (alert("GpuLinkDegraded", "b200-0", gpu=1, peer_gpu=1, chassis_serial="CH-1"), "suppressed"),
    (alert("GpuLinkDegraded", "b200-5", gpu=1, peer_gpu=1, chassis_serial="CH-2"), "active"),
]


def key(labels):
    return tuple(sorted((k, v) for k, v in labels.items()))


port = free_port()
base = f"http://127.0.0.1:{port}/api/v2"
with tempfile.TemporaryDirectory() as storage:
    am = subprocess.Popen(["prometheus-alertmanager", f"--config.file={CONFIG}", f"--storage.path={storage}",
                           f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/status", timeout=2).read()
                break
            except OSError:
                check(am.poll() is None and time.time() < deadline,
                      f"Alertmanager did not start: {am.stderr.read().decode() if am.poll() is not None else 'timeout'}")
                time.sleep(0.2)
        body = json.dumps([a for a, _ in CASES]).encode()
        req = urllib.request.Request(f"{base}/alerts", data=body, headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=5).read()
        # The inhibitor learns the source alerts as they arrive: ask until the states settle.
        want = {key(a["labels"]): state for a, state in CASES}
        deadline = time.time() + 20
        while True:
            got = {key(a["labels"]): a["status"]["state"]
                   for a in json.load(urllib.request.urlopen(f"{base}/alerts", timeout=5))}
            if got == want or time.time() > deadline:
                break
            time.sleep(0.5)
    finally:
        am.terminate()
        am.wait(timeout=10)
wrong = [f"{dict(k)['alertname']}{{node={dict(k).get('node')},gpu={dict(k).get('gpu')},peer_gpu={dict(k).get('peer_gpu')}}}: "
         f"{got.get(k)}, not {v}" for k, v in want.items() if got.get(k) != v]
check(not wrong and len(got) == len(want), "Alertmanager's inhibition:\n  " + "\n  ".join(wrong))
n = sum(v == "suppressed" for v in want.values())
print(f"   ok (Alertmanager {port}: {len(want)} alerts, {n} inhibited as expected, {len(want) - n} active)")
