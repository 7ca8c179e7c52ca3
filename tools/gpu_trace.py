#!/usr/bin/env python3
"""Per-call figures from CUPTI traces (bench/kernel_trace.cpp), one attn_bench case per trace:
where a CUDA call's time goes, kernel by kernel, and what the host does around the kernels.

    python3 tools/gpu_trace.py DIR     # DIR/<case>.jsonl and DIR/<case>.bench.json -> DIR/trace.{md,json}

tools/gpu_machine.sh trace writes DIR on a GPU machine. A case's calls are told apart by its
first kernel (every call launches the same kernels in the same order); the first call (its
modules compiled by the driver's JIT) is left out, with every host record before its end.
Per call, medians over the calls:
- wall: Google Benchmark's time per call (the case's own, synchronized);
- span: first kernel's start to last kernel's end; busy: the kernels' durations summed;
  so wall - span is the host's time around the kernels, span - busy the GPU's idle time
  between them;
- each kernel's duration, launch shape, registers and shared memory;
- the driver API calls made on the host (count and time per call), and the copies.
Standard library only: the GPU machine has no NumPy of ours.
"""
import argparse
import collections
import json
import pathlib
import statistics
import sys

# CUpti_ActivityMemcpyKind
COPY_KINDS = {1: "host to device", 2: "device to host", 8: "device to device", 10: "peer to peer"}


def read_records(path):
    records, dropped = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if r["kind"] == "dropped":
            dropped += r["records"]
        else:
            records.append(r)
    return records, dropped


def bench_time_us(path):
    """Google Benchmark's real time per call of the case's one benchmark, in µs (None: no file)."""
    if not path.exists():
        return None
    runs = [b for b in json.loads(path.read_text()).get("benchmarks", []) if b.get("run_type", "iteration") == "iteration"]
    if not runs:
        return None
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
    return runs[-1]["real_time"] * scale[runs[-1].get("time_unit", "ns")]


def bench_error(path):
    """The benchmark's own error (a case that cannot run there), or None."""
    if not path.exists():
        return None
    for b in json.loads(path.read_text()).get("benchmarks", []):
        if b.get("error_occurred"):
            return b.get("error_message", "an error")
    return None


def split_calls(kernels):
    """The kernels (sorted by start) in calls: a call starts at each launch of the first kernel."""
    if not kernels:
        return []
    first = kernels[0]["name"]
    calls = []
    for k in kernels:
        if k["name"] == first or not calls:
            calls.append([])
        calls[-1].append(k)
    return calls


def summarize(case, records, dropped, wall_us):
    kernels = sorted((r for r in records if r["kind"] == "kernel"), key=lambda r: r["start"])
    calls = split_calls(kernels)
    result = {"case": case, "dropped_records": dropped, "wall_us": wall_us, "calls": max(len(calls) - 1, 0)}
    if len(calls) < 2:
        result["error"] = f"{len(calls)} call(s) traced: at least 2 are needed (the first is left out)"
        return result
    warm_end = max(k["end"] for k in calls[0])
    timed = calls[1:]
    n = len(timed)
    order = [k["name"] for k in timed[0]]
    spans = [(max(k["end"] for k in c) - min(k["start"] for k in c)) / 1e3 for c in timed]
    busy = [sum(k["end"] - k["start"] for k in c) / 1e3 for c in timed]
    by_name = collections.defaultdict(list)
    for c in timed:
        for k in c:
            by_name[k["name"]].append(k)
    rows = []
    for name in sorted(by_name, key=lambda x: order.index(x) if x in order else len(order)):
        ks = by_name[name]
        durations = [(k["end"] - k["start"]) / 1e3 for k in ks]
        last = ks[-1]
        rows.append({
            "kernel": name,
            "launches_per_call": len(ks) / n,
            "median_us": statistics.median(durations),
            "per_call_us": sum(durations) / n,
            "grid": last["grid"], "block": last["block"], "registers": last["registers"],
            "shared_bytes": last["static_shared"] + last["dynamic_shared"],
        })
    total = sum(r["per_call_us"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["per_call_us"] / total
    # Host records after the first call: per name, count and time per call.
    driver = collections.defaultdict(list)
    copies = collections.defaultdict(list)
    for r in records:
        if r["start"] < warm_end:
            continue
        if r["kind"] == "driver":
            driver[r["name"]].append((r["end"] - r["start"]) / 1e3)
        elif r["kind"] in ("memcpy", "memset"):
            kind = COPY_KINDS.get(r.get("copy_kind"), f"kind {r.get('copy_kind')}") if r["kind"] == "memcpy" else "memset"
            copies[kind].append((r["bytes"], (r["end"] - r["start"]) / 1e3))
    result.update({
        "kernels_per_call": len(order),
        "span_us": statistics.median(spans),
        "busy_us": statistics.median(busy),
        "kernels": rows,
        "driver": sorted(({"call": name, "per_layer_call": len(t) / n, "median_us": statistics.median(t),
                           "per_call_us": sum(t) / n} for name, t in driver.items()),
                         key=lambda d: -d["per_call_us"]),
        "copies": [{"kind": kind, "per_call": len(c) / n, "bytes_per_call": sum(b for b, _ in c) / n,
                    "per_call_us": sum(t for _, t in c) / n} for kind, c in sorted(copies.items())],
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
             "between them.", "",
             "| case | calls | kernels | wall µs | span µs | busy µs | host µs (wall - span) | idle µs (span - busy) |",
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
        if r["dropped_records"]:
            lines += [f"CUPTI dropped {r['dropped_records']} records: the figures below miss some.", ""]
        lines += ["| kernel | per call | median µs | share | grid | block | registers | shared B |",
                  "|---|---:|---:|---:|---|---|---:|---:|"]
        for k in r["kernels"]:
            lines.append(f"| `{k['kernel']}` | {k['launches_per_call']:g} | {k['median_us']:.1f} | {k['share']:.0%} | "
                         f"{'x'.join(map(str, k['grid']))} | {'x'.join(map(str, k['block']))} | {k['registers']} | "
                         f"{k['shared_bytes']} |")
        if r["driver"]:
            lines += ["", "| driver call (host) | per layer call | median µs | µs per call |", "|---|---:|---:|---:|"]
            for d in r["driver"][:12]:
                lines.append(f"| {d['call']} | {d['per_layer_call']:g} | {d['median_us']:.1f} | {d['per_call_us']:.1f} |")
        if r["copies"]:
            lines += ["", "| copy | per call | bytes per call | µs per call |", "|---|---:|---:|---:|"]
            for c in r["copies"]:
                lines.append(f"| {c['kind']} | {c['per_call']:g} | {c['bytes_per_call']:.0f} | {c['per_call_us']:.1f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=pathlib.Path, help="the traces: <case>.jsonl beside <case>.bench.json")
    args = parser.parse_args()
    # Every case run (a trace, a benchmark's output or a log): one without a trace is reported.
    cases = sorted({p.name.split(".")[0] for p in args.dir.glob("*") if p.suffix in (".jsonl", ".json", ".log")}
                   - {"trace"})
    if not cases:
        sys.exit(f"gpu_trace: no case in {args.dir}")
    results = []
    for case in cases:
        trace, wall = args.dir / f"{case}.jsonl", bench_time_us(args.dir / f"{case}.bench.json")
        error = bench_error(args.dir / f"{case}.bench.json")
        if error or not trace.exists():
            results.append({"case": case.replace("__", "/"), "calls": 0, "wall_us": wall,
                            "error": f"the case failed: {error}" if error else
                            f"no trace: the tracer did not run (see {case}.log)"})
            continue
        records, dropped = read_records(trace)
        results.append(summarize(case.replace("__", "/"), records, dropped, wall))
    (args.dir / "trace.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.dir / "trace.md").write_text(markdown(results, args.dir))
    for r in results:
        print(f"{r['case']}: " + (r["error"] if "error" in r else
                                  f"{r['calls']} calls, {r['kernels_per_call']} kernels, span {r['span_us']:.1f} µs, "
                                  f"busy {r['busy_us']:.1f} µs, wall {fmt(r['wall_us'])} µs"))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
