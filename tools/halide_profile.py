#!/usr/bin/env python3
"""Where a CPU kernel's time goes, by Halide Func and by thread count.

    tools/halide_profile.py [--bench build/profile/bench/attn_bench] [--filter REGEX]
                     [--threads 1 2 4 8 16] [--min-time 1] [--out generated/results/profile]

It runs the benchmark worker of a build with Halide's profiler (`cmake -DATTN_PROFILE=ON`:
every CPU kernel, at exit, reports its time per Func and how many threads were busy),
each matching benchmark alone, once per thread count, and collects the report of the
pipeline it timed into profile.json and a table per benchmark (profile.md): time per call,
threads busy, the share spent waiting for parallel tasks to finish, and the Funcs that
take the most. The profiler's sampling costs time itself: read the shares, and compare
speed with bench/compare.py.
"""
import argparse
import json
import pathlib
import platform
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_FILTER = (r"^attention_layer/manual_avx512_(skylake|zen4)(_bf16|_int8)?/"
                  r"(b1_s128_h768_n12|b8_s128_h768_n12_pad)$")
WAITING = "waiting for parallel tasks to finish"
HEADER = re.compile(r"total time: ([\d.]+) ms\s+samples: (\d+)\s+runs: (\d+)\s+time per run: ([\d.]+) ms")
FUNC = re.compile(r"^\s+(.+?):\s+([\d.]+)ms \(\s*([\d.]+)%\)\s+threads: ([\d.]+)")


def reports(text):
    """Halide's profiler reports in a process's output: {pipeline: report}."""
    out, name, current = {}, None, None
    for line in text.splitlines():
        header = HEADER.search(line)
        if header and name:
            total, samples, runs, per_run = header.groups()
            current = out[name] = {"total_ms": float(total), "samples": int(samples), "runs": int(runs),
                                   "ms_per_run": float(per_run), "funcs": {}}
        elif current is not None and line.strip().startswith("average threads used:"):
            current["threads_busy"] = float(line.split(":")[1])
        elif current is not None and (func := FUNC.match(line)):
            current["funcs"][func.group(1)] = {"ms": float(func.group(2)), "percent": float(func.group(3)),
                                               "threads": float(func.group(4))}
        elif line and not line.startswith(" "):
            name, current = line.strip(), None
    return out


def profile(bench, name, threads, min_time):
    """The report of the pipeline `name` timed (the one that ran longest in its process), or
    why there is none: the benchmark was skipped (a variant this CPU cannot run) or failed."""
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        command = [bench, f"--threads={threads}", f"--benchmark_filter=^{re.escape(name)}$",
                   f"--benchmark_min_time={min_time}", f"--benchmark_out={result.name}", "--benchmark_out_format=json"]
        run = subprocess.run(command, capture_output=True, text=True)
        try:
            timed = json.loads(pathlib.Path(result.name).read_text()).get("benchmarks", [])
        except (json.JSONDecodeError, OSError):
            timed = []
    skipped = [b.get("error_message", "skipped") for b in timed if b.get("error_occurred") or b.get("skipped")]
    if run.returncode != 0 or skipped or not timed:
        return {"skipped": (skipped or [f"exit {run.returncode}: {run.stderr.strip()[-300:]}"])[0]}
    found = reports(run.stdout + "\n" + run.stderr)
    if not found:
        raise SystemExit(f"profile: {name} printed no Halide profiler report: is {bench} built with "
                         "-DATTN_PROFILE=ON?")
    pipeline = max(found, key=lambda p: found[p]["total_ms"])
    return dict(found[pipeline], pipeline=pipeline)


def table(name, by_threads, top):
    """One benchmark: the summary rows, then its `top` Funcs (by share at the most threads)."""
    counts = sorted(by_threads)
    most = by_threads[counts[-1]]["funcs"]
    funcs = [f for f in sorted(most, key=lambda f: -most[f]["percent"]) if f != WAITING][:top]
    one = by_threads[counts[0]]["ms_per_run"] * counts[0]
    rows = [f"### {name}", "", "| | " + " | ".join(f"{n} thread{'s' if n > 1 else ''}" for n in counts) + " |",
            "|---|" + "---|" * len(counts),
            "| ms per call (profiled) | " + " | ".join(f"{by_threads[n]['ms_per_run']:.3f}" for n in counts) + " |",
            f"| efficiency vs {counts[0]} thread{'s' if counts[0] > 1 else ''} | " +
            " | ".join(f"{one / (by_threads[n]['ms_per_run'] * n):.2f}" for n in counts) + " |",
            "| threads busy, average | " + " | ".join(f"{by_threads[n].get('threads_busy', 0):.2f}" for n in counts)
            + " |",
            f"| {WAITING}, % | " +
            " | ".join(f"{by_threads[n]['funcs'].get(WAITING, {}).get('percent', 0):.1f}" for n in counts) + " |"]
    for f in funcs:
        rows.append(f"| `{f}`, % | " +
                    " | ".join(f"{by_threads[n]['funcs'].get(f, {}).get('percent', 0):.1f}" for n in counts) + " |")
    return rows + [""]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default=str(ROOT / "build/profile/bench/attn_bench"))
    parser.add_argument("--filter", default=DEFAULT_FILTER, help="a regex over the benchmarks' names")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds each benchmark runs")
    parser.add_argument("--top", type=int, default=12, help="Funcs listed per benchmark")
    parser.add_argument("--out", default=str(ROOT / "generated/results/profile"))
    args = parser.parse_args()
    listed = subprocess.run([args.bench, "--benchmark_list_tests"], capture_output=True, text=True, check=True)
    names = [n for n in listed.stdout.split() if re.search(args.filter, n)]
    if not names:
        raise SystemExit(f"profile: no benchmark of {args.bench} matches {args.filter}")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cpu = next((line.split(":", 1)[1].strip() for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    context = {"cpu_model": cpu, "command": " ".join(sys.argv), "bench": args.bench}
    results, skipped = {}, {}
    for name in names:
        for threads in args.threads:
            r = profile(args.bench, name, threads, args.min_time)
            if "skipped" in r:
                skipped[name] = r["skipped"]
                print(f"profile: {name}: skipped ({r['skipped']})", file=sys.stderr)
                break
            results.setdefault(name, {})[threads] = r
            print(f"profile: {name}, {threads} threads: {r['ms_per_run']:.3f} ms per call, "
                  f"{r.get('threads_busy', 0):.2f} threads busy", file=sys.stderr)
            write(out, context, results, skipped, args.top)  # as they come: a step cut short keeps them
    write(out, context, results, skipped, args.top)
    print(f"profile: wrote {out / 'profile.md'} and profile.json", file=sys.stderr)


def write(out, context, results, skipped, top):
    (out / "profile.json").write_text(json.dumps({"context": context, "results": results, "skipped": skipped},
                                                 indent=1) + "\n")
    lines = ["# Where the time goes, by Halide Func", "",
             f"CPU: {context['cpu_model']}. `{context['command']}`: each benchmark alone in its process, once per "
             "thread count, with Halide's profiler in every kernel (cmake -DATTN_PROFILE=ON); the shares are "
             "of the profiled call's time, which the profiler's sampling lengthens: compare speed with "
             "bench/compare.py.", ""]
    for name, by_threads in results.items():
        lines += table(name, by_threads, top)
    lines += [f"Skipped: `{name}`: {why}" for name, why in skipped.items()]
    (out / "profile.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
