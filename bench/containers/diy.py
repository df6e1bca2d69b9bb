#!/usr/bin/env python3
"""What people do today: a shell loop of `nsenter -t PID -m -p df -B1 /dev/shm` over the
containers. Times REPS runs of the loop over the PIDs given and prints one JSON object.
(`-p` too: df reads /proc/self/mounts, and the container's /proc shows only its own PIDs.)

    bench/containers/diy.py N REPS PID...
"""
import json
import os
import resource
import statistics
import subprocess
import sys
import time

LOOP = 'for p in "$@"; do nsenter -t "$p" -m -p df -B1 /dev/shm >/dev/null || exit 1; done'


def main():
    n, reps, pids = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    if len(pids) < n:
        sys.exit(f"diy.py: {len(pids)} containers running, expected {n}")
    walls, cpus = [], []
    for _ in range(reps):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(["bash", "-c", LOOP, "_", *pids], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            sys.exit(f"diy.py: the nsenter loop failed: {done.stderr.strip()[-500:]}")
        walls.append(wall * 1e6)
        cpus.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e6)

    def stats(s):
        return {"median": statistics.median(s), "min": min(s), "max": max(s), "samples": s}

    print(json.dumps({"mode": "diy", "containers": len(pids), "reps": reps, "unit": "us",
                      "command": "nsenter -t PID -m -p df -B1 /dev/shm",
                      "wall": stats(walls), "cpu": stats(cpus)}))


if __name__ == "__main__":
    main()
