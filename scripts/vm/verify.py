#!/usr/bin/env python3
"""Checks what the cgroup v2 test VM said on its serial console (scripts/vm/scenarios.sh's
@@ markers) against what each scenario made. Prints one line per scenario, PASS or FAIL with
the reason, and the VM's timings; exits 1 when any failed or the VM's output is incomplete.

    python3 scripts/vm/verify.py target/vm/console.log
"""
import json
import os
import sys

# The harnesses' one Prometheus text parser: samples(text) -> [(name, {labels}, value)].
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "common"))
from promtext import samples  # noqa: E402

MIB = 1 << 20
# Every scenario scenarios.sh makes: one that never said it was made is a failure, not a skip.
EXPECTED = ["default64", "full64", "emptydir", "hostipc", "crio", "guaranteed", "podlimit",
            "symlink", "unlinked", "sharedw", "sharedr", "ctrlimit", "crash", "oom", "oomcount"]


def parse(text):
    lines = [l.rstrip("\r") for l in text.splitlines()]
    scenarios, blocks, values, errors = {}, {}, {}, []
    block = None
    for line in lines:
        if block is not None:
            if line == f"@@END {block}":
                block = None
            else:
                blocks[block].append(line)
            continue
        if line.startswith("@@BEGIN "):
            block = line.split(" ", 1)[1]
            blocks[block] = []
        elif line.startswith("@@SCENARIO "):
            parts = line.split()
            scenarios[parts[1]] = dict(p.split("=", 1) for p in parts[2:])
        elif line.startswith("@@ERROR "):
            errors.append(line[len("@@ERROR "):])
        elif line.startswith("@@"):
            key, _, value = line[2:].partition(" ")
            values[key] = value
    return scenarios, {k: "\n".join(v) for k, v in blocks.items()}, values, errors


def sample(all_samples, name, **labels):
    found = [v for n, l, v in all_samples if n == name and all(l.get(k) == v for k, v in labels.items())]
    return found[0] if found else None


class Failed(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Failed(what)


def in_mib(value, lo, hi, what):
    expect(isinstance(value, int) and lo * MIB <= value < hi * MIB,
           f"{what} {value} not in [{lo}, {hi}) MiB")


def main():
    text = open(sys.argv[1], errors="replace").read()
    scenarios, blocks, values, errors = parse(text)
    results = []  # (name, ok, detail)

    def run(name, fn):
        try:
            detail = fn()
            results.append((name, True, detail or ""))
        except Failed as e:
            results.append((name, False, str(e)))
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
            results.append((name, False, f"{type(e).__name__}: {e}"))

    # The VM itself: cgroup v2 alone, the memory controller there.
    def environment():
        mounts = values.get("VM-CGROUP-MOUNTS", "")
        expect(mounts.startswith("cgroup2 /sys/fs/cgroup cgroup2"), f"cgroup mounts: {mounts!r}")
        expect(" cgroup " not in mounts, f"a cgroup v1 hierarchy is mounted: {mounts!r}")
        expect("memory" in values.get("VM-CONTROLLERS", "").split(), "no memory controller")
        expect("VM-UPTIME-AT-END" in values, "the VM never reached the end of its scenarios")
        return f"kernel {values.get('VM-KERNEL')}, controllers: {values.get('VM-CONTROLLERS')}"
    run("vm-cgroup-v2", environment)

    report = None
    if "check-json" in blocks:
        try:
            report = json.loads(blocks["check-json"])
        except json.JSONDecodeError:
            pass
    check_exit = values.get("CHECK-EXIT")

    def entry(name, mounted=True):
        expect(name in scenarios, f"not made in the VM: {'; '.join(e for e in errors if name in e) or 'no @@SCENARIO line'}")
        expect(report is not None, f"check --json printed no JSON (exit {check_exit}): {blocks.get('check-stderr', '')[:400]}")
        s = scenarios[name]
        found = [e for e in report["shm"] if e["container_id"] == s["container_id"]]
        expect(len(found) == 1, f"container {s['container_id']} in check --json {len(found)} times; cgroups listed: {[e['cgroup'] for e in report['shm']]}")
        e = found[0]
        expect(e["pod_uid"] == s["pod_uid"], f"pod_uid {e['pod_uid']!r}, made {s['pod_uid']!r}")
        expect(e["cgroup"] == s["cgroup"], f"cgroup {e['cgroup']!r}, made {s['cgroup']!r}")
        if mounted:
            expect(e["mounted"] is True and e["fs_type"] == "tmpfs", f"mounted {e['mounted']}, fs_type {e['fs_type']}")
        expect(isinstance(e["pid"], int) and e["pid"] > 1, f"pid {e['pid']}")
        return s, e

    def summary(e):
        return (f"pod_uid ok, container_id ok, size {e['size_bytes']}, used {e['used_bytes']}, "
                f"available {e['available_bytes']}, memory_limit {e['memory_limit_bytes']}, "
                f"shmem {e['memory_shmem_bytes']}, host_ipc {e['host_ipc']}, status {e['status']}")

    def default64():
        s, e = entry("default64")
        expect(e["size_bytes"] == 64 * MIB, f"size {e['size_bytes']}")
        in_mib(e["used_bytes"], 20, 21, "used")
        expect(e["available_bytes"] == 64 * MIB - e["used_bytes"], f"available {e['available_bytes']}")
        expect(e["memory_limit_bytes"] is None, f"memory_limit {e['memory_limit_bytes']}")
        expect(e["host_ipc"] is False and e["status"] == "ok", f"host_ipc {e['host_ipc']}, status {e['status']}")
        # The 20 MiB are charged to the container's own memory cgroup (memory.stat shmem).
        expect((e["memory_shmem_bytes"] or 0) >= 20 * MIB, f"memory_shmem {e['memory_shmem_bytes']}")
        return summary(e)
    run("default64", default64)

    def full64():
        s, e = entry("full64")
        in_mib(e["used_bytes"], 62, 63, "used")
        expect(e["status"] == "critical", f"status {e['status']}")
        expect(check_exit == "1", f"check exited {check_exit}, expected 1 (a critical finding)")
        f = [f for f in report["findings"] if s["container_id"][:12] in f["subject"]]
        expect(f and f[0]["kind"] == "shm_exhausted" and f[0]["severity"] == "critical", f"findings {f}")
        return summary(e) + f"; finding {f[0]['kind']}; check exit {check_exit}"
    run("full64", full64)

    def emptydir():
        s, e = entry("emptydir")
        expect(e["size_bytes"] == 1024 * MIB, f"size {e['size_bytes']}")
        in_mib(e["used_bytes"], 100, 101, "used")
        expect(e["status"] == "ok" and e["host_ipc"] is False, f"status {e['status']}")
        return summary(e)
    run("emptydir", emptydir)

    def hostipc():
        s, e = entry("hostipc")
        expect(e["host_ipc"] is True, f"host_ipc {e['host_ipc']}")
        expect(e["size_bytes"] == 32 * MIB, f"size {e['size_bytes']}, the VM's /dev/shm is 32 MiB")
        return summary(e)
    run("hostipc", hostipc)

    def crio():
        s, e = entry("crio")
        expect(e["size_bytes"] == 64 * MIB, f"size {e['size_bytes']}")
        in_mib(e["used_bytes"], 10, 11, "used")
        return summary(e)
    run("crio", crio)

    def guaranteed():
        s, e = entry("guaranteed")
        in_mib(e["used_bytes"], 5, 6, "used")
        return summary(e)
    run("guaranteed", guaranteed)

    def podlimit():
        s, e = entry("podlimit")
        expect(s["pod_memory_max"] == str(48 * MIB), f"the VM's pod slice memory.max {s['pod_memory_max']}")
        expect(s["container_memory_max"] == str(256 * MIB), f"the container's memory.max {s['container_memory_max']}")
        expect(e["size_bytes"] == 512 * MIB, f"size {e['size_bytes']}")
        in_mib(e["used_bytes"], 24, 25, "used")
        expect(e["memory_limit_bytes"] == 48 * MIB,
               f"memory_limit {e['memory_limit_bytes']}: must be the pod slice's 48 MiB, not the container's 256 MiB")
        a = e["available_bytes"]
        # headroom = 48 MiB - (24 MiB of shm + the shell's own pages) < tmpfs free (488 MiB)
        expect(a is not None and 10 * MIB < a <= 24 * MIB, f"available {a}: must follow the pod slice's headroom")
        expect((e["memory_shmem_bytes"] or 0) >= 24 * MIB, f"memory_shmem {e['memory_shmem_bytes']}")
        return summary(e)
    run("podlimit", podlimit)

    def symlink():
        s, e = entry("symlink", mounted=False)
        # Following the link would report the VM's 7 MiB tmpfs.
        expect(e["mounted"] is False, f"mounted {e['mounted']}: the symlink was followed? size {e['size_bytes']}")
        expect(e["size_bytes"] is None and e["used_bytes"] is None, f"size {e['size_bytes']}, used {e['used_bytes']}")
        expect(e["status"] == "ok", f"status {e['status']}")
        return f"mounted {e['mounted']}, size {e['size_bytes']}, used {e['used_bytes']}, status {e['status']}"
    run("symlink", symlink)

    def unlinked():
        s, e = entry("unlinked")
        # The container's ls sees nothing: the 16 MiB live only in an open, unlinked file.
        ls = values.get("UNLINKED-LS", "")
        expect(ls == "[rc=0 ]", f"ls -A /dev/shm in the container said {ls!r}")
        in_mib(e["used_bytes"], 16, 17, "used")
        return summary(e) + "; ls -A /dev/shm: empty"
    run("unlinked", unlinked)

    def shared():
        sw, w = entry("sharedw")
        sr, r = entry("sharedr")
        expect(sw["pod_uid"] == sr["pod_uid"], "the two containers are of one pod")
        for e in (w, r):
            expect(e["size_bytes"] == 256 * MIB, f"size {e['size_bytes']}")
            in_mib(e["used_bytes"], 30, 31, f"used of {e['container_id'][:12]}")
        return f"writer: {summary(w)}; reader: used {r['used_bytes']}, size {r['size_bytes']}"
    run("shared-emptydir", shared)

    def ctrlimit():
        s, e = entry("ctrlimit")
        expect(s["pod_memory_max"] == str(512 * MIB), f"the VM's pod slice memory.max {s['pod_memory_max']}")
        expect(s["container_memory_max"] == str(96 * MIB), f"the container's memory.max {s['container_memory_max']}")
        expect(e["memory_limit_bytes"] == 96 * MIB,
               f"memory_limit {e['memory_limit_bytes']}: must be the container's 96 MiB, not the pod slice's 512 MiB")
        a = e["available_bytes"]
        # headroom = 96 MiB - (40 MiB of shm + the shell's pages), far below the 984 MiB free
        expect(e["size_bytes"] == 1024 * MIB, f"size {e['size_bytes']}")
        in_mib(e["used_bytes"], 40, 41, "used")
        expect(a is not None and 30 * MIB < a <= 56 * MIB, f"available {a}")
        return summary(e)
    run("ctrlimit", ctrlimit)

    def metrics():
        expect("metrics" in blocks, "serve's /metrics never scraped")
        m = samples(blocks["metrics"])
        expect(sample(m, "shmlink_build_info") == 1, "no shmlink_build_info 1")
        checked = []
        for name, metric, want in [
            ("default64", "shmlink_shm_size_bytes", 64 * MIB),
            ("emptydir", "shmlink_shm_size_bytes", 1024 * MIB),
            ("podlimit", "shmlink_shm_memory_limit_bytes", 48 * MIB),
            ("hostipc", "shmlink_shm_host_ipc", 1),
            ("default64", "shmlink_shm_host_ipc", 0),
        ]:
            expect(name in scenarios, f"{name} not made")
            got = sample(m, metric, container_id=scenarios[name]["container_id"])
            expect(got == want, f"{metric} of {name}: {got}, want {want}")
            checked.append(f"{metric}[{name}]={int(got)}")
        used = sample(m, "shmlink_shm_used_bytes", container_id=scenarios["full64"]["container_id"])
        expect(used is not None and 62 * MIB <= used < 63 * MIB, f"used of full64 {used}")
        checked.append(f"shmlink_shm_used_bytes[full64]={int(used)}")
        return ", ".join(checked)
    run("serve-metrics", metrics)

    def crash():
        expect("crash" in scenarios, f"not made: {errors}")
        kmsg = blocks.get("kmsg-segfault", "")
        expect("segfault at" in kmsg and "libnccl.so.2" in kmsg, f"the VM's kernel log: {kmsg!r}")
        m = samples(blocks.get("metrics-after-crash", ""))
        got = sample(m, "shmlink_workload_failures_total", kind="gpu_job_crashed",
                     container_id=scenarios["crash"]["container_id"])
        expect(got == 1, f"shmlink_workload_failures_total{{kind=gpu_job_crashed}} of the crash container: {got}")
        expect(sample(m, "shmlink_kmsg_up") == 1, "shmlink_kmsg_up is not 1")
        expect(values.get("SERVE-EXIT") == "0", f"serve exited {values.get('SERVE-EXIT')} on SIGTERM")
        return f"kmsg: {kmsg.strip().splitlines()[0][:160]}; gpu_job_crashed counted 1"
    run("crash-kmsg", crash)

    def oom():
        expect("oom" in scenarios, f"not made: {errors}")
        kmsg = blocks.get("kmsg-oom", "")
        expect("invoked oom-killer" in kmsg and "oom-kill:" in kmsg, f"the VM's kernel log: {kmsg!r}")
        cid = scenarios["oom"]["container_id"]
        m = samples(blocks.get("metrics-after-oom", ""))
        got = sample(m, "shmlink_workload_failures_total", kind="shm_oom_killed", container_id=cid)
        expect(got is not None and got >= 1, f"shm_oom_killed of the oom container: {got}")
        report = json.loads(blocks.get("check-oom", "") or "{}")
        mine = [f for f in report.get("failures", []) if f.get("container_id") == cid]
        expect(mine, f"check --json has no failure of the oom container: {report.get('failures')}")
        f = mine[0]
        mem = f.get("memory") or {}
        expect(f["kind"] == "shm_oom_killed" and mem.get("source") == "kernel_log", f"{f}")
        # cgroup v2's report: memory.max 64 MiB, and its memory.stat's shmem most of it.
        expect(mem.get("limit_bytes") == 64 * MIB, f"limit {mem}")
        expect((mem.get("shm_bytes") or 0) >= 48 * MIB, f"shm {mem}")
        expect(mem.get("anon_bytes") is not None, f"anon {mem}")
        return (f"shm_oom_killed: /dev/shm {mem['shm_bytes'] / MIB:.1f} MiB, anon "
                f"{mem['anon_bytes'] / MIB:.1f} MiB of {mem['limit_bytes'] // MIB} MiB (the v2 report)")
    run("oom-kmsg", oom)

    def oomcount():
        expect("oomcount" in scenarios, f"not made: {errors}")
        events = blocks.get("memory-events", "")
        expect("oom_kill 1" in events or "oom_kill 2" in events, f"memory.events: {events!r}")
        m = samples(blocks.get("metrics-after-oomcount", ""))
        got = sample(m, "shmlink_workload_failures_total", kind="shm_oom_killed",
                     container_id=scenarios["oomcount"]["container_id"])
        expect(got is not None and got >= 1, f"shm_oom_killed from memory.events: {got}")
        return f"memory.events {' '.join(events.split())}; shm_oom_killed counted {int(got)}"
    run("oom-memory-events", oomcount)

    for name in EXPECTED:
        if name not in scenarios and not any(r[0].startswith(name[:6]) for r in results):
            results.append((name, False, "never made"))
    failed = [r for r in results if not r[1]]
    for name, ok, detail in results:
        print(f"vm: {'PASS' if ok else 'FAIL'} {name}: {detail}")
    print(f"vm: booted to init in {values.get('VM-UPTIME-AT-INIT')} s (guest uptime), "
          f"scenarios done at {values.get('VM-UPTIME-AT-END')} s; check --json took "
          f"{values.get('CHECK-SECONDS')} s in the VM")
    for e in errors:
        print(f"vm: VM error: {e}")
    if failed:
        print(f"vm: FAILED {len(failed)} of {len(results)}")
        return 1
    print(f"vm: all {len(results)} passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
