#!/usr/bin/env python3
"""The state store's cost in `shmlink serve` (issue 38), at N containers.

Two serves side by side over the same window, following the same kubelet pod log tree of N
containers (no real containers: the scans cost nearly nothing, so the difference is the store's):
one with `--state-dir` on a real disk, one with `--state-dir none`. Each container's log gets
`--lines-per-sec` lines a second and one of them, in turn, a PyTorch failure line every
`--death-every` seconds, so the store writes log positions, checkpoints and failures as it would.

Measured: CPU (utime + stime of /proc/PID/stat) of both over the window; the store's commits
and rows from serve's own metrics; bytes written (/proc/PID/io write_bytes); then a second,
shorter pass of the store's serve under `strace -f -c` for its fsync/fdatasync calls (strace
slows it, so its CPU is not taken from that pass). Markdown on stdout.

  bench/run.sh state [--containers N] [--seconds S] [--lines-per-sec L] [--death-every D]
                     [--bin PATH]
"""

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

FAILURE = ("ERROR: Unexpected bus error encountered in worker. This might be caused by "
           "insufficient shared memory (shm).")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cri(text):
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".%06dZ" % int(now % 1 * 1e6)
    return f"{stamp} stderr F {text}\n"


def make_tree(root, n):
    logs = []
    for i in range(n):
        uid = "%08x-0000-4000-8000-%012x" % (random.getrandbits(32), i)
        d = os.path.join(root, f"ml_job-{i}_{uid}", "trainer")
        os.makedirs(d)
        path = os.path.join(d, "0.log")
        open(path, "w").close()
        logs.append(path)
    return logs


def writer(logs, rate, death_every, stop, deaths):
    """Every 100 ms each log gets rate/10 lines; a failure line every death_every s."""
    files = [open(p, "a", buffering=1) for p in logs]
    per_tick = max(1, rate // 10)
    next_death = time.monotonic() + death_every
    turn = 0
    while not stop.is_set():
        t0 = time.monotonic()
        for i, f in enumerate(files):
            f.write("".join(cri(f"step {turn} loss 0.{i:04d} lr 3e-4") for _ in range(per_tick)))
        if t0 >= next_death:
            files[turn % len(files)].write(cri(FAILURE))
            deaths[0] += 1
            turn += 1
            next_death += death_every
        time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))
    for f in files:
        f.close()


def serve(binary, root, state, port, log):
    return subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}", "--interval", "5s", "--kube", "off",
         "--no-gpu", "--node-name", "bench", "--pod-log-root", root, "--kmsg", "off",
         "--docker-root", "off", "--death-trace", "off", "--state-dir", state],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, "w"))


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(shmlink_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m and not m.group(2):
            out[m.group(1)] = float(m.group(3))
    out["_failures"] = sum(float(v) for v in re.findall(
        r"^shmlink_workload_failures_total\{[^}]*\} ([0-9.e+-]+)$", text, re.M))
    return out


def wait_ready(port, proc, log):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"serve exited: {open(log).read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.1)
    sys.exit("serve never got ready")


def ticks(pid):
    stat = open(f"/proc/{pid}/stat").read()
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def write_bytes(pid):
    for line in open(f"/proc/{pid}/io"):
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def strace_pass(binary, root, seconds, work):
    state = os.path.join(work, "state-strace")
    port = free_port()
    log = os.path.join(work, "strace-serve.log")
    out = os.path.join(work, "strace.txt")
    proc = subprocess.Popen(
        ["strace", "-f", "-c", "-o", out, "-e", "trace=fsync,fdatasync,pwrite64,write",
         binary, "serve", "--listen", f"127.0.0.1:{port}", "--interval", "5s", "--kube", "off",
         "--no-gpu", "--node-name", "bench", "--pod-log-root", root, "--kmsg", "off",
         "--docker-root", "off", "--death-trace", "off", "--state-dir", state],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    wait_ready(port, proc, log)
    time.sleep(seconds)
    # The traced serve is stopped, not strace (which would detach and leave it running).
    children = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
    for c in children:
        os.kill(int(c), 15)
    proc.wait(timeout=30)
    calls = {}
    for line in open(out):
        parts = line.split()
        if len(parts) >= 5 and parts[-1] in ("fsync", "fdatasync", "pwrite64", "write"):
            calls[parts[-1]] = int(parts[3])
    return calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--containers", type=int, default=300)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--lines-per-sec", type=int, default=10)
    ap.add_argument("--death-every", type=float, default=1.0)
    ap.add_argument("--strace-seconds", type=int, default=20)
    ap.add_argument("--bin", default="target/release/shmlink")
    ap.add_argument("--seed", type=int, default=38)
    a = ap.parse_args()
    random.seed(a.seed)
    # The store on the machine's disk (not a tmpfs), as on a node.
    work = tempfile.mkdtemp(prefix="shmlink-state-bench.", dir="/var/tmp")
    procs = []
    stop = threading.Event()
    try:
        root = os.path.join(work, "pods")
        logs = make_tree(root, a.containers)
        deaths = [0]
        t = threading.Thread(target=writer, args=(logs, a.lines_per_sec, a.death_every, stop,
                                                  deaths), daemon=True)
        t.start()
        runs = {}
        for name, state in (("store", os.path.join(work, "state")), ("none", "none")):
            port = free_port()
            log = os.path.join(work, f"serve-{name}.log")
            p = serve(a.bin, root, state, port, log)
            procs.append(p)
            runs[name] = (p, port, log)
        for p, port, log in runs.values():
            wait_ready(port, p, log)
        time.sleep(2)  # both past their first reads
        before = {n: (ticks(p.pid), write_bytes(p.pid), metrics(port), deaths[0])
                  for n, (p, port, _) in runs.items()}
        t0 = time.monotonic()
        time.sleep(a.seconds)
        secs = time.monotonic() - t0
        after = {n: (ticks(p.pid), write_bytes(p.pid), metrics(port), deaths[0])
                 for n, (p, port, _) in runs.items()}
        hz = os.sysconf("SC_CLK_TCK")
        res = {}
        for n in runs:
            (c0, w0, m0, d0), (c1, w1, m1, d1) = before[n], after[n]
            res[n] = {
                "cpu_pct": (c1 - c0) / hz / secs * 100,
                "write_kib_s": (w1 - w0) / 1024 / secs,
                "commits_s": (m1.get("shmlink_state_commits_total", 0)
                              - m0.get("shmlink_state_commits_total", 0)) / secs,
                "rows_s": (m1.get("shmlink_state_rows_written_total", 0)
                           - m0.get("shmlink_state_rows_written_total", 0)) / secs,
                "dropped": m1.get("shmlink_state_dropped_total", 0),
                "failures_told": m1["_failures"] - m0["_failures"],
                "deaths_written": d1 - d0,
            }
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        procs = []
        calls = {}
        if shutil.which("strace") and a.strace_seconds > 0:
            calls = strace_pass(a.bin, root, a.strace_seconds, work)
        stop.set()
        lines = a.containers * a.lines_per_sec
        print(f"N = {a.containers} containers, {lines} log lines/s, a failure line every "
              f"{a.death_every:g} s, {secs:.0f} s; binary {a.bin}\n")
        print("| serve | CPU (% of a core) | store commits/s | rows/s | disk writes (KiB/s) "
              "| failures told | dropped |")
        print("|---|---|---|---|---|---|---|")
        for n, r in res.items():
            label = "--state-dir (disk)" if n == "store" else "--state-dir none"
            print(f"| {label} | {r['cpu_pct']:.2f} | {r['commits_s']:.2f} | {r['rows_s']:.1f} "
                  f"| {r['write_kib_s']:.1f} | {r['failures_told']:.0f} of "
                  f"{r['deaths_written']} | {r['dropped']:.0f} |")
        if calls:
            s = a.strace_seconds
            print(f"\nUnder strace -f -c for {s} s (store on): "
                  + ", ".join(f"{k} {v} ({v / s:.2f}/s)" for k, v in sorted(calls.items())))
        print("\n" + json.dumps({"results": res, "syscalls": calls}), file=sys.stderr)
        bad = [n for n, r in res.items() if r["failures_told"] < r["deaths_written"] - 2]
        if bad:
            sys.exit(f"harness error: {bad} told fewer failures than were written")
    finally:
        stop.set()
        for p in procs:
            p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
