#!/usr/bin/env bash
# The cost of failure detection (container logs and the kernel log), against the issue's goals:
#
#   1. log bytes scanned per CPU-second (bench/failures/log_bench.rs: LogTailer::since + one poll +
#      Signatures::match_line on every line of a 256 MiB pod log tree; tailer and signatures
#      apart too, and the rows alone without the fact tier beside them), goal >= 1 GB/s, the
#      fact tier's cost per line within 1.5x of the rows alone;
#   2. `shmlink serve`'s CPU and RSS with 100 containers each logging 100 lines/s, logs and
#      /dev/kmsg followed, beside a serve without log sources over the same window (the
#      baseline), goal < 1% of one core;
#   3. the delay from a failure line written to its Event at the API server
#      (bench/failures/bench_failures.rs against the in-process fake API server), goal p99 < 2 s.
#
#   bench/run.sh failures              # 256 MiB, 5 repetitions, serve 60 s, 100 Pods over 30 s
#   bench/run.sh failures --seconds 30 --mib 64 --reps 3 --pods 50 --spread 20
# The script runs alone too: bench/failures/run.sh [options].
#
# Needs root (it reads /dev/kmsg; says SKIPPED and exits 0 otherwise), cargo and python3.
# The report (markdown) goes to stdout and to target/bench/failures.md, the raw results to
# target/bench/failures.jsonl, progress to stderr. It fails on harness errors (a planted failure
# not found, a serve that did not follow every container, an Event that never arrived), never
# on timing.
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds=60 mib=256 reps=5 containers=100 rate=100 pods=100 spread=30
usage="usage: $0 [--seconds S] [--mib M] [--reps R] [--containers N] [--lines-per-sec L] [--pods P] [--spread S]"
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --mib) mib=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --containers) containers=$2; shift 2 ;;
    --lines-per-sec) rate=$2; shift 2 ;;
    --pods) pods=$2; shift 2 ;;
    --spread) spread=$2; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" != 0 ]; then
  banner="################################################################################"
  for fd in 1 2; do
    {
      echo "$banner"
      echo "##  SKIPPED: bench/run.sh failures needs root (it reads /dev/kmsg as serve does)."
      echo "##  Nothing was measured. Run it as root: sudo bench/run.sh failures"
      echo "$banner"
    } >&$fd
  done
  exit 0
fi
for tool in cargo python3; do
  command -v $tool >/dev/null || { echo "bench/run.sh failures: $tool is needed" >&2; exit 2; }
done

say() { echo "== $*" >&2; }
out=target/bench
mkdir -p "$out"
results=$out/failures.jsonl
: >"$results"
work=$(mktemp -d /tmp/shmlink-failures-bench.XXXXXX)
pids_to_kill=()
cleanup() {
  for p in "${pids_to_kill[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids_to_kill[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "building (release): shmlink, the log_bench example, the bench_failures test"
t_build=$SECONDS
# The test last: its build of the binary (dev-dependency features) is the one then measured.
cargo build -q --release --bin shmlink
cargo build -q --release --example log_bench
cargo test -q --release --test bench_failures --no-run 2>/dev/null
say "   built in $((SECONDS - t_build)) s"
shmlink=target/release/shmlink
t_start=$SECONDS

python3 - "$mib" "$reps" "$seconds" "$containers" "$rate" "$pods" "$spread" >>"$results" <<'PY'
import json, os, platform, subprocess, sys
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
mib, reps, seconds, containers, rate, pods, spread = sys.argv[1:]
print(json.dumps({"mode": "machine", "kernel": platform.release(), "cpu": cpu, "cores": os.cpu_count(),
  "mem_gib": round(mem / 2**20, 1), "load": os.getloadavg(), "rustc": rustc, "mib": int(mib),
  "reps": int(reps), "seconds": int(seconds), "containers": int(containers), "rate": int(rate),
  "pods": int(pods), "spread": float(spread)}))
PY

# 1 -----------------------------------------------------------------------------------------
say "1/3 log bytes per CPU-second: log_bench $mib MiB, $reps repetitions"
target/release/examples/log_bench "$mib" --reps "$reps" --json --dir "$work" >"$work/log_bench.json"
cat "$work/log_bench.json" >>"$results"

# 2 -----------------------------------------------------------------------------------------
say "2/3 serve with $containers containers x $rate lines/s, logs and /dev/kmsg, beside a serve without log sources and one following $containers idle logs, ${seconds} s"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() {
  python3 - "$1" <<'PY' || { echo "bench/run.sh failures: serve on port $1 never got ready" >&2; return 1; }
import sys, time, urllib.request
for _ in range(300):
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readyz", timeout=1).status == 200:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.1)
sys.exit(1)
PY
}
# The process's utime+stime (all its threads, the ended ones too), in clock ticks; then every
# live thread's name and time on CPU in ns (/proc/PID/task/TID/schedstat): "TID COMM NS" lines.
snapshot() {
  awk '{print "process", $14 + $15}' "/proc/$1/stat"
  for t in /proc/"$1"/task/*; do
    echo "$(basename "$t") $(tr ' ' _ <"$t/comm") $(cut -d' ' -f1 "$t/schedstat")"
  done
}

logroot=$work/pods idleroot=$work/idle
# The containers' log files, there before serve starts (followed from their end); and as many
# that nobody writes to, for a serve that shows the fixed cost of following them.
python3 - "$logroot" "$idleroot" "$containers" <<'PY'
import os, sys, uuid
for root in sys.argv[1:3]:
    for i in range(int(sys.argv[3])):
        d = os.path.join(root, f"ml_llama-ft-worker-{i}_{uuid.UUID(int=i + 1, version=4)}", "trainer")
        os.makedirs(d)
        open(os.path.join(d, "0.log"), "w").close()
PY

port_logs=$(free_port)
"$shmlink" serve --listen "127.0.0.1:$port_logs" --interval 5s --kube off --no-gpu \
  --pod-log-root "$logroot" --kmsg /dev/kmsg --docker-root off 2>"$work/serve-logs.log" &
pid_logs=$!; pids_to_kill+=("$pid_logs")
port_base=$(free_port)
"$shmlink" serve --listen "127.0.0.1:$port_base" --interval 5s --kube off --no-gpu \
  --pod-log-root off --kmsg off --docker-root off 2>"$work/serve-base.log" &
pid_base=$!; pids_to_kill+=("$pid_base")
port_idle=$(free_port)
"$shmlink" serve --listen "127.0.0.1:$port_idle" --interval 5s --kube off --no-gpu \
  --pod-log-root "$idleroot" --kmsg /dev/kmsg --docker-root off 2>"$work/serve-idle.log" &
pid_idle=$!; pids_to_kill+=("$pid_idle")
for p in "$port_logs" "$port_base" "$port_idle"; do wait_ready "$p"; done

# The writers: one process for all the containers, so that 100 interpreters do not crowd two
# cores; every 50 ms it appends each container's next lines (rate/20) in one write. One
# ShmAllocationFailed line per container inside the window shows that serve followed them all.
python3 - "$logroot" "$rate" "$((seconds + 2))" "$seconds" "$work/writer.json" <<'PY' &
import json, os, random, sys, time
root, rate, total, window, report = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
FAIL = ("RuntimeError: unable to allocate shared memory(shm) for file "
        "</torch_31552_3195629858_0>: No space left on device (28)")
rng = random.Random(7)
bodies = []
for step in range(2000):
    k = rng.random()
    if k < 0.5:
        bodies.append(("stdout", f"[rank{rng.randrange(8)}]:[trainer.py:412] epoch=3 step={step}/50000 "
                       f"loss={1.5 + rng.random():.4f} grad_norm={rng.random():.3f} lr=3.00e-04 "
                       f"tokens/s={40000 + rng.randrange(20000)} mem={20 + rng.random() * 15:.1f}GiB"))
    elif k < 0.8:
        pct = rng.randrange(101)
        bar = "\u2588" * (pct // 10) + " " * (10 - pct // 10)
        bodies.append(("stderr", f"Epoch 3: {pct:3d}%|{bar}| {pct * 50}/5000 [12:34<15:21,  2.98it/s, loss=2.31, v_num=7]"))
    else:
        bodies.append(("stderr", f"gpu-node-7:{1000 + rng.randrange(9000)}:{1000 + rng.randrange(9000)} "
                       f"[{rng.randrange(8)}] NCCL INFO Channel {rng.randrange(24):02d}/24 : 0[0] -> 1[1] via P2P/CUMEM/read"))
dirs = sorted(os.listdir(root))
fds = [os.open(os.path.join(root, d, "trainer", "0.log"), os.O_WRONLY | os.O_APPEND) for d in dirs]
n = len(fds)
tick = 0.05
per_tick = max(1, round(rate * tick))
ticks = int(total / tick)
# Container i's failure line: spread over the middle of the measured window.
fail_tick = {int((0.1 + 0.8 * (i + 0.5) / n) * window / tick): [] for i in range(n)}
for i in range(n):
    fail_tick[int((0.1 + 0.8 * (i + 0.5) / n) * window / tick)].append(i)
pos = [rng.randrange(len(bodies)) for _ in range(n)]
cache = [0, ""]
def stamp(ns):
    s = ns // 1_000_000_000
    if s != cache[0]:
        cache[0], cache[1] = s, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s))
    return "%s.%09dZ" % (cache[1], ns % 1_000_000_000)
start = time.monotonic()
lines = written = 0
for k in range(ticks):
    delay = start + k * tick - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    now = time.time_ns()
    failing = fail_tick.get(k, ())
    for i, fd in enumerate(fds):
        out = []
        for j in range(per_tick):
            stream, body = bodies[pos[i]]
            pos[i] = (pos[i] + 1) % len(bodies)
            out.append(f"{stamp(now + j * 10_000_000)} {stream} F {body}\n")
        if i in failing:
            out.append(f"{stamp(now)} stderr F {FAIL}\n")
        data = "".join(out).encode()
        os.write(fd, data)
        lines += len(out)
        written += len(data)
t = os.times()
json.dump({"lines": lines, "bytes": written, "seconds": time.monotonic() - start,
           "cpu_s": t.user + t.system, "containers": n}, open(report, "w"))
PY
pid_writer=$!; pids_to_kill+=("$pid_writer")

sleep 1 # the writers' first second: serve discovers nothing new, it follows
snapshot "$pid_logs" >"$work/logs.before"; snapshot "$pid_base" >"$work/base.before"; snapshot "$pid_idle" >"$work/idle.before"
w0=$(date +%s.%N)
sleep "$seconds"
snapshot "$pid_logs" >"$work/logs.after"; snapshot "$pid_base" >"$work/base.after"; snapshot "$pid_idle" >"$work/idle.after"
w1=$(date +%s.%N)
for p in "$pid_logs" "$pid_base" "$pid_idle"; do grep -E '^Vm(RSS|HWM):' /proc/"$p"/status | awk '{print $2}' | paste -sd' '; done >"$work/rss"
wait "$pid_writer"
sleep 1 # the last poll
python3 - "$port_logs" >"$work/metrics.txt" <<'PY'
import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode())
PY
PYTHONPATH=tests/common python3 - "$work" "$w0" "$w1" "$(getconf CLK_TCK)" "$containers" "$rate" >>"$results" <<'PY'
import json, sys
from promtext import samples
work, w0, w1, hz, containers, rate = sys.argv[1:]
secs = float(w1) - float(w0)
def load(name, when):
    rows = [l.split() for l in open(f"{work}/{name}.{when}")]
    return int(rows[0][1]), {r[0]: (r[1], int(r[2])) for r in rows[1:]}
def threads(name):
    (p0, b), (p1, a) = load(name, "before"), load(name, "after")
    per = {}
    for tid, (comm, ns) in a.items():
        per[comm] = per.get(comm, 0) + ns - b.get(tid, (comm, 0))[1]
    return (p1 - p0) / float(hz), {c: v / 1e9 for c, v in per.items()}
rss = [list(map(int, l.split())) for l in open(f"{work}/rss")]
found = sum(int(value) for name, labels, value in samples(open(f"{work}/metrics.txt").read())
            if name == "shmlink_workload_failures_total" and labels.get("kind") == "shm_allocation_failed")
writer = json.load(open(f"{work}/writer.json"))
def proc(name, r):
    cpu, t = threads(name)
    return {"cpu_s": cpu, "cpu_pct": 100 * cpu / secs, "rss_mib": r[0] / 1024, "hwm_mib": r[1] / 1024,
            "threads_cpu_pct": {c: round(100 * v / secs, 3) for c, v in sorted(t.items()) if v > 0}}
print(json.dumps({"mode": "serve", "seconds": round(secs, 1), "containers": int(containers),
  "lines_per_sec": int(rate), "logs": proc("logs", rss[0]), "baseline": proc("base", rss[1]), "idle": proc("idle", rss[2]),
  "failures_counted": found, "writer": writer,
  "writer_cpu_pct": 100 * writer["cpu_s"] / writer["seconds"]}))
PY
kill "$pid_logs" "$pid_base" "$pid_idle"; wait "$pid_logs" "$pid_base" "$pid_idle" 2>/dev/null || true
pids_to_kill=()
found=$(tail -1 "$results" | python3 -c 'import json,sys; print(json.load(sys.stdin)["failures_counted"])')
if [ "$found" != "$containers" ]; then
  echo "bench/run.sh failures: serve counted $found failures, $containers were written; its log:" >&2
  tail -20 "$work/serve-logs.log" >&2
  exit 1
fi

# 3 -----------------------------------------------------------------------------------------
say "3/3 failure line -> Event: $pods Pods, one line each over $spread s (bench/failures/bench_failures.rs)"
BENCH_PODS=$pods BENCH_SPREAD_SECS=$spread \
  cargo test -q --release --test bench_failures -- --ignored --nocapture >"$work/latency.txt" 2>&1 || {
  cat "$work/latency.txt" >&2
  echo "bench/run.sh failures: the latency test failed" >&2
  exit 1
}
grep '^BENCH_JSON ' "$work/latency.txt" | sed 's/^BENCH_JSON //' >>"$results"
say "   done in $((SECONDS - t_start)) s (build not counted)"

# The report ---------------------------------------------------------------------------------
python3 - "$results" "$((SECONDS - t_start))" >"$out/failures.md" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[r["mode"]] = r
m, lb, s, d = rows["machine"], rows["logs"], rows["serve"], rows["event_delay"]
ok = lambda b: "yes" if b else "no"
print(f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, Linux {m['kernel']}; {m['rustc']}, release build.  ")
print(f"Load average (1, 5, 15 min) at the start: {', '.join(f'{x:.2f}' for x in m['load'])}. Whole run {sys.argv[2]} s (build not counted).  ")
print(f"Run: `bench/run.sh failures --mib {m['mib']} --reps {m['reps']} --seconds {m['seconds']} "
      f"--containers {m['containers']} --lines-per-sec {m['rate']} --pods {m['pods']} --spread {m['spread']:g}`")
print()
print(f"### 1. Log bytes scanned per CPU-second (`log_bench`, median of {lb['reps']})")
print()
print(f"{lb['bytes'] / 2**20:.0f} MiB of CRI lines in {lb['containers']} containers, {lb['lines']:,} lines; "
      f"{lb['planted']} failure lines planted, {lb['found']} found (signatures alone: {lb['found_signatures_only']}).")
print()
print("| pass | CPU ms, median (min-max) | wall ms | GB/s per CPU-second | GB/s wall |")
print("|---|---:|---:|---:|---:|")
names = {"full": "tailer + signatures (`since` + one `poll` + `match_line`)",
         "tailer": "tailer alone", "signatures": "signatures alone (in-memory lines)",
         "exact": "the rows alone, no fact tier (in-memory lines; the baseline)"}
for k in ("full", "tailer", "signatures", "exact"):
    p = lb[k]
    print(f"| {names[k]} | {1e3 * p['cpu_s']['median']:.0f} ({1e3 * p['cpu_s']['min']:.0f}-{1e3 * p['cpu_s']['max']:.0f}) "
          f"| {1e3 * p['wall_s']['median']:.0f} | {p['gb_per_cpu_s']:.2f} | {p['gb_per_wall_s']:.2f} |")
print()
print(f"Throughput is the log files' bytes (CRI prefixes included) over the pass's CPU time; the signatures "
      f"alone look at {lb['text_bytes'] / 2**20:.0f} MiB of text, {lb['signatures_text_gb_per_cpu_s']:.2f} GB/s of it.")
if "exact" in lb:
    ratio = lb["signatures_ns_per_line"] / lb["exact_ns_per_line"]
    print()
    print(f"Cost per line, median CPU: {lb['signatures_ns_per_line']:.1f} ns with the fact tier, "
          f"{lb['exact_ns_per_line']:.1f} ns the rows alone: {ratio:.2f}x (goal <= 1.5x); the rows alone "
          f"found {lb['found_exact_only']} of the {lb['planted']} planted failures, as both tiers did.")
print()
L, B, I = s["logs"], s["baseline"], s["idle"]
print(f"### 2. `serve` with {s['containers']} containers x {s['lines_per_sec']} lines/s, {s['seconds']:.0f} s")
print()
print("Three `serve --interval 5s --kube off --no-gpu` side by side over the same window:")
print()
print("| serve | CPU (% of one core) | CPU s | RSS MiB (peak) |")
print("|---|---:|---:|---:|")
print(f"| `--pod-log-root <{s['containers']} logging> --kmsg /dev/kmsg` | {L['cpu_pct']:.2f}% | {L['cpu_s']:.2f} | {L['rss_mib']:.1f} ({L['hwm_mib']:.1f}) |")
print(f"| `--pod-log-root <{s['containers']} silent> --kmsg /dev/kmsg` | {I['cpu_pct']:.2f}% | {I['cpu_s']:.2f} | {I['rss_mib']:.1f} ({I['hwm_mib']:.1f}) |")
print(f"| `--pod-log-root off --kmsg off` (baseline) | {B['cpu_pct']:.2f}% | {B['cpu_s']:.2f} | {B['rss_mib']:.1f} ({B['hwm_mib']:.1f}) |")
print()
print(f"Following the logs and kmsg costs {L['cpu_pct'] - B['cpu_pct']:.2f}% of a core above the baseline: "
      f"{I['cpu_pct'] - B['cpu_pct']:.2f}% to watch {s['containers']} files that say nothing, "
      f"{L['cpu_pct'] - I['cpu_pct']:.2f}% for their {s['containers'] * s['lines_per_sec']:,} lines/s.")
print()
fmt = lambda t: ", ".join(f"`{c}` {v:.2f}%" for c, v in sorted(t.items(), key=lambda kv: -kv[1]) if v >= 0.005)
w = s["writer"]
print(f"By thread (schedstat): logging: {fmt(L['threads_cpu_pct'])}; silent: {fmt(I['threads_cpu_pct'])}; "
      f"baseline: {fmt(B['threads_cpu_pct']) or '-'}. The writers appended {w['lines']:,} lines "
      f"({w['bytes'] / 2**20:.1f} MiB) in {w['seconds']:.0f} s for {s['writer_cpu_pct']:.1f}% of a core (not in serve's "
      f"figure); serve counted {s['failures_counted']} of the {s['containers']} failure lines planted.")
print()
ms = d["ms"]
print(f"### 3. Failure line written -> its Event at the API server ({d['pods']} Pods, one line each over {d['spread_s']:g} s)")
print()
print("| count | p50 | p90 | p99 | max | min | mean |")
print("|---:|---:|---:|---:|---:|---:|---:|")
print(f"| {d['count']} of {d['pods']} | {ms['p50']:.0f} ms | {ms['p90']:.0f} ms | {ms['p99']:.0f} ms | {ms['max']:.0f} ms | {ms['min']:.0f} ms | {ms['mean']:.0f} ms |")
print()
print(f"Arrival is when the test, polling the fake API server every {d['poll_ms']} ms, first saw the Event (up to "
      f"{d['poll_ms']} ms late). Nearest-rank percentiles.")
print()
print("### Goals")
print()
print("| goal | measured | met |")
print("|---|---|---|")
g1 = lb["full"]["gb_per_cpu_s"]
print(f"| log bytes scanned >= 1 GB/s per core | {g1:.2f} GB/s (tailer {lb['tailer']['gb_per_cpu_s']:.2f}, signatures {lb['signatures']['gb_per_cpu_s']:.2f}) | {ok(g1 >= 1)} |")
if "exact" in lb:
    ratio = lb["signatures_ns_per_line"] / lb["exact_ns_per_line"]
    print(f"| the recogniser's cost per line within 1.5x of the rows alone | {ratio:.2f}x "
          f"({lb['signatures_ns_per_line']:.1f} ns vs {lb['exact_ns_per_line']:.1f} ns) | {ok(ratio <= 1.5)} |")
print(f"| serve < 1% of a core with {s['containers']} containers x {s['lines_per_sec']} lines/s | {L['cpu_pct']:.2f}% ({L['cpu_pct'] - B['cpu_pct']:.2f}% above the baseline) | {ok(L['cpu_pct'] < 1)} |")
print(f"| failure line -> Event p99 < 2 s | p99 {ms['p99']:.0f} ms, max {ms['max']:.0f} ms | {ok(ms['p99'] < 2000)} |")
PY
cat "$out/failures.md"
