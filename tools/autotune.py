#!/usr/bin/env python3
"""Autotuner: searches schedules for one function and ISA, per shape class, measures them,
freezes the fastest.

The search space for a function of manifest.json (its winner also serves the other
functions of its generator and those tuned_with it: tuning attention_layer tunes
attention_layer_probs, the packed functions and attention_core):

  - the hand-written schedule's own parameters (manifest.json: manual_parameters; only
    those the function uses);
  - each autoscheduler with parameter sweeps: Mullapudi2016 (parallelism,
    last_level_cache_size, balance), Adams2019 (beam_size, random_dropout with
    several random_dropout_seed, parallelism), Li2018 (parallelism).

The defaults of each (the hand-written schedule's manifest defaults, each autoscheduler
with the manifest's parameters, as the frozen variants run it) come first; the rest
follow in a seeded random order, so a run cut short by its budget has still sampled the
whole space.

Each candidate is compiled by the project's generator into a shared library
(`-no_runtime`: it binds to the harness's Halide runtime), several at a time with a
timeout each (when a class is tuned on packed problems, `*_varlen`, the library also
holds the function's packed twin, attention_layer_packed, which attn_bench runs them
through, so one winner is chosen for both), then measured one at a time by the
benchmark harness, attn_bench --candidate=...: checked against the reference first (DESIGN.md's accuracy rule, on a
short problem whatever the class; a wrong or refusing candidate is rejected), then timed
with repetitions on each problem of the shape class (manifest.json: shape_classes). Each
class is searched in turn, with its share of the budget; candidates compiled for one are
measured again for the next from the cache. Everything compiled and measured is cached
under build/autotune/, keyed by the sources it depends on, so an interrupted run resumes.

Those times are one candidate after another, so a slow minute of a shared machine can
make one look fast or the default slow on a problem. So the default and the --confirm
(4) best hand-written candidates of the search are then timed again by bench/compare.py,
interleaved in --confirm-rounds (7) rounds, and their paired ratios to the default choose
among them: a candidate replaces the default only where it is measurably faster on some
problem and no slower by median on any (paired_winner). Without a confirmation (--confirm
0), the winner of a class (the lowest worst-case time relative to the hand-written default
over its problems, then the lowest geometric mean) is chosen from the search's times. It is frozen in
generated/tuned/<isa>/<function>.json: one entry per class, or one entry for several
classes where their winners are the same parameters, with the provenance of each search
beside it in <function>.provenance.json (every candidate and its times, machine, Halide
version, date, budget). The build compiles one function per entry and the runtime picks it
by max(S_q, S_k). A frozen entry holds parameters of the hand-written schedule, so the
winner is a hand-written parameter set; a faster autoscheduled candidate is reported (its
own variant runs it), not frozen. The confirmation's time is outside --budget-minutes
(about a minute a class at 128 tokens, more at long lengths).

    tools/autotune.sh --isa avx2 --function attention_layer --budget-minutes 30
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
import shlex
import statistics
import subprocess
import sys
import time

from tqdm import tqdm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import manifest as manifest_lib  # noqa: E402
from manifest import ROOT  # noqa: E402

MANIFEST = manifest_lib.load()
from manifest import TUNED  # noqa: E402

sys.path.insert(1, str(ROOT / "bench"))
import report  # noqa: E402  (bench/report.py: the comparisons' statistics)

# The hand-written parameters and the values searched (manifest.json: manual_parameters,
# each parameter's one home): a parameter's "search" list, and register tiles of
# tile_rows × tile_vectors from 4 accumulators to all but one of the ISA's vector registers
# (manifest.json: vector_registers; 15 of SSE's and AVX2's 16, 31 of AVX-512's 32).
MANUAL_VALUES = {name: p["search"] for name, p in MANIFEST.manual_parameters.items() if "search" in p}
TILE_ROWS, TILE_VECTORS = (range(MANIFEST.manual_parameters[n]["min"], MANIFEST.manual_parameters[n]["max"] + 1)
                           for n in ("tile_rows", "tile_vectors"))


def register_tiles(isa):
    registers = MANIFEST.isas[isa]["vector_registers"]
    return [(r, v) for r in TILE_ROWS for v in TILE_VECTORS if 4 <= r * v <= registers - 1]

# Autoscheduler sweeps (manifest name: {param: values}); the manifest's own value of a
# parameter, where it sets one, is put first: that candidate is the frozen variant's.
SWEEPS = {
    "mullapudi2016": {"parallelism": [2, 4, 8, 16], "last_level_cache_size": [16777216, 4194304, 33554432],
                      "balance": [40, 10, 80]},
    "adams2019": {"parallelism": [2, 4, 8], "beam_size": [32, 8, 1], "random_dropout": [100, 90, 75],
                  "random_dropout_seed": [0, 1, 2, 3]},
    "li2018": {"parallelism": [2, 4, 8, 16]},
}
# A problem with a reference, run for every candidate to check it, whatever the class.
CHECK_PROBLEM = "b1_s128_h384_n12"


def tuning_problems(function, shape_class, timed):
    """The class's tuning problems the function runs: those the benchmark times it on
    (`timed`: the S×S stages are not timed at long contexts), the packed ones only where it
    has a packed twin (the stages take no packed sequences)."""
    twin = MANIFEST.packed_twin(function)
    return [p for p in MANIFEST.shape_classes[shape_class]["tuning_problems"]
            if p in timed and (twin or not is_packed(p))]


def timed_problems(bench, function):
    """The problems attn_bench times the function on (its benchmark list)."""
    listed = subprocess.run([str(bench), "--benchmark_list_tests=true", f"--benchmark_filter=^{function}/"],
                            capture_output=True, text=True, check=True).stdout.split()
    return {name.split("/")[-1] for name in listed}


def class_problems(function, shape_classes, bench, problems=None):
    """Each shape class's tuning problems for the function ({class: problems}; `problems`
    replaces those of the one class given), and the classes on none of whose problems the
    benchmark times it (the S×S stages at long contexts)."""
    if problems:
        return {shape_classes[0]: problems}, []
    timed = timed_problems(bench, function)
    plan = {c: tuning_problems(function, c, timed) for c in shape_classes}
    return {c: ps for c, ps in plan.items() if ps}, [c for c, ps in plan.items() if not ps]


def serve_untimed(function, won, untimed):
    """`won` with each untimed class given the first timed class's winner: a frozen file covers
    every length. `won`: (class, winner, provenance)."""
    if not untimed:
        return won
    if not won:
        sys.exit(f"{function} is timed on no tuning problem of {', '.join(untimed)}")
    shape_class, winner, provenance = won[0]
    print(f"{', '.join(untimed)}: {function} is not timed on {'their' if len(untimed) > 1 else 'its'} problems "
          f"(bench/cases.cpp); {shape_class}'s winner serves {'them' if len(untimed) > 1 else 'it'}")
    return won + [(c, winner, provenance) for c in untimed]


def is_packed(problem):
    """Packed problems (problems/problem.cpp names them *_varlen) run through forward_packed."""
    return problem.endswith("_varlen")


def sources_hash():
    """What a compiled candidate depends on: the algorithm, the schedules, the generators, the manifest."""
    h = hashlib.sha256()
    for path in [p for d in ("algorithm", "schedules", "generators") for p in sorted((ROOT / d).glob("*"))
                 if p.suffix in (".cpp", ".h")] + [ROOT / "manifest.json"]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def manual_candidates(function, isa):
    names = MANIFEST.tuning_parameters(function)
    axes = []
    if "tile_rows" in names and "tile_vectors" in names:
        axes.append([{"tile_rows": r, "tile_vectors": v} for r, v in register_tiles(isa)])
    elif "tile_rows" in names:
        axes.append([{"tile_rows": r} for r in TILE_ROWS])
    for name in MANUAL_VALUES:
        if name in names:
            axes.append([{name: v} for v in MANUAL_VALUES[name]])
    defaults = MANIFEST.manual_defaults()
    default = {k: defaults[k] for k in names}
    out = [default]
    for combo in itertools.product(*axes):
        params = {k: v for part in combo for k, v in part.items()}
        if params != default:
            out.append(params)
    return [("manual", p) for p in out]


def autoscheduler_candidates(source, function, isa):
    sweep = {k: list(v) for k, v in SWEEPS[source].items()}
    fused_only = MANIFEST.sources[source].get("fused_layer_params", {})
    layer = MANIFEST.fused(function)
    for k, v in MANIFEST.autoscheduler_params(source, isa, function).items():  # the manifest's value first
        value = int(v) if v.isdigit() else v
        # A fused-layer setting is a limit, not a default: Adams2019 at beam 32 exhausts
        # 24 GiB on the fused layer (tools/freeze_schedules.py uses the same).
        sweep[k] = [value] if layer and k in fused_only else [value] + [x for x in sweep.get(k, []) if x != value]
    combos = [dict(zip(sweep, values)) for values in itertools.product(*sweep.values())]
    if source == "adams2019":  # seeds only matter with dropout
        combos = [c for c in combos if c["random_dropout"] < 100 or c["random_dropout_seed"] == 0]
    return [(source, c) for c in combos]  # the first is the default


def search_space(function, isa, seed, sources=None):
    """The candidates in search order, and the key of each schedule source's default; only
    those of `sources` (the hand-written schedule always) where given."""
    groups = [manual_candidates(function, isa)] + [autoscheduler_candidates(s, function, isa) for s in SWEEPS
                                                    if not sources or s in sources]
    defaults = [g[0] for g in groups]
    rest = [c for g in groups for c in g[1:]]
    random.Random(seed).shuffle(rest)
    return defaults + rest, {source: candidate_key(source, params) for source, params in defaults}


def worst_and_geomean(ratios):
    """A candidate's score from its times over the default's (lower is better): the worst
    ratio, then the geometric mean."""
    ratios = list(ratios)
    return max(ratios), math.exp(sum(map(math.log, ratios)) / len(ratios))


def paired_to_default(times, default_key, problems):
    """From interleaved times ({key: {problem: [ms per round]}}): each key's paired ratio to the
    default (the median over rounds of its time over the default's in the same round) and that
    median's 90% interval, ({key: {problem: ratio}}, {key: {problem: (lo, hi)}})."""
    base = times[default_key]
    per_round = {key: {p: [a / b for a, b in zip(by[p], base[p])] for p in problems} for key, by in times.items()}
    return ({key: {p: statistics.median(r) for p, r in by.items()} for key, by in per_round.items()},
            {key: {p: report.median_interval(r) for p, r in by.items()} for key, by in per_round.items()})


def paired_winner(ratios, intervals, default_key):
    """The candidate an interleaved comparison picks ({key: {problem: paired median of its time
    over the default's}}, with each median's interval): among those measurably faster than the
    default on some problem (the interval below 1), no slower by median on any (so also never
    measurably slower), the lowest worst-case ratio, then geometric mean; the default where
    none is. A candidate no different from the default passes by chance only if every round
    on one problem favours it and the medians of all the others do too (at 7 rounds and 4
    problems, about 1 in 1,000 per candidate)."""
    better = [key for key in ratios if key != default_key
              and any(hi < 1 for _, hi in intervals[key].values())
              and all(r <= 1 for r in ratios[key].values())]
    return min(better, key=lambda key: worst_and_geomean(ratios[key].values())) if better else default_key


def candidate_key(source, params):
    text = source + "".join(f"_{k}{v}" for k, v in sorted(params.items()))
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


class Tuner:
    def __init__(self, args):
        self.args = args
        self.generator_exe = pathlib.Path(args.generator)
        self.bench_exe = pathlib.Path(args.bench)
        self.plugins = pathlib.Path(args.plugins)
        if args.function not in MANIFEST.functions:
            sys.exit(f"unknown function {args.function}; manifest.json has {', '.join(MANIFEST.functions)}")
        if args.isa not in MANIFEST.isas or MANIFEST.is_gpu(args.isa):
            sys.exit(f"{args.isa} is not a CPU ISA of manifest.json")
        self.function = args.function
        self.generator = MANIFEST.function(args.function)["generator"]
        # A candidate holds the tuned function and, when a class is tuned on packed
        # problems too, its packed twin (attn_bench runs those through forward_packed).
        tuned_on = args.problems or [p for c in args.shape_classes for p in MANIFEST.shape_classes[c]["tuning_problems"]]
        twin = MANIFEST.packed_twin(self.function)
        self.functions = [self.function] + ([twin] if twin and any(map(is_packed, tuned_on)) else [])
        self.target = MANIFEST.target(args.isa)
        cache_root = pathlib.Path(args.cache or ROOT / "build" / "autotune")
        self.cache = cache_root / sources_hash() / args.isa / args.function
        self.cache.mkdir(parents=True, exist_ok=True)
        self.from_cache = 0  # measurements an earlier run left in the cache
        self.space, self.default_keys = search_space(args.function, args.isa, args.seed, args.sources)

    # ---- compiling ----

    def compile(self, source, params):
        """Compiles one candidate into cache/<key>/candidate.so (cached); returns its record."""
        key = candidate_key(source, params)
        folder = self.cache / key
        record_path = folder / "compiled.json"
        if record_path.exists():
            record = json.loads(record_path.read_text())
            if record.get("functions", [self.function]) == self.functions:
                return record
            for stale in folder.glob("measured_*.json"):  # of a candidate holding other functions
                stale.unlink()
        folder.mkdir(parents=True, exist_ok=True)
        start = time.time()
        record = {"source": source, "params": params, "key": key, "functions": self.functions}
        missing = [f for f in self.functions if not MANIFEST.provides(source, self.args.isa, f)]
        if missing:
            record.update(status="compile_failed", message=f"{source} does not provide {', '.join(missing)} "
                                                           "(manifest.json: not_provided)")
        else:
            status, message = compile_candidate(self.generator_exe, self.plugins, self.generator, self.target,
                                                self.functions, source, params, key, folder / "candidate.so",
                                                self.args.compile_timeout)
            record.update(status=status, message=message)
        record["compile_seconds"] = round(time.time() - start, 1)
        record_path.write_text(json.dumps(record, indent=1))
        return record

    # ---- measuring ----

    def measure(self, record, shape_class, problems):
        """Checks then times a compiled candidate on the class's problems with attn_bench
        (cached per class and problems: a record of other problems is measured again);
        adds 'times_ms' (by problem)."""
        folder = self.cache / record["key"]
        measured_path = folder / f"measured_{shape_class}.json"
        if measured_path.exists():
            cached = json.loads(measured_path.read_text())
            if cached.get("problems") == problems:
                self.from_cache += 1
                return cached
        run = list(dict.fromkeys([CHECK_PROBLEM, *problems]))
        pattern = "|".join(re.escape(p) for p in run)
        cmd = [str(self.bench_exe), f"--candidate={folder / 'candidate.so'}:{record['key']}:{self.args.isa}",
               f"--benchmark_filter=^{self.function}/candidate_{record['key']}/({pattern})$",
               f"--benchmark_repetitions={self.args.repetitions}", f"--benchmark_min_time={self.args.min_time}",
               "--benchmark_report_aggregates_only=true", "--benchmark_format=json"]
        measured = dict(record, problems=problems)
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
            elif b.get("aggregate_name") == "median" and problem in problems:
                times[problem] = b["real_time"]
        if errors:
            measured.update(status="rejected", message="; ".join(errors))
        elif len(times) != len(problems):
            tail = (result.stderr if result else "")[-500:]
            measured.update(status="rejected",
                            message=measured.get("message") or f"no timing for every problem: {tail}")
        else:
            measured.update(status="measured", times_ms=times)
        measured_path.write_text(json.dumps(measured, indent=1))
        return measured

    # ---- the search ----

    def run(self, shape_class, problems, budget_minutes):
        """Searches one shape class: every record (compiled or not, measured or not)."""
        space = self.space[: self.args.max_candidates] if self.args.max_candidates else self.space
        deadline = time.time() + 60 * budget_minutes
        print(f"autotuning {self.function} ({self.generator}) for {self.args.isa} ({self.target}), shape class "
              f"{shape_class} ({', '.join(problems)}): {len(space)} candidates in the space, budget "
              f"{budget_minutes:.1f} min, {self.args.jobs} compile jobs; cache {self.cache}", flush=True)
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
                        record = self.measure(record, shape_class, problems)
                    results.append(record)
                    if record["status"] == "measured" and (best is None or self.score(record, results, problems) <
                                                           self.score(best, results, problems)):
                        best = record
                    left = max(0.0, deadline - time.time()) / 60
                    best_text = (f"best {best['key'][:32]} {self.score(best, results, problems)[1]:.3f}x of manual, "
                                 if best else "")
                    bar.set_postfix_str(f"{best_text}budget left {left:.1f} min")
                    bar.update(1)
        bar.close()
        if not any(r["status"] == "measured" for r in results):
            sys.exit(f"shape class {shape_class}: no candidate passed the reference check")
        return space, results

    def defaults(self, results):
        """The record of each schedule source's default (None where it was not tried)."""
        by_key = {r["key"]: r for r in results}
        return {source: by_key.get(key) for source, key in self.default_keys.items()}

    def ratios(self, record, results, problems):
        """Time relative to the hand-written default, per problem."""
        manual = self.defaults(results).get("manual")
        base = manual["times_ms"] if manual and manual["status"] == "measured" else record["times_ms"]
        return [record["times_ms"][p] / base[p] for p in problems]

    def score(self, record, results, problems):
        """The worst ratio over the problems (the winner should be no slower than the default on
        any problem of the class), then the geometric mean of the ratios."""
        return worst_and_geomean(self.ratios(record, results, problems))

    # ---- confirming, interleaved ----

    def confirm(self, shape_class, problems, results):
        """The search times each candidate once, one after another, so a slow minute of a noisy
        machine can make the default look slow (or a candidate fast) on a problem. The default
        and the --confirm best hand-written candidates of the search are timed again by
        bench/compare.py, interleaved in --confirm-rounds rounds (as every comparison here):
        returns paired_to_default's (ratios, intervals) and the confirmation's record for the
        provenance; ({}, None) with --confirm 0 or no other hand-written candidate, and ({}, the
        record) where the comparison failed."""
        if not self.args.confirm:
            return {}, None
        import gpu_autotune  # here only: it imports this module
        default = self.defaults(results)["manual"]
        ranked = sorted((r for r in results if r["status"] == "measured" and r["source"] == "manual"
                         and r is not default), key=lambda r: self.score(r, results, problems))
        if not ranked:
            return {}, None  # the default alone: nothing to choose between
        finalists = [default] + ranked[:self.args.confirm]
        keys = [r["key"] for r in finalists]
        out = self.cache / f"confirmed_{shape_class}"
        pattern = f"^{re.escape(self.function)}/candidate_({'|'.join(keys)})/({'|'.join(map(re.escape, problems))})$"
        cmd = [sys.executable, str(ROOT / "bench" / "compare.py"), "--bench", str(self.bench_exe.resolve()),
               "--out", str(out), "--filter", pattern, "--exclude", "", "--rounds", str(self.args.confirm_rounds),
               "--min-time", str(self.args.min_time), "--no-chart",
               *(f"--candidate={self.cache / key / 'candidate.so'}:{key}:{self.args.isa}" for key in keys)]
        record = {"finalists": keys, "rounds": self.args.confirm_rounds, "min_time": self.args.min_time,
                  "command": shlex.join(["bench/compare.py", *cmd[2:]]).replace(str(ROOT) + "/", "")}
        print(f"{shape_class}: timing the default and the search's {len(finalists) - 1} best other candidates "
              f"again, interleaved, {self.args.confirm_rounds} rounds", flush=True)
        # One worker process serves every finalist: where it fails, the search's times choose.
        run = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if run.returncode != 0:
            print(f"{shape_class}: the confirmation failed; the search's times choose:\n{run.stderr[-800:]}")
            return {}, dict(record, failed=run.stderr[-800:])
        comparison = json.loads((out / "comparison.json").read_text())
        times, errors, _ = gpu_autotune.class_results(comparison, self.function, set(keys))
        if default["key"] not in times:
            sys.exit(f"shape class {shape_class}: the default was not timed in the confirmation "
                     f"({'; '.join(errors.get(default['key'], ['no timing']))})")
        ratios, intervals = paired_to_default(times, default["key"], problems)
        record.update(
            time_over_default={key: {p: round(r, 4) for p, r in ratios[key].items()} for key in keys if key in ratios},
            interval_90={key: {p: [round(x, 4) for x in i] for p, i in by.items()} for key, by in intervals.items()},
            untimed=[key for key in keys if key not in times], **({"errors": errors} if errors else {}))
        return (ratios, intervals), record

    # ---- freezing ----

    def winner(self, shape_class, problems, space, results, started, budget_minutes):
        """The class's winner and its provenance; also the fastest candidate of any source."""
        measured = [r for r in results if r["status"] == "measured"]
        default = self.defaults(results).get("manual")
        if not default or default["status"] != "measured":
            # Every ratio is to the hand-written default: without its times there is no winner.
            sys.exit(f"shape class {shape_class}: the hand-written default was not measured "
                     f"({default['message'] if default else 'not tried'}); nothing is frozen")
        fastest = min(measured, key=lambda r: self.score(r, results, problems))
        # A frozen entry holds the hand-written schedule's generator parameters, so the
        # winner is a hand-written parameter set; a faster autoscheduled
        # candidate is reported (its own variant runs it), not frozen. Where the finalists
        # were timed again interleaved, those paired ratios choose among them (paired_winner:
        # the default stays unless one is measurably faster).
        winner = min((r for r in measured if r["source"] == "manual"), key=lambda r: self.score(r, results, problems))
        confirmed, confirmation = self.confirm(shape_class, problems, results)
        if confirmed:
            ratios, intervals = confirmed
            by_key = {r["key"]: r for r in measured}
            winner = by_key[paired_winner(ratios, intervals, default["key"])]
            confirmation["winner"] = winner["key"]
        vs = {}  # the other sources' from the search's times
        for source, r in self.defaults(results).items():
            if r and r["status"] == "measured":
                vs[source] = {p: round(r["times_ms"][p] / winner["times_ms"][p], 3) for p in problems}
        if confirmed:  # the hand-written default's from the interleaved, paired times
            vs["manual"] = {p: round(1 / confirmed[0][winner["key"]][p], 3) for p in problems}
        provenance = {
            "tuned_through": self.function,
            "generator": self.generator,
            "isa": self.args.isa,
            "target": self.target,
            "shape_class": shape_class,
            "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "host": platform.node()},
            "halide": importlib.metadata.version("halide"),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "tools/autotune.sh " + " ".join(self.args.command_line),
            "budget_minutes": round(budget_minutes, 1),
            "seconds": round(time.time() - started),
            "problems": problems,
            "checked_on": CHECK_PROBLEM,
            "repetitions": self.args.repetitions,
            "search_space_size": len(space),
            "candidates_tried": len(results),
            "default_time_over_winner": vs,
            **({"confirmed_interleaved": confirmation} if confirmation else {}),
            "fastest_per_problem": {p: min(measured, key=lambda r: r["times_ms"][p])["key"] for p in problems},
            "candidates": [{k: r.get(k) for k in ("key", "source", "params", "status", "times_ms", "compile_seconds",
                                                   "message") if r.get(k) is not None} for r in results],
        }
        return winner, vs, fastest, provenance

    def freeze(self, won):
        freeze_winners(self.args.isa, self.generator, won)


def compile_candidate(generator_exe, plugins, generator, target, functions, source, params, suffix, library,
                      timeout):
    """Compiles the functions attn_<function>_<suffix> of one candidate (`source` with `params`)
    for `target` (without a Halide runtime: it binds to the harness's) and links them into
    `library`; returns (status, message): compiled, compile_failed, compile_timeout or link_failed."""
    folder = pathlib.Path(library).parent
    objects = []
    for function in functions:
        symbol = f"attn_{function}_{suffix}"
        cmd = [str(generator_exe), "-g", generator, "-f", symbol, "-o", str(folder), "-e",
               "object,c_header" + (",schedule" if source != "manual" else ""), f"target={target}-no_runtime",
               *([] if source == "manual" else ["-p", str(pathlib.Path(plugins) / MANIFEST.plugin(source))]),
               *MANIFEST.generator_params(function, source, params, autoscheduler_run=source != "manual")]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "compile_timeout", f"{function}: over {timeout} s"
        if result.returncode != 0:
            return "compile_failed", f"{function}: " + result.stderr.strip()[-500:]
        objects.append(str(folder / f"{symbol}.o"))
    link = subprocess.run(["c++", "-shared", "-o", str(library), *objects], capture_output=True, text=True)
    return ("compiled", "") if link.returncode == 0 else ("link_failed", link.stderr[-500:])


def freeze_winners(isa, generator, won, tuned_root=TUNED):
    """Writes every function the tuned generator's parameters serve (manifest.py,
    functions_tuned_with) under tuned_root/<isa>/: one entry per class, or one for several
    classes whose winners are the same parameters. `won`: (class, winner, provenance), a
    winner being a record with its source and params. Returns the paths written."""
    entries = []
    for shape_class, winner, provenance in won:
        same = next((e for e in entries if e["winner"]["params"] == winner["params"]), None)
        if same:
            same["shape_classes"].append(shape_class)
            if provenance is not same["provenance"]:  # a class given another's winner adds no search
                same["provenance"] = {**same["provenance"],
                                      "also": same["provenance"].get("also", []) + [provenance]}
        else:
            entries.append({"shape_classes": [shape_class],
                            "winner": {"source": winner["source"], "params": winner["params"]},
                            "provenance": provenance})
    tuned_root.joinpath(isa).mkdir(parents=True, exist_ok=True)
    written = []
    # The tuned source, whether or not the ISA lists it yet (a GPU ISA gains it after its freeze).
    tuned = next(s for s, entry in MANIFEST.sources.items() if entry["kind"] == "tuned")
    for function in MANIFEST.functions_tuned_with(generator):
        if not MANIFEST.provides(tuned, isa, function):
            continue  # not built for the ISA's tuned variant (manifest.json: built_for, not_provided)
        uses = MANIFEST.function(function)["manual_parameters"]
        winners = [(e["shape_classes"], {k: v for k, v in e["winner"]["params"].items() if k in uses})
                   for e in entries]
        path = tuned_root / isa / f"{function}.json"
        path.write_text(MANIFEST.tuned_text(function, winners))
        provenance = [{"shape_classes": e["shape_classes"], "winner": e["winner"], "provenance": e["provenance"]}
                      for e in entries]
        path.with_suffix(".provenance.json").write_text(
            json.dumps({"function": function, "classes": provenance}, indent=1) + "\n")
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"froze {shown}: " + "; ".join(f"{'+'.join(c)}: {p}" for c, p in winners))
        written.append(path)
    return written


def cpu_model():
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    classes = MANIFEST.shape_classes
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--isa", required=True, help="a CPU ISA of manifest.json (this CPU must run it)")
    parser.add_argument("--function", required=True,
                        help="a function of manifest.json; its winner serves every function of its generator")
    parser.add_argument("--shape-classes", nargs="+", default=list(classes), choices=list(classes),
                        help="shape classes to tune, each on its problems (manifest.json)")
    parser.add_argument("--problems", nargs="+",
                        help="problems (problems/problem.cpp) instead of the class's, for one shape class")
    parser.add_argument("--budget-minutes", type=float, default=30,
                        help="stop starting candidates after this, shared among the classes")
    parser.add_argument("--max-candidates", type=int, default=0, help="at most this many candidates (0: all)")
    parser.add_argument("--jobs", type=int, default=max(1, os.cpu_count() or 2), help="compiles at once")
    parser.add_argument("--compile-timeout", type=float, default=300, help="seconds per candidate compile")
    parser.add_argument("--measure-timeout", type=float, default=300, help="seconds per candidate measurement")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds per repetition")
    parser.add_argument("--seed", type=int, default=1, help="order of the non-default candidates")
    parser.add_argument("--sources", nargs="+", choices=["manual", *SWEEPS],
                        help="search only these schedule sources (default: all; the hand-written one always)")
    parser.add_argument("--confirm", type=int, default=4,
                        help="the best hand-written candidates of each class timed again beside the default, "
                             "interleaved (bench/compare.py), whose paired ratios pick the winner (0: the search's "
                             "own times pick it)")
    parser.add_argument("--confirm-rounds", type=int, default=7, help="rounds of the confirmation (at least 5)")
    parser.add_argument("--no-freeze", action="store_true", help="search and report only")
    parser.add_argument("--cache", help="where compiled and measured candidates are kept (default build/autotune)")
    parser.add_argument("--generator", required=True)
    parser.add_argument("--bench", required=True)
    parser.add_argument("--plugins", required=True)
    args = parser.parse_args()
    if args.confirm < 0:
        parser.error(f"--confirm: expected 0 or more candidates, got {args.confirm}")
    if args.confirm and args.confirm_rounds < 5:
        parser.error("--confirm-rounds: bench/compare.py needs at least 5 rounds")
    if args.problems and len(args.shape_classes) != 1:
        parser.error("--problems replaces the problems of one shape class: give one with --shape-classes")
    if not args.no_freeze and set(args.shape_classes) != set(classes):
        parser.error("freezing needs every shape class (the frozen file covers all lengths); "
                     "tune a subset with --no-freeze")
    # What a reader reruns: the options, less the paths tools/autotune.sh supplies.
    argv, args.command_line = sys.argv[1:], []
    while argv:
        option = argv.pop(0)
        if option in ("--generator", "--bench", "--plugins", "--cache"):
            argv.pop(0)
        else:
            args.command_line.append(option)
    tuner = Tuner(args)
    plan, untimed = class_problems(args.function, args.shape_classes, args.bench, args.problems)
    won = []
    for shape_class, problems in plan.items():
        started = time.time()
        budget = args.budget_minutes / len(plan)
        tuner.from_cache = 0
        space, results = tuner.run(shape_class, problems, budget)
        counts = {s: sum(r["status"] == s for r in results) for s in sorted({r["status"] for r in results})}
        print(f"{shape_class}: tried {len(results)} of {len(space)} candidates ({tuner.from_cache} from the cache) "
              f"in {time.time() - started:.0f} s: {counts}")
        winner, vs, fastest, provenance = tuner.winner(shape_class, problems, space, results, started, budget)
        won.append((shape_class, winner, provenance))
        print(f"{shape_class}: winner {winner['source']} {winner['params']}")
        ratios = provenance.get("confirmed_interleaved", {}).get("time_over_default", {}).get(winner["key"])
        if ratios:
            print(f"  confirmed interleaved: its time over the default's, paired: "
                  + ", ".join(f"{p} {r:.3f}" for p, r in ratios.items()))
        if fastest["source"] != "manual":
            print(f"  faster but not frozen (autoscheduled; its own variant runs it): {fastest['key']}, "
                  f"{tuner.score(fastest, results, problems)[1]:.3f}x of the hand-written default's time")
        for source, ratios in vs.items():
            print(f"  {source} default / winner: " + ", ".join(f"{p} {r:.2f}x" for p, r in ratios.items()))
    won = serve_untimed(args.function, won, untimed)
    if not args.no_freeze:
        tuner.freeze(won)


if __name__ == "__main__":
    main()
