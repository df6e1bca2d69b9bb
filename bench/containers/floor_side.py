#!/usr/bin/env python3
"""shmlink against the syscall floor as processes, side by side in one run, with the
containers already running (bench/containers/run.sh calls it per N):

  - `check` as a process (start, one scan, the report, exit) against the floor as a process
    (bench/containers/floor.c), interleaved: wall, CPU (user + system from wait4's rusage, the
    children's own, whatever else loads the machine) and check's peak RSS;
  - `serve` (failure sources on, no cluster, GPU or store) for a window, every binary given at
    once (so each meets the same load), scraped every interval: its mean shm scan (the shmlink_scan_duration_seconds histogram), the CPU
    of its scan threads per scan (`scan` and `shm-open`, from /proc/PID/task), its RSS; the
    floor process runs every interval in the same window, for the ratio.

    floor_side.py --containers N --floor BIN --shmlink LABEL=BIN [--shmlink LABEL=BIN ...]
                  [--reps R] [--serve-seconds S] [--interval SECONDS] [--cgroup-root DIR]
                  [--under PREFIX]

One JSON object on stdout ("mode": "floor_side"); the harness checks (every process saw the N
containers, every serve scanned) fail it with exit 1.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../tests/common"))
from promtext import samples  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def stats(xs):
    s = sorted(xs)
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "samples": xs}


def run(cmd):
    """wall s, CPU s, peak RSS MiB and stdout of one process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, out, p.returncode


def floor_cmd(a):
    cmd = [a.floor]
    if a.under:
        cmd += ["--under", a.under]
    return cmd


def check_cmd(a, binary):
    return [binary, "check", "--json", "--no-gpu", "--kube", "off", "--state-dir", "none", "--kmsg", "off",
            "--pod-log-root", "off", "--docker-root", "off", "--cgroup-root", a.cgroup_root]


def processes(a, bins):
    floor = {"wall": [], "cpu": []}
    checks = {label: {"wall": [], "cpu": [], "rss": []} for label in bins}
    for _ in range(a.reps):
        wall, cpu, _, out, code = run(floor_cmd(a))
        if code != 0 or int(out) != a.containers:
            sys.exit(f"the floor measured {out.strip()!r} (exit {code}), expected {a.containers}")
        floor["wall"].append(wall * 1e3)
        floor["cpu"].append(cpu * 1e3)
        for label, binary in bins.items():
            wall, cpu, rss, out, code = run(check_cmd(a, binary))
            seen = len(json.loads(out)["shm"]) if code in (0, 1) else -1
            if seen != a.containers:
                sys.exit(f"check ({label}) saw {seen} containers (exit {code}), expected {a.containers}")
            checks[label]["wall"].append(wall * 1e3)
            checks[label]["cpu"].append(cpu * 1e3)
            checks[label]["rss"].append(rss)
    return ({"wall": stats(floor["wall"]), "cpu": stats(floor["cpu"])},
            {label: {"wall": stats(c["wall"]), "cpu": stats(c["cpu"]), "rss_mib": max(c["rss"])}
             for label, c in checks.items()})


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.status, r.read().decode()


def scan_threads_ticks(pid):
    """utime + stime of the threads that scan (`scan`, `shm-open`), in ticks."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if comm in ("scan", "shm-open"):
            fields = stat[stat.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
    return total


def status_kib(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def scan_histogram(text):
    m = {}
    for name, labels, value in samples(text):
        if name.startswith("shmlink_scan_duration_seconds_") and labels.get("collector") == "shm":
            m[name.rsplit("_", 1)[1]] = value
    return m.get("sum", 0.0), m.get("count", 0.0)


def serve(a, bins):
    procs = {}
    for label, binary in bins.items():
        port = free_port()
        # As the DaemonSet runs it (its failure sources on), but no cluster, GPU or store.
        cmd = [binary, "serve", "--no-gpu", "--kube", "off", "--state-dir", "none",
               "--cgroup-root", a.cgroup_root, "--listen", f"127.0.0.1:{port}", "--interval", f"{a.interval}s"]
        procs[label] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         stdin=subprocess.DEVNULL), port)
    try:
        deadline = time.time() + 60
        for label, (p, port) in procs.items():
            while True:
                try:
                    if get(port, "/readyz")[0] == 200:
                        break
                except OSError:
                    pass
                if p.poll() is not None or time.time() > deadline:
                    sys.exit(f"serve ({label}) never got ready")
                time.sleep(0.1)
        start = {}
        for label, (p, port) in procs.items():
            start[label] = (scan_histogram(get(port, "/metrics")[1]), scan_threads_ticks(p.pid))
        floor = {"wall": [], "cpu": []}
        t0 = time.time()
        # Half an interval apart from the serves' own scans on average: the floor meets the same
        # load and, like them, starts after an idle pause.
        while time.time() - t0 < a.serve_seconds:
            time.sleep(a.interval / 2)
            wall, cpu, _, out, code = run(floor_cmd(a))
            if code == 0 and int(out) == a.containers:
                floor["wall"].append(wall * 1e3)
                floor["cpu"].append(cpu * 1e3)
            for _, port in procs.values():
                get(port, "/metrics")
            time.sleep(a.interval / 2)
        out = {"floor": {"wall": stats(floor["wall"]), "cpu": stats(floor["cpu"])}}
        for label, (p, port) in procs.items():
            text = get(port, "/metrics")[1]
            (s0, c0), t0_ticks = start[label]
            s1, c1 = scan_histogram(text)
            scans = c1 - c0
            if scans < 1:
                sys.exit(f"serve ({label}) finished no scan in the window")
            seen = sum(1 for name, labels, _ in samples(text) if name == "shmlink_shm_used_bytes" and labels)
            if seen != a.containers:
                sys.exit(f"serve ({label}) saw {seen} containers, expected {a.containers}")
            out[label] = {
                "scans": int(scans),
                "mean_scan_ms": 1e3 * (s1 - s0) / scans,
                "scan_cpu_ms": 1e3 * (scan_threads_ticks(p.pid) - t0_ticks) / HZ / scans,
                "rss_mib": status_kib(p.pid, "VmRSS") / 1024,
                "hwm_mib": status_kib(p.pid, "VmHWM") / 1024,
            }
        return out
    finally:
        for p, _ in procs.values():
            p.terminate()
            p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--containers", type=int, required=True)
    ap.add_argument("--floor", required=True)
    ap.add_argument("--shmlink", action="append", required=True, help="LABEL=BINARY")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--serve-seconds", type=float, default=60)
    ap.add_argument("--interval", type=float, default=5)
    ap.add_argument("--cgroup-root", default="/sys/fs/cgroup")
    ap.add_argument("--under")
    a = ap.parse_args()
    bins = dict(s.split("=", 1) for s in a.shmlink)
    floor, checks = processes(a, bins)
    served = serve(a, bins)
    print(json.dumps({"mode": "floor_side", "containers": a.containers, "reps": a.reps, "unit": "ms",
                      "labels": list(bins), "floor": floor, "check": checks, "serve": served,
                      "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
