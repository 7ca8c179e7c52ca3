#!/usr/bin/env python3
"""The GPU autotuner: candidates compiled here, timed on a GPU machine, frozen here.

A GPU is lent to few sessions, and the machine that has one has no Halide, no toolchain
and no network, so tuning a GPU ISA of manifest.json (cuda; opencl rehearses the whole
path in CI on PoCL) is three steps. The same steps tune a CPU ISA on that machine's host
CPU (avx512_skylake, on its 16 threads), where the CPU tuner (tools/autotune.py) cannot
run: the space is then the CPU tuner's for the hand-written schedule, and each candidate
is timed on all of the host's threads.

  bundle (here)   the hand-written GPU schedule's parameter space for one function
                  (manifest.json: the function's GPU parameters, tools/manifest.py
                  tuning_parameters, and each one's gpu_search values; the default first,
                  then in turn a change of one parameter alone and a combination, each kind
                  in a seeded random order, at most --max-candidates), each
                  candidate compiled by the project's generator for the ISA into a shared
                  library (with the packed twin when a tuning problem is packed); for CUDA,
                  every kernel assembled by ptxas for sm_90 at the runtime's register cap
                  (manifest.json: gpu_max_registers), and a candidate that spills dropped;
                  written to a folder with bundle.json and packed into <folder>.tar.xz,
                  held under the 64 MiB a device call carries.
  measure (there) every compiled candidate checked against the reference and timed by
                  bench/compare.py on each shape class's tuning problems (manifest.json;
                  those attn_bench times the function on: a class with none, as the S×S
                  stages' long one, takes another class's winner at freeze), interleaved,
                  after a device synchronize (attn_bench synchronizes a GPU call before its
                  clock stops); the comparisons and the device (GPU name, driver, CUDA
                  version) in <out>/measured.json.
  freeze (here)   per shape class, the winner (autotune.paired_winner): of the candidates
                  measurably faster than the default parameters on some problem of the class
                  (the interval of their paired per-round ratio below 1) and no slower by
                  median on any, the lowest worst-case ratio, then geometric mean; the
                  default where there is none. Frozen as generated/tuned/<isa>/<function>.json
                  for every function the generator's parameters serve, with the provenance
                  (the device, the timings, the commands) beside it, as tools/autotune.py
                  freezes CPU winners. Once every function of the ISA has a winner, the ISA's
                  variants (manifest.json) gain `autotuned`: no autotuned variant exists
                  before a measured campaign made one.

    python3 tools/gpu_autotune.py bundle --isa cuda --function attention_layer --generator build/release/attn_generators
    python3 tools/gpu_autotune.py measure --bundle build/gpu-tune/cuda/attention_layer --bench build/gpu-carry/attn_bench \
        --out generated/results/gpu/tune/attention_layer        # on the GPU machine: tools/gpu_machine.sh tune
    python3 tools/gpu_autotune.py freeze --bundle build/gpu-tune/cuda/attention_layer \
        --results generated/results/gpu/tune/attention_layer

The measure step imports only the standard library and bench/compare.py (NumPy), which the
GPU machine's Python has.
"""
import argparse
import concurrent.futures
import datetime
import itertools
import json
import os
import pathlib
import random
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import manifest as manifest_lib  # noqa: E402
from manifest import ROOT, TUNED  # noqa: E402

MANIFEST = manifest_lib.load()
# What one device call carries (the device tool's limit), less room for the programs beside it.
BUNDLE_LIMIT_BYTES = 48 * 1024 * 1024


def search_space(function, isa, seed, max_candidates, values=None):
    """The candidates' parameters in search order: the defaults first, then in turn one that
    differs from them in one parameter alone and one of the rest, each kind shuffled with
    `seed` (so that a sample times values of single parameters beside the defaults, paired,
    as well as combinations: the fused layer's CUDA sample of 32 has all 15 single changes);
    at most max_candidates (0: all). On a GPU ISA, the product of each GPU
    parameter's gpu_search values (its default alone where it has none); on a CPU ISA (the
    GPU machine's host), the CPU tuner's space of the hand-written schedule
    (tools/autotune.py manual_candidates: the ISA's register tiles and each search value).
    `values` ({name: [value, ...]}) keeps only the candidates whose named parameters take
    those values (the defaults stay first whatever they are: the others are timed against them)."""
    if MANIFEST.isas[isa]["device"] == "cpu":
        import autotune  # here only
        default, *rest = [params for _, params in autotune.manual_candidates(function, isa)]
    else:
        names = MANIFEST.tuning_parameters(function, gpu=True)
        defaults = MANIFEST.manual_defaults(gpu=True)
        default = {n: defaults[n] for n in names}
        axes = [MANIFEST.manual_parameters[n].get("gpu_search", [default[n]]) for n in names]
        rest = [dict(zip(names, values)) for values in itertools.product(*axes)]
        rest = [p for p in rest if p != default]
    for name, allowed in (values or {}).items():
        if name not in default:
            sys.exit(f"--values {name}: not a parameter of {function}'s schedule for {isa}: expected one of "
                     + ", ".join(sorted(default)))
        rest = [p for p in rest if p[name] in allowed]
    random.Random(seed).shuffle(rest)
    def changed(p):
        return sum(p[n] != default[n] for n in default)
    one_alone = [p for p in rest if changed(p) == 1]
    others = [p for p in rest if changed(p) != 1]
    space = [default] + [p for pair in itertools.zip_longest(one_alone, others) for p in pair if p is not None]
    return space[:max_candidates] if max_candidates else space


def key_of(params, isa):
    """The candidate's symbol suffix: its parameters, then the ISA (bench/compare.py picks a
    device's cases by it)."""
    text = "".join(f"{k}{v}_" for k, v in sorted(params.items())) + isa
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


# ---- bundle ----

def ptxas_figures(library_folder, suffix, functions, ptxas):
    """The CUDA kernels of a compiled candidate assembled for sm_90 at the runtime's register
    cap: (most registers, total spill bytes)."""
    import gpu_kernels  # here only: it needs ptxas
    cap = MANIFEST.data["gpu_max_registers"]["count"]
    registers, spills = 0, 0
    for function in functions:
        obj = library_folder / f"attn_{function}_{suffix}.o"
        for figures in gpu_kernels.assemble(ptxas, gpu_kernels.ptx_of(obj), "sm_90", cap).values():
            registers = max(registers, figures["registers"])
            spills += figures["spill_stores"] + figures["spill_loads"]
    return registers, spills


def bundle(args):
    import autotune  # here only: the compile step is the CPU tuner's
    if args.isa not in MANIFEST.isas or MANIFEST.arch(args.isa) != "x86-64":
        sys.exit(f"{args.isa} is not an ISA of manifest.json that the GPU machine or its x86-64 host runs")
    function = args.function
    generator = MANIFEST.function(function)["generator"]
    if MANIFEST.function(function).get("tuned_with", generator) != generator:
        owner = MANIFEST.function(function)["tuned_with"]
        sys.exit(f"bundle: {function} runs the schedule of {owner}'s generator, whose tuning serves it: tune "
                 f"{MANIFEST.functions_of_generator(owner)[0]} instead")
    classes, untimed = autotune.class_problems(function, args.shape_classes, args.bench, args.problems)
    twin = MANIFEST.packed_twin(function)
    functions = [function] + ([twin] if twin and any(autotune.is_packed(p) for ps in classes.values() for p in ps)
                              else [])
    out = pathlib.Path(args.out or ROOT / "build" / "gpu-tune" / args.isa / function).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    target = MANIFEST.target(args.isa)
    ptxas = None
    if MANIFEST.isas[args.isa]["device"] == "cuda":
        import gpu_kernels
        ptxas = gpu_kernels.find_ptxas(args.ptxas)
        if not ptxas:
            sys.exit("bundle: ptxas not found (the CUDA toolkit, or --ptxas PATH): a CUDA candidate must be "
                     "assembled to be kept")
    space = search_space(function, args.isa, args.seed, args.max_candidates, args.values)
    print(f"bundle: {function} for {args.isa} ({target}): {len(space)} candidates, {args.jobs} compile jobs, "
          f"into {out}", flush=True)

    def build(params):
        """Compiles one candidate in a folder of its own (its objects, then assembled by ptxas);
        the library alone is kept, beside bundle.json."""
        key = key_of(params, args.isa)
        folder = out / "objects" / key
        folder.mkdir(parents=True)
        start = time.time()
        status, message = autotune.compile_candidate(args.generator, args.plugins or ".", generator, target,
                                                     functions, "manual", params, key, folder / f"{key}.so",
                                                     args.compile_timeout)
        record = {"key": key, "params": params, "status": status, "compile_seconds": round(time.time() - start, 1)}
        if message:
            record["message"] = message
        if status == "compiled" and ptxas:
            record["registers"], spills = ptxas_figures(folder, key, functions, ptxas)
            if spills:
                record.update(status="spills", message=f"{spills} bytes of spill stores and loads a thread at "
                                                        f"{MANIFEST.data['gpu_max_registers']['count']} registers")
        if record["status"] == "compiled":
            shutil.move(str(folder / f"{key}.so"), str(out / f"{key}.so"))
            record["library"] = f"{key}.so"
        return record

    records = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for record in pool.map(build, space):
            records.append(record)
            print(f"  {record['key']}: {record['status']}"
                  + (f", {record['registers']} registers" if "registers" in record else "")
                  + (f" ({record['message'][:160]})" if record.get("message") else ""), flush=True)
    shutil.rmtree(out / "objects")
    kept = [r for r in records if r["status"] == "compiled"]
    if not kept or kept[0]["params"] != space[0]:
        sys.exit("bundle: the default parameters did not compile; nothing to tune against")
    doc = {"isa": args.isa, "device": MANIFEST.isas[args.isa]["device"], "function": function,
           "generator": generator, "functions": functions, "target": target, "classes": classes,
           "untimed_classes": untimed,
           "sources_hash": source_hash(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
               timespec="seconds"),
           "command": "tools/gpu_autotune.py " + " ".join(command_line(sys.argv[1:])),
           "space_size": len(search_space(function, args.isa, args.seed, 0)), "candidates": records}
    (out / "bundle.json").write_text(json.dumps(doc, indent=1) + "\n")
    archive = out.parent / f"{out.name}.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(out, arcname=out.name)
    size = archive.stat().st_size
    print(f"bundle: {len(kept)} of {len(records)} candidates kept; {archive} is {size / 2**20:.1f} MiB")
    if size > BUNDLE_LIMIT_BYTES:
        sys.exit(f"bundle: {archive} is over {BUNDLE_LIMIT_BYTES // 2**20} MiB, more than a device call carries "
                 "beside the programs: fewer --max-candidates")


def source_hash():
    import autotune
    return autotune.sources_hash()


def command_line(argv):
    """The options a reader reruns, less the paths of this machine."""
    out = []
    argv = list(argv)
    while argv:
        option = argv.pop(0)
        if option in ("--generator", "--plugins", "--bench", "--ptxas", "--out") and argv:
            argv.pop(0)
        else:
            out.append(option)
    return out


# ---- measure (on the GPU machine) ----

def device_facts(device):
    """The GPU, its driver and CUDA version (nvidia-smi); for OpenCL, the CPU PoCL runs on; for a
    CPU ISA, the CPU, its threads and its AVX-512 extensions (the candidates run on all threads)."""
    facts = {"device": device}
    if device == "cuda":
        try:
            query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
            facts["gpu"], facts["driver"] = [x.strip() for x in query.split(",", 1)]
            header = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout
            found = re.search(r"CUDA Version:\s*([\d.]+)", header)
            facts["cuda"] = found.group(1) if found else "unknown"
        except (OSError, subprocess.CalledProcessError, IndexError) as e:
            sys.exit(f"measure: no NVIDIA GPU answers nvidia-smi ({e}); nothing to time")
    elif device == "opencl":
        facts["opencl"] = "PoCL (OpenCL on the CPU)"
    info = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    facts["cpu"] = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "unknown")
    if device == "cpu":
        flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
        facts.update(threads=os.cpu_count(), avx512=sorted(f for f in flags if f.startswith("avx512")))
    return facts


def measure(args):
    folder = pathlib.Path(args.bundle).resolve()
    doc = json.loads((folder / "bundle.json").read_text())
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    facts = device_facts(doc["device"])
    on_cpu = doc["device"] == "cpu"
    args.min_time = args.min_time if args.min_time is not None else (0.1 if on_cpu else 0.05)
    args.pause = args.pause if args.pause is not None else (0.25 if on_cpu and args.peers else 0.02)
    kept = [c for c in doc["candidates"] if c["status"] == "compiled"]
    candidates = [f"--candidate={folder / c['library']}:{c['key']}:{doc['isa']}" for c in kept]
    comparisons = {}
    for shape_class, problems in doc["classes"].items():
        if args.shape_classes and shape_class not in args.shape_classes:
            continue
        target = out / shape_class
        impls = "candidate_[A-Za-z0-9_]+" + (f"|{args.peers}" if args.peers else "")
        pattern = f"^{re.escape(doc['function'])}/({impls})/({'|'.join(map(re.escape, problems))})$"
        cmd = [sys.executable, str(ROOT / "bench" / "compare.py"), "--bench", str(pathlib.Path(args.bench).resolve()),
               "--out", str(target), "--device", doc["device"], "--filter", pattern, "--exclude", "",
               "--rounds", str(args.rounds), "--min-time", str(args.min_time), "--pause", str(args.pause),
               "--no-chart", *candidates]
        print(f"measure: {shape_class}: {len(kept)} candidates on {', '.join(problems)}", flush=True)
        started = time.time()
        subprocess.run(cmd, check=True)
        comparisons[shape_class] = {"comparison": f"{shape_class}/comparison.json",
                                    "seconds": round(time.time() - started)}
    measured = {"bundle": doc, "device": facts, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "command": "tools/gpu_autotune.py " + " ".join(command_line(sys.argv[1:])),
                "rounds": args.rounds, "min_time": args.min_time, "pause": args.pause, "peers": args.peers,
                "classes": comparisons}
    (out / "measured.json").write_text(json.dumps(measured, indent=1) + "\n")
    print(f"measure: wrote {out / 'measured.json'}")


# ---- freeze ----

def class_results(comparison, function, kept):
    """Per candidate key: {problem: [ms per round]} for the candidates timed on every problem,
    and the errors of those that were not."""
    times, errors = {}, {}
    for group in comparison["groups"]:
        if group["function"] != function:
            continue
        for impl, entry in group["impls"].items():
            if not impl.startswith("candidate_"):
                continue  # a peer timed beside the candidates (measure --peers)
            key = impl[len("candidate_"):]
            if entry.get("error"):
                errors.setdefault(key, []).append(f"{group['problem']}: {entry['error'][:200]}")
            elif entry["ms"]:
                times.setdefault(key, {})[group["problem"]] = entry["ms"]
    problems = {g["problem"] for g in comparison["groups"] if g["function"] == function}
    complete = {k: t for k, t in times.items() if set(t) == problems and k not in errors and k in kept}
    return complete, errors, sorted(problems)


def peer_results(comparison, function, winner_ms):
    """Per problem, each peer timed beside the candidates (measure --peers): its median and the
    paired ratio peer time / winner time (above 1: the winner is faster)."""
    out = {}
    for group in comparison["groups"]:
        if group["function"] != function or group["problem"] not in winner_ms:
            continue
        for impl, entry in group["impls"].items():
            if not impl.startswith("candidate_") and entry.get("ms"):
                out.setdefault(group["problem"], {})[impl] = {
                    "median_ms": round(statistics.median(entry["ms"]), 4),
                    "winner_speedup": round(paired_ratio(entry["ms"], winner_ms[group["problem"]]), 4)}
    return out


def paired_ratio(ms, base_ms):
    """The median over rounds of this time over the base's in the same round."""
    return statistics.median(a / b for a, b in zip(ms, base_ms))


def freeze(args):
    import autotune  # here only
    folder = pathlib.Path(args.bundle).resolve()
    results = pathlib.Path(args.results).resolve()
    measured = json.loads((results / "measured.json").read_text())
    doc = json.loads((folder / "bundle.json").read_text())
    if measured["bundle"]["date"] != doc["date"]:
        sys.exit(f"freeze: {results} measured another bundle ({measured['bundle']['date']}, not {doc['date']})")
    if doc["sources_hash"] != source_hash():
        sys.exit("freeze: the schedules, generators or manifest changed since the bundle was compiled; what was "
                 "measured is not what would be built")
    kept = {c["key"]: c for c in doc["candidates"] if c["status"] == "compiled"}
    default_key = doc["candidates"][0]["key"]
    won = []
    for shape_class, entry in measured["classes"].items():
        comparison = json.loads((results / entry["comparison"]).read_text())
        times, errors, problems = class_results(comparison, doc["function"], kept)
        if default_key not in times:
            sys.exit(f"freeze: {shape_class}: the default candidate was not timed on every problem "
                     f"({'; '.join(errors.get(default_key, ['no timing']))})")
        ratios, intervals = autotune.paired_to_default(times, default_key, problems)
        scores = {key: (*autotune.worst_and_geomean(by.values()), {p: round(r, 4) for p, r in by.items()})
                  for key, by in ratios.items()}
        # The CPU tuner's rule: the default stays unless a candidate is measurably faster.
        winner_key = autotune.paired_winner(ratios, intervals, default_key)
        winner = {"source": "manual", "params": kept[winner_key]["params"]}
        provenance = {
            "tuned_through": doc["function"], "generator": doc["generator"], "isa": doc["isa"],
            "target": doc["target"], "shape_class": shape_class, "machine": measured["device"],
            "halide": "21.0.0", "bundled": doc["date"], "bundle_command": doc["command"],
            "measured": measured["date"], "measure_command": measured["command"],
            "freeze_command": "tools/gpu_autotune.py " + " ".join(command_line(sys.argv[1:])),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "problems": problems, "rounds": measured["rounds"], "min_time": measured["min_time"],
            "search_space_size": doc["space_size"], "candidates_bundled": len(doc["candidates"]),
            "candidates_timed": len(times),
            "winner_time_over_default": scores[winner_key][2],
            **({"peers": peers} if (peers := peer_results(comparison, doc["function"], times[winner_key])) else {}),
            "candidates": [{"key": c["key"], "params": c["params"], "status": c["status"],
                            **({"registers": c["registers"]} if "registers" in c else {}),
                            **({"message": c["message"]} if c.get("message") else {}),
                            **({"errors": errors[c["key"]]} if c["key"] in errors else {}),
                            **({"median_ms": {p: round(statistics.median(times[c["key"]][p]), 4)
                                              for p in problems},
                                "time_over_default": scores[c["key"]][2],
                                "interval_90": {p: [round(x, 4) for x in intervals[c["key"]][p]] for p in problems}}
                               if c["key"] in times else {})}
                           for c in doc["candidates"]],
        }
        print(f"freeze: {shape_class}: winner {winner['params']}, its time over the default's: "
              + ", ".join(f"{p} {r:.3f}" for p, r in scores[winner_key][2].items()))
        won.append((shape_class, winner, provenance))
    won = autotune.serve_untimed(doc["function"], won, doc["untimed_classes"])
    tuned_root = pathlib.Path(args.tuned_dir).resolve() if args.tuned_dir else TUNED
    autotune.freeze_winners(doc["isa"], doc["generator"], won, tuned_root)
    if not args.tuned_dir:
        enable_autotuned(doc["isa"])


def enable_autotuned(isa):
    """Adds `autotuned` to the ISA's variants in manifest.json once every function it provides
    has a winner, or says which still need one."""
    functions = [f for f in MANIFEST.functions if MANIFEST.provides("manual", isa, f)]
    missing = sorted({MANIFEST.function(f).get("tuned_with", MANIFEST.function(f)["generator"]) for f in functions
                      if not (TUNED / isa / f"{f}.json").exists()})
    if "autotuned" in MANIFEST.isas[isa]["variants"]:
        return
    if missing:
        print(f"freeze: autotuned_{isa} is built once these generators have winners too: {', '.join(missing)} "
              "(tune a function of each)")
        return
    path = ROOT / "manifest.json"
    text = path.read_text()
    entry = re.search(r'"name": "' + re.escape(isa) + r'".*?"variants": \[', text, re.S)
    text = text[:entry.end()] + '"autotuned", ' + text[entry.end():]
    manifest_lib.Manifest(json.loads(text))  # still a valid manifest
    path.write_text(text)
    print(f"freeze: manifest.json: {isa} now has the variant autotuned_{isa}")


def families(args):
    """One function of each generator whose parameters a tuning of the ISA serves, the fused
    layer's first: what a campaign bundles, measures and freezes."""
    out = []
    for name, f in MANIFEST.functions.items():
        generator = f["generator"]
        if f.get("tuned_with", generator) == generator and MANIFEST.provides("manual", args.isa, name) and \
                generator not in [MANIFEST.function(o)["generator"] for o in out]:
            out.append(name)
    out.sort(key=lambda name: not MANIFEST.fused(name))
    print(" ".join(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="step", required=True)
    b = steps.add_parser("bundle", help="here: compile the candidates and pack them")
    b.add_argument("--isa", required=True, help="an ISA of manifest.json: cuda; opencl (rehearses on PoCL); a CPU ISA "
                                                  "of the GPU machine's host (avx512_skylake)")
    b.add_argument("--function", required=True, help="a function of manifest.json; its winner serves its generator's")
    b.add_argument("--shape-classes", nargs="+", default=list(MANIFEST.shape_classes),
                   choices=list(MANIFEST.shape_classes))
    b.add_argument("--problems", nargs="+", help="problems instead of the class's, for one shape class")
    b.add_argument("--max-candidates", type=int, default=0, help="at most this many (0: the whole space)")
    b.add_argument("--seed", type=int, default=1, help="order of the non-default candidates")
    b.add_argument("--values", nargs="+", default=[], metavar="NAME=V1,V2",
                   help="only the candidates whose parameter NAME takes one of these values (an A/B of a few "
                        "parameters instead of a sample of the whole space)")
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="compiles at once")
    b.add_argument("--compile-timeout", type=float, default=600)
    b.add_argument("--generator", required=True, help="the build's attn_generators")
    b.add_argument("--bench", default=str(ROOT / "build" / "release" / "bench" / "attn_bench"),
                   help="the build's attn_bench, which lists the problems each function is timed on "
                        "(default build/release/bench/attn_bench)")
    b.add_argument("--plugins", help="Halide's plugin folder (unused by the hand-written schedule)")
    b.add_argument("--ptxas", help="ptxas (default: on PATH, or /usr/local/cuda/bin/ptxas)")
    b.add_argument("--out", help="the bundle's folder (default build/gpu-tune/<isa>/<function>)")
    m = steps.add_parser("measure", help="on the GPU machine: check and time every candidate")
    m.add_argument("--bundle", required=True)
    m.add_argument("--bench", required=True, help="attn_bench (the carried one on the GPU machine)")
    m.add_argument("--out", required=True, help="folder for measured.json and each class's comparison")
    m.add_argument("--shape-classes", nargs="+", help="only these of the bundle's classes")
    m.add_argument("--rounds", type=int, default=5)
    m.add_argument("--min-time", type=float, help="seconds per sample (default 0.05 on a GPU, 0.1 on a CPU)")
    m.add_argument("--pause", type=float, help="seconds of idle before each sample (default 0.02; 0.25 on a CPU "
                                               "with --peers, whose spinning thread pools must go quiet first)")
    m.add_argument("--peers", help="regex of peers (as pytorch_sdpa) timed in the same interleaved rounds, so "
                                   "that the winner's comparison with them is paired")
    f = steps.add_parser("freeze", help="here: freeze each shape class's winner with its provenance")
    f.add_argument("--bundle", required=True)
    f.add_argument("--results", required=True, help="the measure step's --out")
    f.add_argument("--tuned-dir", help="write the winners here instead of generated/tuned (and leave "
                                        "manifest.json alone)")
    fam = steps.add_parser("families", help="the functions to tune for every function of the ISA to have a winner")
    fam.add_argument("--isa", required=True)
    args = parser.parse_args()
    if args.step == "bundle" and args.problems and len(args.shape_classes) != 1:
        parser.error("--problems replaces the problems of one shape class: give one with --shape-classes")
    if args.step == "bundle":
        try:
            args.values = {name: [int(v) for v in allowed.split(",")]
                           for name, allowed in (item.split("=", 1) for item in args.values)}
        except ValueError:
            parser.error(f"--values: expected NAME=V1,V2 with integer values, got {' '.join(args.values)}")
    {"bundle": bundle, "measure": measure, "freeze": freeze, "families": families}[args.step](args)


if __name__ == "__main__":
    main()
