#!/usr/bin/env python3
"""The moment of death, measured (BENCHMARKS.md, "The moment of death"). As root, with a release
build (cargo build --release --bin shmlink):

    bench/death_trace/race.py race [DEATHS=60]      real SIGBUS deaths of 100 MiB-1 GiB touched
    bench/death_trace/race.py cost [SECONDS=30] [RATE=1000] [host|ns]
                                                    serve's CPU idle and in a SIGBUS storm,
                                                    --death-trace on and off; the storm's
                                                    processes on the host (default) or in
                                                    their own mount and PID namespaces

race: each death is a Python process alone in its own mount and PID namespaces (as a container's
main process), on a private tmpfs at /dev/shm of 60% of what it sizes; it sizes a
multiprocessing.shared_memory block of 100 MiB-1 GiB, idles 0.5 s, fills it, and dies of SIGBUS
at the tmpfs's end; with it its namespaces and /dev/shm go. serve (--death-trace on, debug log)
says for each traced death how long after the signal its reading was taken and what /dev/shm
held: taken in time when /dev/shm was read (the process and its mount still stood) and full.

cost: serve's CPU (utime+stime of /proc/PID/stat) over SECONDS, idle, then while a C loop
(storm.c, built with gcc) forks RATE tiny processes a second that each die of a page-fault
SIGBUS on the host (each one a failure told and logged when traced).
"""
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, "target/release/shmlink")
MIB = 1 << 20

FILL = r"""
import sys, time
from multiprocessing import shared_memory
size = int(sys.argv[1])
block = shared_memory.SharedMemory(create=True, size=size)
time.sleep(0.5)
mib = b"\1" * (1 << 20)
for i in range(size >> 20):
    block.buf[i << 20:(i + 1) << 20] = mib
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Tracefs:
    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="shmlink-bench-tracefs-")
        subprocess.run(["mount", "-t", "tracefs", "nodev", self.dir], check=True)
        return self.dir

    def __exit__(self, *_):
        subprocess.run(["umount", "-l", self.dir])
        os.rmdir(self.dir)


def serve(tracefs, mode, log):
    port = free_port()
    p = subprocess.Popen(
        [BIN, "serve", "--listen", f"127.0.0.1:{port}", "--kube", "off", "--no-gpu",
         "--pod-log-root", "off", "--docker-root", "off", "--kmsg", "off",
         "--death-trace", mode, "--tracefs", tracefs, "--log-level", "debug"],
        stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return p, port


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads(pid):
    """CPU seconds by thread name."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def one_death(size, fill):
    shm = int(size * 0.6) // MIB
    script = f"mount -t tmpfs -o size={shm}m tmpfs /dev/shm && exec python3 {fill} {size}"
    return subprocess.run(["unshare", "-m", "-p", "-f", "--propagation", "private",
                           "sh", "-c", script], stderr=subprocess.DEVNULL).returncode


def race(deaths):
    random.seed(35)
    with Tracefs() as t, tempfile.NamedTemporaryFile("w+", prefix="shmlink-race-") as log, \
            tempfile.NamedTemporaryFile("w", suffix=".py") as fill:
        fill.write(FILL)
        fill.flush()
        p, _ = serve(t, "on", log)
        sizes = [random.randint(100, 1024) * MIB for _ in range(deaths)]
        codes = [one_death(s, fill.name) for s in sizes]
        time.sleep(1)
        p.send_signal(signal.SIGTERM)
        p.wait()
        log.seek(0)
        lines = [l for l in log.read().splitlines() if "traced death" in l and "sigbus" in l]
    got = []
    for l in lines:
        after = int(re.search(r"read_after_us=(\d+)", l).group(1))
        used = re.search(r"shm_used=(\d+)", l)
        size = re.search(r"shm_size=(\d+)", l)
        full = bool(used and size and int(used.group(1)) >= 0.9 * int(size.group(1)))
        # The process still held its files after the look: a reading that may clear /dev/shm.
        held = "in_time=true" in l
        got.append((after, used is not None, full, held))
    died = sum(1 for c in codes if c == 128 + 7 or c == -7 or c == 135)
    in_time = sum(1 for _, read, full, _ in got if read and full)
    held = sum(1 for *_, h in got if h)
    afters = sorted(a for a, *_ in got)
    q = lambda f: afters[min(len(afters) - 1, int(f * len(afters)))] if afters else None
    print(f"deaths={deaths} died_of_sigbus={died} traced={len(got)} "
          f"read_while_standing_and_full={in_time} read_while_it_held_its_files={held} "
          f"read_after_us p50={q(0.5)} p90={q(0.9)} p99={q(0.99)} max={afters[-1] if afters else None}")


def cost(secs, rate, where):
    storm = os.path.join(tempfile.gettempdir(), "shmlink-storm")
    subprocess.run(["gcc", "-O2", "-o", storm, os.path.join(os.path.dirname(__file__), "storm.c")],
                   check=True)
    with Tracefs() as t:
        for mode in ("off", "on"):
            with open(os.devnull, "w") as log:
                p, _ = serve(t, mode, log)
                time.sleep(2)
                c0 = cpu_seconds(p.pid)
                time.sleep(secs)
                idle = (cpu_seconds(p.pid) - c0) / secs * 100
                c0, w0, t0 = cpu_seconds(p.pid), time.monotonic(), threads(p.pid)
                run = [storm, str(rate), str(secs), storm + ".file"]
                if where == "ns":
                    run = ["unshare", "-m", "-p", "-f", "--propagation", "private"] + run
                subprocess.run(run, check=True, stdout=subprocess.DEVNULL)
                wall = time.monotonic() - w0
                busy = (cpu_seconds(p.pid) - c0) / wall * 100
                t1 = threads(p.pid)
                by = {k: (v - t0.get(k, 0)) / wall * 100 for k, v in t1.items()}
                top = ", ".join(f"{k} {v:.1f}%" for k, v in sorted(by.items(), key=lambda kv: -kv[1])
                                if v >= 0.1)
                p.send_signal(signal.SIGTERM)
                p.wait()
            print(f"[{where}] death-trace={mode} idle={idle:.3f}% storm({rate}/s, {wall:.0f} s)={busy:.2f}% "
                  f"of a core ({top or 'no thread'})")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("race", "cost"):
        sys.exit(__doc__)
    if sys.argv[1] == "race":
        race(int(sys.argv[2]) if len(sys.argv) > 2 else 60)
    else:
        args = sys.argv[2:] + [None] * 3
        cost(int(args[0] or 30), int(args[1] or 1000), args[2] or "host")
