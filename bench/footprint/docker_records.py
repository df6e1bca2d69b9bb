#!/usr/bin/env python3
"""Makes DIR a Docker data root with N stopped containers (config.v2.json and a json-file log
each), for measuring what `serve --docker-root DIR` costs on a host that keeps them:

    bench/footprint/docker_records.py 1000 /tmp/docker-records
    bench/run.sh footprint 60 5s --no-gpu --pod-log-root off --kmsg off --docker-root /tmp/docker-records
"""
import json
import os
import secrets
import sys

n, root = int(sys.argv[1]), sys.argv[2]
for i in range(n):
    cid = secrets.token_hex(32)
    d = os.path.join(root, "containers", cid)
    os.makedirs(d)
    state = {"Running": False, "OOMKilled": False, "ExitCode": 0,
             "StartedAt": "2026-11-20T00:00:00Z", "FinishedAt": "2026-11-20T00:10:00Z"}
    record = {"ID": cid, "Name": f"/job-{i}", "State": state,
              "Config": {"Image": "pytorch/pytorch:2.5.1", "Cmd": ["python"]}}
    with open(os.path.join(d, "config.v2.json"), "w") as f:
        json.dump(record, f)
    with open(os.path.join(d, f"{cid}-json.log"), "w") as f:
        f.write('{"log":"step 1\\n","stream":"stdout","time":"2026-11-20T00:00:01Z"}\n')
