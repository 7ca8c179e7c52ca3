#!/usr/bin/env python3
"""Per-call figures from CUPTI traces (bench/kernel_trace.cpp), one attn_bench case per trace:
where a CUDA call's time goes, kernel by kernel, and what the host does around the kernels.

    python3 tools/gpu_trace.py DIR     # DIR/<case>.jsonl[.xz] and DIR/<case>.bench.json -> DIR/trace.{md,json}

tools/gpu_machine.sh trace writes DIR on a GPU machine.

Calls: every call of a case launches the same kernels in the same order, so the kernels'
names repeat with the call's period (found over the trace's second half: a warm-up or a
stray launch may come first); a call starts at the kernel that follows the GPU's longest
idle gap within that period (the benchmark synchronizes between calls). The first whole
call (its modules compiled by the driver's JIT) is left out, and so is any stretch whose
names differ (counted). Per call, medians over the calls:
- wall: Google Benchmark's time per call (the case's own, synchronized);
- span: first kernel's start to last kernel's end; busy: the kernels' durations summed;
  so wall - span is the host's time around the kernels, span - busy the GPU's idle time
  between them;
- each kernel's duration, launch shape, registers and shared memory;
- the host's driver calls and the copies, counted per window from one call's first launch
  to the next call's (records tied to their launching call by CUPTI's correlation id): the
  median count and time per window, so that the benchmark's own setup between its runs
  (uploads, checks) does not count.
Records with no timestamps (CUPTI may deliver some) and unreadable lines are counted and
left out. Standard library only: the GPU machine has no NumPy of ours.
"""
import argparse
import bisect
import collections
import json
import lzma
import pathlib
import statistics
import sys

# CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind
COPY_KINDS = {1: "host to device", 2: "device to host", 8: "device to device", 10: "peer to peer"}
MEMORY_KINDS = {1: "pageable", 2: "pinned", 3: "device"}


def read_records(path):
    """(records, dropped by CUPTI, unreadable lines) of a .jsonl or .jsonl.xz trace."""
    opener = lzma.open if path.suffix == ".xz" else open
    records, dropped, unreadable = [], 0, 0
    with opener(path, "rt") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:  # a process killed mid-line
                unreadable += 1
                continue
            if r.get("kind") == "dropped":
                dropped += r["records"]
            else:
                records.append(r)
    return records, dropped, unreadable


def bench_runs(path):
    """Google Benchmark's iteration runs of the case, or (None, why) when unreadable."""
    if not path.exists():
        return [], None
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        return None, f"{path.name} unreadable ({e})"
    return [b for b in doc.get("benchmarks", []) if b.get("run_type", "iteration") == "iteration"], None


def wall_us(runs):
    runs = [b for b in runs or [] if "real_time" in b]  # (a failed run has none)
    if not runs:
        return None
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
    return runs[-1]["real_time"] * scale[runs[-1].get("time_unit", "ns")]


def bench_error(runs):
    for b in runs or []:
        if b.get("error_occurred"):
            return b.get("error_message", "an error")
    return None


def split_calls(kernels):
    """(calls, irregular stretches, error): the kernels (sorted by start) cut into calls."""
    names, n = [k["name"] for k in kernels], len(kernels)
    period = next((p for p in range(1, n // 2 + 1) if all(names[i] == names[i - p] for i in range(n // 2, n))),
                  None)
    if period is None:
        return [], 0, f"{n} kernels with no repeating sequence: fewer than 2 calls, or calls that differ"
    # The call's first kernel: the one after the longest idle gap, by position in the period.
    gaps = collections.defaultdict(list)
    for i in range(max(1, n // 2), n):
        gaps[i % period].append(kernels[i]["start"] - kernels[i - 1]["end"])
    offset = max(gaps, key=lambda j: statistics.median(gaps[j])) if period > 1 else 0
    first = next(i for i in range(n // 2, n) if i % period == offset)
    sequence = names[first:first + period]
    calls, irregular = [], 0
    for start in range(offset, n - period + 1, period):
        if names[start:start + period] == sequence:
            calls.append(kernels[start:start + period])
        else:
            irregular += 1
    return calls, irregular, None


def summarize(case, records, dropped, unreadable, wall):
    kernels = [r for r in records if r["kind"] == "kernel"]
    valid = sorted((k for k in kernels if k["start"] > 0 and k["end"] >= k["start"]), key=lambda r: r["start"])
    result = {"case": case, "dropped_records": dropped, "unreadable_lines": unreadable,
              "kernels_without_timestamps": len(kernels) - len(valid), "wall_us": wall, "calls": 0}
    calls, irregular, error = split_calls(valid)
    result["irregular_stretches"] = irregular
    if error or len(calls) < 2:
        result["error"] = error or f"{len(calls)} call(s) traced: at least 2 are needed (the first is left out)"
        return result
    timed = calls[1:]
    n = len(timed)
    order = [k["name"] for k in timed[0]]
    spans = [(max(k["end"] for k in c) - min(k["start"] for k in c)) / 1e3 for c in timed]
    busy = [sum(k["end"] - k["start"] for k in c) / 1e3 for c in timed]
    rows = []
    for position, name in enumerate(order):
        ks = [c[position] for c in timed]
        durations = [(k["end"] - k["start"]) / 1e3 for k in ks]
        rows.append({"kernel": name, "median_us": statistics.median(durations),
                     "grid": ks[-1]["grid"], "block": ks[-1]["block"], "registers": ks[-1]["registers"],
                     "shared_bytes": ks[-1]["static_shared"] + ks[-1]["dynamic_shared"]})
    total = sum(r["median_us"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["median_us"] / total
    # Host windows: from each timed call's first launch to the next call's (the last call has none).
    launched = {r["correlation"]: r["start"] for r in records if r["kind"] == "driver" and "correlation" in r}
    starts = [launched.get(c[0].get("correlation"), c[0]["start"]) for c in timed]
    windows = list(zip(starts, starts[1:]))
    driver = collections.defaultdict(lambda: [[0, 0.0] for _ in windows])
    copies = collections.defaultdict(lambda: [[0, 0, 0.0] for _ in windows])

    # Calls' first launches come in order; a call whose launch went unrecorded has its kernel's
    # GPU start instead, which could break the order: then each window is tried in turn.
    in_order = all(a <= b for a, b in windows)

    def window_of(t):
        if in_order:  # consecutive windows: the one from the last start at or before t
            w = bisect.bisect_right(starts, t) - 1
            return w if 0 <= w < len(windows) else None
        return next((w for w, (a, b) in enumerate(windows) if a <= t < b), None)
    for r in records:
        if r["kind"] == "driver":
            w = window_of(r["start"])
            if w is not None:
                driver[r["name"]][w][0] += 1
                driver[r["name"]][w][1] += (r["end"] - r["start"]) / 1e3
        elif r["kind"] in ("memcpy", "memset"):
            w = window_of(launched.get(r.get("correlation"), r["start"]))
            if w is None:
                continue
            if r["kind"] == "memset":
                kind = "memset"
            else:
                kind = COPY_KINDS.get(r.get("copy_kind"), f"kind {r.get('copy_kind')}")
                if "src_kind" in r:
                    kind += (f" ({MEMORY_KINDS.get(r['src_kind'], r['src_kind'])} to "
                             f"{MEMORY_KINDS.get(r['dst_kind'], r['dst_kind'])}"
                             f"{', async' if r.get('async') else ''})")
            copies[kind][w][0] += 1
            copies[kind][w][1] += r["bytes"]
            copies[kind][w][2] += (r["end"] - r["start"]) / 1e3
    median = statistics.median
    result.update({
        "calls": n, "kernels_per_call": len(order), "host_windows": len(windows),
        "span_us": median(spans), "busy_us": median(busy), "kernels": rows,
        "driver": sorted(({"call": name, "per_layer_call": median(c for c, _ in per),
                           "per_call_us": median(t for _, t in per)} for name, per in driver.items()),
                         key=lambda d: -d["per_call_us"]),
        "copies": [{"kind": kind, "per_call": median(c for c, _, _ in per), "bytes_per_call": median(b for _, b, _ in per),
                    "per_call_us": median(t for _, _, t in per)} for kind, per in sorted(copies.items())],
    })
    return result


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(results, source):
    lines = ["# CUDA calls traced kernel by kernel", "",
             f"Written by `python3 tools/gpu_trace.py {source}` from CUPTI traces (bench/kernel_trace.cpp, "
             "`tools/gpu_machine.sh trace`); never edit it by hand. Medians over each case's calls but the first. "
             "wall: the benchmark's time per call; span: the first kernel's start to the last one's end; busy: the "
             "kernels' durations summed. wall - span is host time around the kernels, span - busy the GPU idle "
             "between them. Driver calls and copies: medians per window from one call's first launch to the next's.",
             "", "| case | calls | kernels | wall µs | span µs | busy µs | host µs (wall - span) | idle µs (span - busy) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['calls']} | - | {fmt(r['wall_us'])} | - | - | - | - |")
            continue
        host = None if r["wall_us"] is None else r["wall_us"] - r["span_us"]
        lines.append(f"| {r['case']} | {r['calls']} | {r['kernels_per_call']} | {fmt(r['wall_us'])} | "
                     f"{fmt(r['span_us'])} | {fmt(r['busy_us'])} | {fmt(host)} | {fmt(r['span_us'] - r['busy_us'])} |")
    for r in results:
        lines += ["", f"## {r['case']}", ""]
        if "error" in r:
            lines.append(f"Not summarized: {r['error']}.")
            continue
        left_out = [f"{r[key]} {what}" for key, what in
                    (("dropped_records", "records CUPTI dropped"), ("unreadable_lines", "unreadable lines"),
                     ("kernels_without_timestamps", "kernels without timestamps"),
                     ("irregular_stretches", "stretches of kernels unlike the call's")) if r.get(key)]
        if left_out:
            lines += ["Left out: " + ", ".join(left_out) + ".", ""]
        lines += ["| kernel | median µs | share | grid | block | registers | shared B |", "|---|---:|---:|---|---|---:|---:|"]
        for k in r["kernels"]:
            lines.append(f"| `{k['kernel']}` | {k['median_us']:.1f} | {k['share']:.0%} | {'x'.join(map(str, k['grid']))} | "
                         f"{'x'.join(map(str, k['block']))} | {k['registers']} | {k['shared_bytes']} |")
        if r["driver"]:
            lines += ["", f"| driver call (host; {r['host_windows']} windows) | per call | µs per call |", "|---|---:|---:|"]
            for d in r["driver"][:12]:
                lines.append(f"| {d['call']} | {d['per_layer_call']:g} | {d['per_call_us']:.1f} |")
        if r["copies"]:
            lines += ["", "| copy | per call | bytes per call | µs per call |", "|---|---:|---:|---:|"]
            for c in r["copies"]:
                lines.append(f"| {c['kind']} | {c['per_call']:g} | {c['bytes_per_call']:.0f} | {c['per_call_us']:.1f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=pathlib.Path, help="the traces: <case>.jsonl[.xz] beside <case>.bench.json")
    args = parser.parse_args()
    # Every case run (a trace, a benchmark's output or a log): one without a trace is reported.
    cases = sorted({p.name.split(".")[0] for p in args.dir.glob("*") if p.name.endswith((".jsonl", ".jsonl.xz",
                                                                                         ".bench.json", ".log"))})
    if not cases:
        sys.exit(f"gpu_trace: no case in {args.dir}")
    results = []
    for case in cases:
        name = case.replace("__", "/")
        runs, unreadable_bench = bench_runs(args.dir / f"{case}.bench.json")
        traces = [p for p in (args.dir / f"{case}.jsonl", args.dir / f"{case}.jsonl.xz") if p.exists()]
        error = unreadable_bench or (bench_error(runs) and f"the case failed: {bench_error(runs)}")
        if error or not traces:
            results.append({"case": name, "calls": 0, "wall_us": wall_us(runs),
                            "error": error or f"no trace: the tracer did not run (see {case}.log)"})
            continue
        records, dropped, unreadable = read_records(traces[0])
        results.append(summarize(name, records, dropped, unreadable, wall_us(runs)))
    (args.dir / "trace.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.dir / "trace.md").write_text(markdown(results, args.dir))
    for r in results:
        print(f"{r['case']}: " + (r["error"] if "error" in r else
                                  f"{r['calls']} calls, {r['kernels_per_call']} kernels, span {r['span_us']:.1f} µs, "
                                  f"busy {r['busy_us']:.1f} µs, wall {fmt(r['wall_us'])} µs"))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
