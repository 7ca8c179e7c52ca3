#!/usr/bin/env python3
"""The schedule comparison, interleaved: every variant and every peer of a problem timed
in the same rounds, so that they see the same machine.

For each problem and function (the fused layer, then each stage's function alone: all at
short contexts, the projections at every one), every implementation is made ready and
checked against the reference: the variants and the OpenBLAS peers by attn_bench
(--serve, a long-lived worker process this script drives), PyTorch and ONNX Runtime here
(bench/peers.py). Then come --rounds rounds; in each, every implementation runs once for
at least --min-time seconds, after --pause seconds of idle, in an order that rotates by
one from round to round.
A round's times are a paired sample: ratios between implementations are taken per round,
and report.py gives their median with a distribution-free confidence interval.
With --fresh-workers, every round starts new worker processes (and prepares its cases again):
a process's own layout (where its buffers and code fall) can make all of its times a few
percent faster or slower than another's, a difference no round within it varies.

Writes generated/results/comparison.json (every sample), then comparison.md and
comparison.png through report.py.
"""
import argparse
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peers as peer_lib  # noqa: E402
import report  # noqa: E402

# The autoscheduled variants' schedules were made for S=128: at S >= 4096 one call takes
# from seconds to a minute, so by default they are left out there (say so with --exclude '').
DEFAULT_EXCLUDE = r"^[a-z_]+/(mullapudi2016|adams2019|li2018|anderson2021)_[a-z0-9_]+/b\d+_s(4096|8192)_"


class Worker:
    """attn_bench --serve: one JSON answer per command line."""

    def __init__(self, executable, candidates=(), threads=None):
        self.arguments = [executable, "--serve", *(f"--candidate={c}" for c in candidates)]
        if threads:
            self.arguments.append(f"--threads={threads}")
        self.start()

    def start(self):
        self.process = subprocess.Popen(self.arguments, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        bufsize=1)

    def restart(self):
        self.close()
        self.process.stdout.close()
        self.start()

    def ask(self, *words):
        self.process.stdin.write(" ".join(str(w) for w in words) + "\n")
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"compare: attn_bench --serve ended while answering {' '.join(map(str, words))!r}")
        answer = json.loads(line)
        if "error" in answer and "name" not in answer:
            raise SystemExit(f"compare: attn_bench: {answer['error']}")
        return answer

    def close(self):
        self.process.stdin.close()
        self.process.wait()


class WorkerCase:
    """A case of attn_bench: a variant or an OpenBLAS peer, timed in the worker."""

    def __init__(self, worker, case, suffix="", kind=None):
        self.worker, self.name, self.gflop = worker, case["name"], case["gflop"]
        self.impl = case["name"].split("/")[1] + suffix
        # per_sequence_<variant>: a packed problem's sequences through the dense path one at a
        # time, what packing is measured against; neither a variant nor a peer. <variant>_bf16,
        # <variant>_int8: the layer in that precision, compared apart from the fp32 variants
        # (report.py).
        self.kind = kind or ("peer" if self.impl.startswith("openblas") else
                             "baseline" if self.impl.startswith("per_sequence_") else
                             report.precision_of(case["name"].split("/")[1]) or "variant")

    def prepare(self):
        return self.worker.ask("prepare", self.name)

    def time(self, seconds):
        answer = self.worker.ask("time", self.name, seconds)
        return answer["ms"], answer["runs"]


class PythonPeer:
    """A peer of bench/peers.py, timed here the way the worker times its cases."""

    def __init__(self, peer, problem, data, expected, suffix=""):
        self.peer, self.problem, self.data, self.expected = peer, problem, data, expected
        self.impl, self.kind, self.gflop = peer.name + suffix, "peer", peer.gflop(problem)
        self.run = None

    def prepare(self):
        answer = {"name": self.impl, "ok": True, "error": ""}
        self.peer.activate()
        try:
            self.run = self.peer.prepare(self.problem, self.data)
            y = self.peer.output(self.run())
        except Exception as e:  # a peer that cannot run this problem is reported, not timed
            return {**answer, "ok": False, "error": f"{type(e).__name__}: {e}"}
        if self.expected is not None and self.peer.checked:
            error = float(np.max(np.abs(y.astype(np.float64) - self.expected)))
            answer["max_error"] = error
            if not error < self.peer.tolerance:
                return {**answer, "ok": False, "error": f"max error {error:.3g} against the float64 reference"}
        return answer

    def time(self, seconds):
        self.peer.activate()
        runs, start = 0, time.perf_counter()
        while True:
            self.run()
            runs += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return elapsed * 1e3 / runs, runs


def measure_group(impls, rounds, min_time, pause, fresh_workers=()):
    """Checks each implementation, then times the good ones in rotating rounds: their
    results by name, and the order of each round. fresh_workers: the workers to restart
    before every round but the first, the cases of each then prepared again."""
    results, ready, orders = {}, [], []
    for impl in impls:
        answer = impl.prepare()
        entry = {"kind": impl.kind, "gflop": impl.gflop, "ms": [], "runs": []}
        for key in ("max_error", "peak_bytes"):
            if key in answer:
                entry[key] = answer[key]
        if not answer["ok"]:
            entry["error"] = answer["error"]
            print(f"    {impl.impl}: not timed: {answer['error'][:200]}", file=sys.stderr)
        else:
            ready.append(impl)
        results[impl.impl] = entry
    for r in range(rounds):
        if r and fresh_workers and any(isinstance(impl, WorkerCase) for impl in ready):
            for worker in fresh_workers:
                worker.restart()
            for impl in ready:
                if isinstance(impl, WorkerCase) and not impl.prepare()["ok"]:
                    raise SystemExit(f"compare: {impl.name} failed its check in a fresh worker")
        shift = r % max(1, len(ready))
        order = ready[shift:] + ready[:shift]
        orders.append([impl.impl for impl in order])
        for impl in order:
            time.sleep(pause)  # lets the previous implementation's spinning threads go idle (see --pause)
            ms, runs = impl.time(min_time)
            results[impl.impl]["ms"].append(ms)
            results[impl.impl]["runs"].append(runs)
    return results, orders


def thread_counts(text):
    """Counts of at least 1; attn_bench refuses more than the runtime's limit (attn::kMaxThreads)."""
    counts = [int(n) for n in text.split(",")]
    if any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"expected thread counts of at least 1, got {text!r}")
    if len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"expected each thread count once, got {text!r}")
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default="build/release/bench/attn_bench", help="the attn_bench executable")
    parser.add_argument("--out", default="generated/results", help="folder for comparison.json, .md and .png")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per problem and function (at least 5)")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per sample (at least one run)")
    # Worker threads busy-wait after a call (OpenBLAS's for about 2^28 cycles, ONNX Runtime's
    # spin too) and slow whatever runs next. With 0.02 s, the variant that followed ONNX
    # Runtime in every round took 1.04-1.07x the time of its identical twin; with 0.3 s, 0.99.
    parser.add_argument("--pause", type=float, default=0.25, help="seconds of idle before each sample")
    parser.add_argument("--candidate", action="append", default=[], metavar="LIBRARY:SUFFIX:ISA",
                        help="also time a compiled candidate (tools/autotune.py's), as candidate_SUFFIX")
    parser.add_argument("--baseline", metavar="ATTN_BENCH",
                        help="another attn_bench build, e.g. of the commit before a change to the runtime: each of "
                             "its cases runs in the same rounds as this build's, named <implementation>@baseline "
                             "(report.py pairs them: time before / time after)")
    parser.add_argument("--fresh-workers", action="store_true",
                        help="start new attn_bench workers for every round, so that each process's own layout "
                             "varies between rounds rather than weighting all of a build's times (an A/B of "
                             "identical builds, 5 rounds in one pair of processes, came out 0.93-0.96)")
    parser.add_argument("--filter", default=".", help="regex on <function>/<implementation>/<problem>")
    parser.add_argument("--exclude", default=DEFAULT_EXCLUDE, help="regex of cases left out (default: the "
                        "autoscheduled variants at S >= 4096, which take up to a minute per call)")
    parser.add_argument("--device", choices=["cpu", "cuda", "opencl"], default="cpu",
                        help="cpu: the CPU variants, OpenBLAS, PyTorch and ONNX Runtime; cuda: the CUDA variants "
                             "and the PyTorch CUDA peers; opencl: OpenCL candidates alone (tools/gpu_autotune.py "
                             "rehearsing on PoCL)")
    parser.add_argument("--threads", type=thread_counts, default=[os.cpu_count()],
                        help="CPU threads of every implementation: our kernels (attn::set_num_threads), OpenBLAS, "
                             "PyTorch, ONNX Runtime (default: one per core). Several, comma-separated (1,2): the "
                             "worker's cases and the peers at each count, interleaved, named <implementation>@<n>t "
                             "(strong scaling; PyTorch's one pool per process is set to a peer's count before "
                             "each of its samples)")
    parser.add_argument("--no-chart", action="store_true", help="skip comparison.png (needs matplotlib)")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds: at least 5, for a confidence interval of the median")
    selected = re.compile(args.filter)
    excluded = re.compile(args.exclude) if args.exclude else None

    def wanted(name):
        return selected.search(name) and not (excluded and excluded.search(name))

    # One worker per thread count (a CUDA comparison's one, on the default count).
    counts = args.threads if args.device == "cpu" else [None]
    workers = {n: Worker(args.bench, args.candidate, n) for n in counts}
    baselines = {n: Worker(args.baseline, args.candidate, n) for n in counts} if args.baseline else {}
    suffix = {n: f"@{n}t" if len(counts) > 1 else "" for n in counts}
    listing = next(iter(workers.values())).ask("list")
    on_device = re.compile(rf"_{args.device}/" if args.device != "cpu" else r"^(?!.*_(cuda|opencl)/)")
    cases = [c for c in listing["cases"] if on_device.search(c["name"]) and wanted(c["name"])]
    # The Python peers, (peer, suffix) at each thread count like the worker's cases.
    makers = ([(make, "") for make in peer_lib.cuda_peers()] if args.device == "cuda" else
              [(make, suffix[n]) for n in counts for make in peer_lib.cpu_peers(n)] if args.device == "cpu" else [])
    peers, versions, missing = [], {}, set()
    for make, peer_suffix in makers:
        try:
            peer = make()
        except ImportError as e:
            if str(e) not in missing:
                print(f"compare: a peer is not available ({e}); left out", file=sys.stderr)
            missing.add(str(e))
            continue
        peers.append((peer, peer_suffix))
        versions[peer.name] = peer.version

    context = {**listing["context"], "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host_name": platform.node(),
               "python": platform.python_version(), "peers": versions, "rounds": args.rounds,
               "min_time": args.min_time, "pause": args.pause, "fresh_workers": args.fresh_workers, "device": args.device,
               "threads": counts,
               "command": " ".join(sys.argv)}
    problems, groups = [], []
    fresh = [*workers.values(), *baselines.values()] if args.fresh_workers else ()
    started = time.monotonic()
    for p in listing["problems"]:
        by_function = {}
        for c in cases:
            if c["problem"] == p["name"]:
                for n, worker in workers.items():
                    by_function.setdefault(c["function"], []).append(WorkerCase(worker, c, suffix[n]))
                for n, worker in baselines.items():
                    by_function[c["function"]].append(WorkerCase(worker, c, "@baseline" + suffix[n], "baseline"))
        # Each peer beside the worker's cases of its function (the fused layer's peers on
        # every problem the layer runs; the attention core's where attn_bench times the core).
        these_peers = [(peer, peer_suffix) for peer, peer_suffix in peers
                       if wanted(f"{peer.function}/{peer.name}/{p['name']}") and
                       (peer.function == report.LAYER or peer.function in by_function)]
        data = peer_lib.make_inputs(p) if these_peers else None
        expected = {}  # by function: one float64 reference for its peers
        for peer, peer_suffix in these_peers:
            if p["reference_checked"] and peer.checked and peer.function not in expected:
                expected[peer.function] = peer.expected(p, data)
            by_function.setdefault(peer.function, []).append(
                PythonPeer(peer, p, data, expected.get(peer.function), peer_suffix))
        if not by_function:
            continue
        problems.append(p)
        for function, impls in by_function.items():
            print(f"compare: {function}/{p['name']}: {len(impls)} implementations, {args.rounds} rounds "
                  f"({time.monotonic() - started:.0f} s so far)", file=sys.stderr)
            results, orders = measure_group(impls, args.rounds, args.min_time, args.pause, fresh)
            groups.append({"function": function, "problem": p["name"], "impls": results, "orders": orders})
        for worker in [*workers.values(), *baselines.values()]:
            worker.ask("release")
    for worker in [*workers.values(), *baselines.values()]:
        worker.close()

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"context": context, "problems": problems, "groups": groups}
    (out / "comparison.json").write_text(json.dumps(doc, indent=1) + "\n")
    report.write(doc, out / "comparison.md", None if args.no_chart else out / "comparison.png")
    print(f"compare: wrote comparison.json and its report to {out} in {time.monotonic() - started:.0f} s",
          file=sys.stderr)


if __name__ == "__main__":
    main()
