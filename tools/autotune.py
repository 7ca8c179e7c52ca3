#!/usr/bin/env python3
"""Autotuner: searches schedules for one generator and ISA, measures them, freezes the fastest.

The search space for a generator (an AOT function of ATTN_STAGES; the fused layer is
tuned through self_attention and its winner applies to all four fused functions):

  - the hand-written schedule's own parameters (schedules/cpu_manual.h: tile_rows,
    tile_vectors, query_block, context_vectors; only those the function uses);
  - each autoscheduler with parameter sweeps: Mullapudi2016 (parallelism,
    last_level_cache_size, balance), Adams2019 (beam_size, random_dropout with
    several random_dropout_seed, parallelism), Li2018 (parallelism).

The defaults of each (the hand-written schedule as checked in, each autoscheduler as
the frozen variants run it) come first; the rest follow in a seeded random order, so a
run cut short by its budget has still sampled the whole space.

Each candidate is compiled by the project's generator into a shared library
(`-no_runtime`: it binds to the harness's Halide runtime), several at a time with a
timeout each, then measured one at a time by the benchmark harness, attn_bench
--candidate=...: checked against the reference first (DESIGN.md's accuracy rule; a
wrong or refusing candidate is rejected), then timed with repetitions on each problem
of the list. Everything compiled and measured is cached under build/autotune/, keyed
by the sources it depends on, so an interrupted run resumes where it stopped.

The winner (the lowest worst-case time relative to the hand-written default over the
problem list, then the lowest geometric mean) is frozen as schedules/autotuned/<isa>/<function>.json, a
parameter file with the provenance of the search (every candidate and its times,
machine, Halide version, date, budget). The autotuned_<isa> variant is the default on
its ISA, so the winner must run every shape: it is the fastest hand-written parameter
set, and a faster autoscheduled candidate (they refuse shapes smaller than their
tiles) is reported, not frozen. The build reads the parameter files; it needs no search.

    tools/autotune.sh --isa avx2 --function attention_scores --budget-minutes 10
"""
import argparse
import concurrent.futures
import datetime
import hashlib
import importlib.metadata
import itertools
import json
import math
import os
import pathlib
import platform
import random
import re
import subprocess
import sys
import time

from tqdm import tqdm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from freeze_schedules import ROOT, cmake_stages, cmake_targets  # noqa: E402

AUTOTUNED = ROOT / "schedules" / "autotuned"

# The hand-written schedule's parameters each generator uses (schedules/cpu_manual.cpp).
MANUAL_PARAMS = {
    "qkv_projection": ["tile_rows", "tile_vectors"],
    "attention_scores": ["tile_rows", "tile_vectors", "query_block"],
    "masked_softmax": [],
    "weighted_sum": ["tile_rows", "query_block", "context_vectors"],
    "output_layernorm": ["tile_rows", "tile_vectors"],
    "attention_layer": ["tile_rows", "tile_vectors", "query_block", "key_block", "context_vectors"],
}
MANUAL_VALUES = {"query_block": [16, 32, 64, 128], "key_block": [256, 512, 1024], "context_vectors": [1, 2, 4]}
# Register tiles: rows × vectors accumulators, at most 15 of the 16 vector registers.
REGISTER_TILES = [(r, v) for r in range(1, 9) for v in range(1, 7) if 4 <= r * v <= 15]

# Autoscheduler sweeps: (Halide name, {param: values}); the first value is the default
# the frozen variants use (tools/freeze_schedules.py).
AUTOSCHEDULERS = {
    "mullapudi2016": ("Mullapudi2016", {"parallelism": [2, 4, 8, 16],
                                        "last_level_cache_size": [16777216, 4194304, 33554432],
                                        "balance": [40, 10, 80]}),
    "adams2019": ("Adams2019", {"parallelism": [2, 4, 8], "beam_size": [32, 8, 1],
                                "random_dropout": [100, 90, 75], "random_dropout_seed": [0, 1, 2, 3]}),
    "li2018": ("Li2018", {"parallelism": [2, 4, 8, 16]}),
}
# As in freeze_schedules.py: beam 32 exhausts 24 GiB on the fused layer.
FUSED_ADAMS_BEAMS = [1]


def sources_hash():
    """What a compiled candidate depends on: the algorithm, the generators, the schedules."""
    h = hashlib.sha256()
    for path in [p for d in ("generators", "schedules") for p in sorted((ROOT / d).glob("*"))
                 if p.suffix in (".cpp", ".h")]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def manual_defaults():
    """The hand-written schedule's defaults, as declared in schedules/cpu_manual.h (CpuTiling)."""
    text = (ROOT / "schedules" / "cpu_manual.h").read_text()
    tiling = re.search(r"struct CpuTiling \{(.*?)\n\};", text, re.S).group(1)
    return {name: int(value) for name, value in re.findall(r"int (\w+) = (\d+);", tiling)}


def manual_candidates(generator):
    names = MANUAL_PARAMS[generator]
    axes = []
    if "tile_rows" in names and "tile_vectors" in names:
        axes.append([{"tile_rows": r, "tile_vectors": v} for r, v in REGISTER_TILES])
    elif "tile_rows" in names:
        axes.append([{"tile_rows": r} for r in range(1, 9)])
    for name in ("query_block", "key_block", "context_vectors"):
        if name in names:
            axes.append([{name: v} for v in MANUAL_VALUES[name]])
    defaults = manual_defaults()
    default = {k: defaults[k] for k in names}
    out = [default]
    for combo in itertools.product(*axes):
        params = {k: v for part in combo for k, v in part.items()}
        if params != default:
            out.append(params)
    return [("manual", p) for p in out]


def autoscheduler_candidates(source, generator):
    _, sweep = AUTOSCHEDULERS[source]
    sweep = dict(sweep)
    if source == "adams2019" and generator == "attention_layer":
        sweep["beam_size"] = FUSED_ADAMS_BEAMS
    combos = [dict(zip(sweep, values)) for values in itertools.product(*sweep.values())]
    if source == "adams2019":  # seeds only matter with dropout
        combos = [c for c in combos if c["random_dropout"] < 100 or c["random_dropout_seed"] == 0]
    return [(source, c) for c in combos]  # the first is the default


def search_space(generator, seed):
    """The candidates in search order, and the key of each schedule source's default."""
    groups = [manual_candidates(generator)] + [autoscheduler_candidates(s, generator) for s in AUTOSCHEDULERS]
    defaults = [g[0] for g in groups]
    rest = [c for g in groups for c in g[1:]]
    random.Random(seed).shuffle(rest)
    return defaults + rest, {source: candidate_key(source, params) for source, params in defaults}


def candidate_key(source, params):
    text = source + "".join(f"_{k}{v}" for k, v in sorted(params.items()))
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def generator_args(source, params, plugins):
    """Generator arguments for a candidate: the schedule source and its parameters."""
    if source == "manual":
        return ["schedule=manual"] + [f"{k}={v}" for k, v in params.items()]
    name, _ = AUTOSCHEDULERS[source]
    return (["-p", str(plugins / f"libautoschedule_{name.lower()}.so"), f"autoscheduler={name}"] +
            [f"autoscheduler.{k}={v}" for k, v in params.items()])


class Tuner:
    def __init__(self, args):
        self.args = args
        self.generator_exe = pathlib.Path(args.generator)
        self.bench_exe = pathlib.Path(args.bench)
        self.plugins = pathlib.Path(args.plugins)
        stages = {name: (gen, params) for name, gen, params in cmake_stages()}
        if args.function not in stages:
            sys.exit(f"unknown function {args.function}; known: {', '.join(stages)}")
        self.generator, self.function_params = stages[args.function]
        targets = cmake_targets()
        if args.isa not in targets:
            sys.exit(f"unknown ISA {args.isa}; known: {', '.join(targets)}")
        self.target = targets[args.isa]
        cache_root = pathlib.Path(args.cache or ROOT / "build" / "autotune")
        self.cache = cache_root / sources_hash() / args.isa / args.function
        self.cache.mkdir(parents=True, exist_ok=True)
        self.from_cache = 0  # candidates whose measurement an earlier run left in the cache
        self.space, self.default_keys = search_space(self.generator, args.seed)

    # ---- compiling ----

    def compile(self, source, params):
        """Compiles one candidate into cache/<key>/candidate.so (cached); returns its record."""
        key = candidate_key(source, params)
        folder = self.cache / key
        record_path = folder / "compiled.json"
        if record_path.exists():
            return json.loads(record_path.read_text())
        folder.mkdir(parents=True, exist_ok=True)
        function = f"attn_{self.args.function}_{key}"
        cmd = [str(self.generator_exe), "-g", self.generator, "-f", function, "-o", str(folder), "-e",
               "object,c_header" + (",schedule" if source != "manual" else ""),
               f"target={self.target}-no_runtime", *generator_args(source, params, self.plugins),
               *self.function_params]
        start = time.time()
        record = {"source": source, "params": params, "key": key}
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.compile_timeout)
            if result.returncode == 0:
                link = subprocess.run(["c++", "-shared", "-o", str(folder / "candidate.so"),
                                       str(folder / f"{function}.o")], capture_output=True, text=True)
                ok = link.returncode == 0
                record.update(status="compiled" if ok else "link_failed", message=link.stderr[-500:])
            else:
                record.update(status="compile_failed", message=result.stderr.strip()[-500:])
        except subprocess.TimeoutExpired:
            record.update(status="compile_timeout", message=f"over {self.args.compile_timeout} s")
        record["compile_seconds"] = round(time.time() - start, 1)
        record_path.write_text(json.dumps(record, indent=1))
        return record

    # ---- measuring ----

    def measure(self, record):
        """Checks then times a compiled candidate with attn_bench (cached); adds 'times' (ms by problem)."""
        folder = self.cache / record["key"]
        measured_path = folder / "measured.json"
        if measured_path.exists():
            self.from_cache += 1
            return json.loads(measured_path.read_text())
        bench_function = "self_attention" if self.generator == "attention_layer" else self.args.function
        problems = "|".join(re.escape(p) for p in self.args.problems)
        cmd = [str(self.bench_exe), f"--candidate={folder / 'candidate.so'}:{record['key']}:{self.args.isa}",
               f"--benchmark_filter=^{bench_function}/candidate_{record['key']}/({problems})$",
               f"--benchmark_repetitions={self.args.repetitions}", f"--benchmark_min_time={self.args.min_time}",
               "--benchmark_report_aggregates_only=true", "--benchmark_format=json"]
        measured = dict(record)
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.measure_timeout)
            report = json.loads(result.stdout) if result.stdout.strip().startswith("{") else {"benchmarks": []}
        except subprocess.TimeoutExpired:
            report, result = {"benchmarks": []}, None
            measured["message"] = f"measuring took over {self.args.measure_timeout} s"
        except json.JSONDecodeError:  # the harness died mid-report (a crashing candidate)
            report = {"benchmarks": []}
            measured["message"] = f"attn_bench exited with {result.returncode}: {result.stderr[-300:]}"
        times, errors = {}, []
        for b in report["benchmarks"]:
            problem = b.get("run_name", b["name"]).split("/")[-1]
            if b.get("error_occurred"):
                errors.append(f"{problem}: {b.get('error_message', '')[:300]}")
            elif b.get("aggregate_name") == "median":
                times[problem] = b["real_time"]
        if errors:
            measured.update(status="rejected", message="; ".join(errors))
        elif len(times) != len(self.args.problems):
            tail = (result.stderr if result else "")[-500:]
            measured.update(status="rejected",
                            message=measured.get("message") or f"no timing for every problem: {tail}")
        else:
            measured.update(status="measured", times_ms=times)
        measured_path.write_text(json.dumps(measured, indent=1))
        return measured

    # ---- the search ----

    def run(self):
        space = self.space
        if self.args.max_candidates:
            space = space[: self.args.max_candidates]
        deadline = time.time() + 60 * self.args.budget_minutes
        print(f"autotuning {self.args.function} ({self.generator}) for {self.args.isa} ({self.target}): "
              f"{len(space)} candidates in the space, budget {self.args.budget_minutes} min, "
              f"{self.args.jobs} compile jobs; cache {self.cache}", flush=True)
        results, best = [], None
        bar = tqdm(total=len(space), unit="cand", dynamic_ncols=True, file=sys.stdout)
        # Batches: compile `jobs` candidates at once, then measure them one by one with
        # nothing else running, so compiles never disturb a timing.
        with concurrent.futures.ThreadPoolExecutor(self.args.jobs) as pool:
            for first in range(0, len(space), self.args.jobs):
                if time.time() >= deadline:
                    break
                batch = space[first:first + self.args.jobs]
                for record in list(pool.map(lambda c: self.compile(*c), batch)):
                    if record["status"] == "compiled":
                        record = self.measure(record)
                    results.append(record)
                    if record["status"] == "measured" and (best is None or
                                                           self.score(record, results) < self.score(best, results)):
                        best = record
                    left = max(0.0, deadline - time.time()) / 60
                    best_text = (f"best {best['key'][:32]} {self.score(best, results)[1]:.3f}x of manual, "
                                 if best else "")
                    bar.set_postfix_str(f"{best_text}budget left {left:.1f} min")
                    bar.update(1)
        bar.close()
        if not any(r["status"] == "measured" for r in results):
            sys.exit("no candidate passed the reference check")
        return space, results

    def defaults(self, results):
        """The record of each schedule source's default (None where it was not tried)."""
        by_key = {r["key"]: r for r in results}
        return {source: by_key.get(key) for source, key in self.default_keys.items()}

    def ratios(self, record, results):
        """Time relative to the hand-written default, per problem."""
        manual = self.defaults(results).get("manual")
        base = manual["times_ms"] if manual and manual["status"] == "measured" else record["times_ms"]
        return [record["times_ms"][p] / base[p] for p in self.args.problems]

    def score(self, record, results):
        """The worst ratio over the problems (the winner should be no slower than the default on
        any problem class), then the geometric mean of the ratios."""
        ratios = self.ratios(record, results)
        return max(ratios), math.exp(sum(map(math.log, ratios)) / len(ratios))

    # ---- freezing ----

    def freeze(self, space, results, started):
        measured = [r for r in results if r["status"] == "measured"]
        fastest = min(measured, key=lambda r: self.score(r, results))
        # The autotuned variant is the default on its ISA, so it must run every shape the
        # library accepts: autoscheduled schedules refuse shapes smaller than their tiles
        # (README), so the frozen winner is the fastest hand-written parameter set; a
        # faster autoscheduled candidate is reported, not frozen.
        winner = min((r for r in measured if r["source"] == "manual"), key=lambda r: self.score(r, results))
        defaults = self.defaults(results)
        # Every function of the tuned generator: the fused layer's four share its winner.
        functions = [name for name, generator, _ in cmake_stages() if generator == self.generator]
        best_per_problem = {p: min(measured, key=lambda r: r["times_ms"][p])["key"] for p in self.args.problems}
        vs = {}
        for source, r in defaults.items():
            if r and r["status"] == "measured":
                vs[source] = {p: round(r["times_ms"][p] / winner["times_ms"][p], 3) for p in self.args.problems}
        provenance = {
            "tuned_through": self.args.function,
            "generator": self.generator,
            "isa": self.args.isa,
            "target": self.target,
            "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "host": platform.node()},
            "halide": importlib.metadata.version("halide"),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "tools/autotune.sh " + " ".join(self.args.command_line),
            "budget_minutes": self.args.budget_minutes,
            "seconds": round(time.time() - started),
            "problems": self.args.problems,
            "repetitions": self.args.repetitions,
            "search_space_size": len(space),
            "candidates_tried": len(results),
            "default_time_over_winner": vs,
            "fastest_per_problem": best_per_problem,
            "candidates": [{k: r.get(k) for k in ("key", "source", "params", "status", "times_ms", "compile_seconds",
                                                   "message") if r.get(k) is not None} for r in results],
        }
        AUTOTUNED.joinpath(self.args.isa).mkdir(parents=True, exist_ok=True)
        for function in functions:
            record = {"function": function, "winner": {"source": winner["source"], "params": winner["params"]},
                      "generator_params": ["schedule=manual"] + [f"{k}={v}" for k, v in winner["params"].items()],
                      "provenance": provenance}
            path = AUTOTUNED / self.args.isa / f"{function}.json"
            path.write_text(json.dumps(record, indent=1) + "\n")
            print(f"froze {path.relative_to(ROOT)}")
        return winner, vs, fastest


def cpu_model():
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--isa", required=True, help="ISA of cmake/AttnTargets.cmake (this CPU must run it)")
    parser.add_argument("--function", required=True,
                        help="AOT function of ATTN_STAGES; self_attention tunes the fused layer")
    parser.add_argument("--problems", nargs="+",
                        default=["b1_s128_h768_n12", "b8_s128_h768_n12_pad", "b1_s128_h384_n12"],
                        help="benchmark problems (tests/support/problem.cpp) to check and time on; the "
                             "defaults are the classes BERT-base latency, padded batch, MiniLM")
    parser.add_argument("--budget-minutes", type=float, default=30, help="stop starting candidates after this")
    parser.add_argument("--max-candidates", type=int, default=0, help="at most this many candidates (0: all)")
    parser.add_argument("--jobs", type=int, default=max(1, os.cpu_count() or 2), help="compiles at once")
    parser.add_argument("--compile-timeout", type=float, default=300, help="seconds per candidate compile")
    parser.add_argument("--measure-timeout", type=float, default=300, help="seconds per candidate measurement")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds per repetition")
    parser.add_argument("--seed", type=int, default=1, help="order of the non-default candidates")
    parser.add_argument("--no-freeze", action="store_true", help="search and report only")
    parser.add_argument("--cache", help="where compiled and measured candidates are kept (default build/autotune)")
    parser.add_argument("--generator", required=True)
    parser.add_argument("--bench", required=True)
    parser.add_argument("--plugins", required=True)
    args = parser.parse_args()
    # What a reader reruns: the options, less the paths tools/autotune.sh supplies.
    argv, args.command_line = sys.argv[1:], []
    while argv:
        option = argv.pop(0)
        if option in ("--generator", "--bench", "--plugins", "--cache"):
            argv.pop(0)
        else:
            args.command_line.append(option)
    started = time.time()
    tuner = Tuner(args)
    space, results = tuner.run()
    counts = {s: sum(r["status"] == s for r in results) for s in sorted({r["status"] for r in results})}
    print(f"tried {len(results)} of {len(space)} candidates ({tuner.from_cache} from the cache) in "
          f"{time.time() - started:.0f} s: {counts}")
    if args.no_freeze:
        return
    winner, vs, fastest = tuner.freeze(space, results, started)
    print(f"winner: {winner['source']} {winner['params']}")
    if fastest is not winner:
        print(f"  faster but not frozen (autoscheduled: refuses small shapes): {fastest['key']}, "
              f"{tuner.score(fastest, results)[1]:.3f}x of the hand-written default's time")
    for source, ratios in vs.items():
        print(f"  {source} default / winner: " + ", ".join(f"{p} {r:.2f}x" for p, r in ratios.items()))


if __name__ == "__main__":
    main()
