#!/usr/bin/env python3
"""Turns the containers suite's results (bench/run.sh containers; JSON lines) into Markdown
tables.

    bench/containers/report.py target/bench/results.jsonl         # prints the tables
    bench/containers/report.py target/bench/results.jsonl --write BENCHMARKS.md
        # replaces the block between <!-- bench:begin --> and <!-- bench:end -->
        # (the prose around it stays)
"""
import json
import sys

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def ms(us):
    return f"{us / 1e3:.2f}" if us < 100e3 else f"{us / 1e3:.0f}"


def spread(s):
    """median (min-max) in ms."""
    return f"{ms(s['median'])} ({ms(s['min'])}-{ms(s['max'])})"


def ratio(a, b):
    return f"{a['median'] / b['median']:.2f}x"


def fit(points):
    """Least squares y = a + b x; returns (a, b, r2)."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for _, y in points)
    ss_res = sum((y - a - b * x) ** 2 for x, y in points)
    return a, b, 1 - ss_res / ss_tot if ss_tot else 1.0


def report(rows):
    by = {}
    for r in rows:
        by.setdefault(r["mode"], []).append(r)
    m = by.get("machine", [{}])[0]
    after = by.get("load_after", [{}])[0].get("load")
    out = []
    w = out.append
    load = ", ".join(f"{x:.2f}" for x in m.get("load", []))
    load_after = ", ".join(f"{x:.2f}" for x in after) if after else "?"
    w(f"Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('mem_gib')} GiB, Linux {m.get('kernel')}; "
      f"{m.get('rustc')}, {m.get('profile')} build; {m.get('runc')}; "
      f"prometheus-node-exporter {(m.get('node_exporter') or 'not installed').split(' (')[0].replace('node_exporter, version ', '')}.  ")
    w(f"Load average (1, 5, 15 min) at the start: {load}; at the end: {load_after}.  ")
    w(f"Run: `bench/run.sh containers --sizes \"{m.get('sizes')}\" --reps {m.get('reps')} --serve-seconds {m.get('serve_seconds')}`"
      f" (serve at `--interval {m.get('interval')}`). Times in ms: median (min-max) of the repetitions.")
    w("")

    shm = {r["containers"]: r for r in by.get("shm", []) if "label" not in r}
    shm_baseline = {r["containers"]: r for r in by.get("shm", []) if r.get("label") == "baseline"}
    diy = {r["containers"]: r for r in by.get("diy", [])}
    if shm:
        w("### One shm scan")
        w("")
        w("| containers | shmlink, serve (warm) | CPU | shmlink, check (cold) | CPU | floor | CPU "
          "| warm / floor | cold / floor | DIY loop | DIY / shmlink warm |")
        w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n in sorted(shm):
            r = shm[n]
            d = diy.get(n)
            diy_cells = (f"{spread(d['wall'])} | {d['wall']['median'] / r['warm']['wall']['median']:.0f}x"
                         if d else "- | -")
            w(f"| {n} | {spread(r['warm']['wall'])} | {ms(r['warm']['cpu']['median'])} "
              f"| {spread(r['cold']['wall'])} | {ms(r['cold']['cpu']['median'])} "
              f"| {spread(r['floor']['wall'])} | {ms(r['floor']['cpu']['median'])} "
              f"| {ratio(r['warm']['wall'], r['floor']['wall'])} | {ratio(r['cold']['wall'], r['floor']['wall'])} "
              f"| {diy_cells} |")
            b = shm_baseline.get(n)
            if b:
                w(f"| {n} (baseline) | {spread(b['warm']['wall'])} | {ms(b['warm']['cpu']['median'])} "
                  f"| {spread(b['cold']['wall'])} | {ms(b['cold']['cpu']['median'])} "
                  f"| {spread(b['floor']['wall'])} | {ms(b['floor']['cpu']['median'])} "
                  f"| {ratio(b['warm']['wall'], b['floor']['wall'])} | {ratio(b['cold']['wall'], b['floor']['wall'])} | - | - |")
        w("")
        w("Per container (wall, median / N) and a least-squares line over N:")
        w("")
        w("| | " + " | ".join(f"N={n}" for n in sorted(shm)) + " | fit: fixed + per container | R² |")
        w("|---|" + "---:|" * len(shm) + "---:|---:|")
        series = [("shmlink warm", lambda n: shm[n]["warm"]["wall"]["median"]),
                  ("shmlink cold", lambda n: shm[n]["cold"]["wall"]["median"]),
                  ("floor", lambda n: shm[n]["floor"]["wall"]["median"])]
        if diy:
            series.append(("DIY loop", lambda n: diy[n]["wall"]["median"] if n in diy else None))
        for name, f in series:
            ns = [n for n in sorted(shm) if f(n) is not None]
            cells = [f"{f(n) / n:.1f} µs" if f(n) is not None else "-" for n in sorted(shm)]
            line = fit([(n, f(n)) for n in ns])
            fitted = f"{line[0] / 1e3:.2f} ms + {line[1]:.1f} µs × N" if line else "-"
            r2 = f"{line[2]:.4f}" if line else "-"
            w(f"| {name} | " + " | ".join(cells) + f" | {fitted} | {r2} |")
        w("")

    side = {r["containers"]: r for r in by.get("floor_side", [])}
    if side:
        w("### Against the floor as a process (`floor.c`), side by side")
        w("")
        w("CPU is user + system time (the floor's and `check`'s from wait4, `serve`'s of its `scan` and "
          "`shm-open` threads per scan); wall in brackets. `check --json` with the failure sources off; "
          "`serve` scanned every interval while the floor ran in the same window.")
        w("")
        w("| containers | build | floor process, CPU (wall) | `check` process, CPU (wall) | check / floor | "
          "`serve` scan, CPU (wall) | floor in the same window, CPU (wall) | serve / floor | `serve` RSS (peak) MiB |")
        w("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for n in sorted(side):
            r = side[n]
            f, sf = r["floor"], r["serve"]["floor"]
            for label in r["labels"]:
                c, sv = r["check"][label], r["serve"][label]
                w(f"| {n} | {label} | {f['cpu']['median']:.1f} ({f['wall']['median']:.0f}) "
                  f"| {c['cpu']['median']:.1f} ({c['wall']['median']:.0f}) "
                  f"| {c['cpu']['median'] / f['cpu']['median']:.2f}x "
                  f"| {sv['scan_cpu_ms']:.1f} ({sv['mean_scan_ms']:.0f}) "
                  f"| {sf['cpu']['median']:.1f} ({sf['wall']['median']:.0f}) "
                  f"| {sv['scan_cpu_ms'] / sf['cpu']['median']:.2f}x "
                  f"| {sv['rss_mib']:.1f} ({sv['hwm_mib']:.1f}) |")
        w("")

    metrics = by.get("metrics", [])
    if metrics:
        w("### `/metrics` encoding (containers + the 8-GPU NVSwitch fake)")
        w("")
        w("| containers | GPUs | series | bytes | encode (ms) | CPU (ms) |")
        w("|---:|---:|---:|---:|---:|---:|")
        for r in sorted(metrics, key=lambda r: r["containers"]):
            w(f"| {r['containers']} | {r['gpus']} | {r['series']} | {r['bytes']} | {spread(r['wall'])} "
              f"| {ms(r['cpu']['median'])} |")
        w("")

    serve = by.get("serve", [])
    if serve:
        w(f"### `shmlink serve --kube off --no-gpu` beside `prometheus-node-exporter` (defaults), both scraped every interval")
        w("")
        w("| containers | seconds | scans | mean shm scan (ms) | shmlink RSS (peak) MiB | shmlink CPU | shmlink scrape (ms) "
          "| node_exporter RSS (peak) MiB | node_exporter CPU | node_exporter scrape (ms) |")
        w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in sorted(serve, key=lambda r: r["containers"]):
            s, ne = r["shmlink"], r.get("node_exporter")
            ne_cells = (f"{ne['rss_mib']:.1f} ({ne['hwm_mib']:.1f}) | {ne['cpu_pct']:.2f}% | {ne['scrape_ms_median']:.1f}"
                        if ne else "- | - | -")
            w(f"| {r['containers']} | {r['seconds']:.0f} | {r['scans']} | {r['mean_scan_ms']:.1f} "
              f"| {s['rss_mib']:.1f} ({s['hwm_mib']:.1f}) | {s['cpu_pct']:.2f}% | {s['scrape_ms_median']:.1f} | {ne_cells} |")
        w("")

    gpu = by.get("gpu", [])
    if gpu:
        g = gpu[0]
        w("### GPU: one scan of the fake nvswitch-8 board")
        w("")
        w(f"{g['gpus']} GPUs, {g['links']} NVLinks: {g['nvml_calls']} NVML calls per scan "
          f"(the fake's `fakeNvmlCallCount`; shmlink's own count {g['nvml_calls_counted_by_shmlink']}), "
          f"{spread(g['wall'])} ms wall, {ms(g['cpu']['median'])} ms CPU.")
        w("")

    # The targets, against the largest N measured (or the N a target names).
    w("### Targets")
    w("")
    w("| target | measured | met |")
    w("|---|---|---|")
    if shm:
        big = max(shm)
        r = shm[big]
        wr = r["warm"]["wall"]["median"] / r["floor"]["wall"]["median"]
        cr = r["cold"]["wall"]["median"] / r["floor"]["wall"]["median"]
        w(f"| scan of {big} containers within 1.5x of the floor | serve (warm) {wr:.2f}x, check (cold) {cr:.2f}x "
          f"| {'yes' if wr <= 1.5 else 'no'} (warm), {'yes' if cr <= 1.5 else 'no'} (cold) |")
        if big in diy:
            dr = diy[big]["wall"]["median"] / r["warm"]["wall"]["median"]
            dc = diy[big]["wall"]["median"] / r["cold"]["wall"]["median"]
            w(f"| ≥100x faster than the DIY loop at {big} | {dr:.0f}x (warm), {dc:.0f}x (cold) | {'yes' if min(dr, dc) >= 100 else 'no'} |")
        line = fit([(n, shm[n]["warm"]["wall"]["median"]) for n in sorted(shm)])
        if line:
            w(f"| scan cost linear in containers | R² = {line[2]:.4f}, {line[1]:.1f} µs per container | "
              f"{'yes' if line[2] >= 0.98 else 'no'} |")
    if side:
        big = max(side)
        r = side[big]
        label = "this" if "this" in r["labels"] else r["labels"][0]
        c, sv = r["check"][label], r["serve"][label]
        cr = c["cpu"]["median"] / r["floor"]["cpu"]["median"]
        sr = sv["scan_cpu_ms"] / r["serve"]["floor"]["cpu"]["median"]
        w(f"| `check` process at {big} containers at most 2x the floor process (CPU) | {cr:.2f}x | {'yes' if cr <= 2 else 'no'} |")
        w(f"| `serve`'s scan at {big} containers at most 0.8x the floor process (CPU) | {sr:.2f}x | {'yes' if sr <= 0.8 else 'no'} |")
        w(f"| `serve` RSS at most 16 MiB with {big} containers | {sv['rss_mib']:.1f} MiB | {'yes' if sv['rss_mib'] <= 16 else 'no'} |")
    if metrics:
        big = max(metrics, key=lambda r: r["containers"])
        e = big["wall"]["median"] / 1e3
        w(f"| /metrics for {big['containers']} containers encoded in < 5 ms | {e:.2f} ms | {'yes' if e < 5 else 'no'} |")
    if serve:
        big = max(serve, key=lambda r: r["containers"])
        s, ne = big["shmlink"], big.get("node_exporter")
        ok = s["rss_mib"] < 20 and (ne is None or s["rss_mib"] <= ne["rss_mib"])
        w(f"| serve RSS < 20 MiB with {big['containers']} containers and ≤ node_exporter's | {s['rss_mib']:.1f} MiB "
          f"(node_exporter {ne['rss_mib']:.1f} MiB) | {'yes' if ok else 'no'} |" if ne else
          f"| serve RSS < 20 MiB with {big['containers']} containers | {s['rss_mib']:.1f} MiB | {'yes' if ok else 'no'} |")
        at500 = [r for r in serve if r["containers"] >= 500]
        if at500:
            r500 = min(at500, key=lambda r: r["containers"])
            pct = r500["shmlink"]["cpu_pct"]
            w(f"| CPU < 1% of one core at {r500['interval']} with {r500['containers']} containers | {pct:.2f}% "
              f"| {'yes' if pct < 1 else 'no'} |")
    w("")
    return "\n".join(out)


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    text = report(rows)
    if len(sys.argv) > 3 and sys.argv[2] == "--write":
        path = sys.argv[3]
        try:
            doc = open(path).read()
        except FileNotFoundError:
            doc = f"# Benchmarks\n\n{BEGIN}\n{END}\n"
        if BEGIN not in doc or END not in doc:
            doc += f"\n{BEGIN}\n{END}\n"
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        open(path, "w").write(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    else:
        print(text)


if __name__ == "__main__":
    main()
