#!/usr/bin/env python3
"""Regenerates the frozen autoscheduled schedules under schedules/frozen/.

For every autoscheduler, ISA and AOT function of the variant list (ATTN_STAGES in
cmake/AttnVariants.cmake, targets from cmake/AttnTargets.cmake), runs the project's
generator with the autoscheduler plugin and keeps the emitted .schedule.h as
schedules/frozen/<source>/<isa>/<function>.schedule.h, then writes
schedules/frozen/registry.inc, which records for each schedule the pipeline index
and name of every Func it looks up, so a schedule that no longer matches the
algorithm fails the build (see schedules/schedule_source.cpp). Never edit the
outputs by hand; run:

    tools/freeze_schedules.sh [--sources adams2019 ...] [--isas avx2 ...] [--jobs N]
"""
import argparse
import concurrent.futures
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
FROZEN = ROOT / "schedules" / "frozen"

# Autoscheduler name, plugin, and the parameters it runs with for the CPU ISAs (the 2-core CPU).
# Adams2019's default beam (32) exhausts 24 GiB on the fused layer's pipeline, and
# Anderson2021's ran past 10 minutes and 10 GiB per function, so the fused layer is
# searched greedily (beam_size=1); the stages use the default.
SOURCES = {
    "mullapudi2016": ("Mullapudi2016", ["autoscheduler.parallelism=2"]),
    "adams2019": ("Adams2019", ["autoscheduler.parallelism=2"]),
}
# GPU ISAs (cmake/AttnTargets.cmake) and the sources that schedule for them, with their
# parameters: parallelism is an H100 SXM's 132 SMs. Adams2019 schedules CPUs only,
# Anderson2021 GPUs only. (The opencl variants reuse the cuda schedules: see
# schedules/schedule_source.cpp.)
GPU_ISAS = {"cuda"}
GPU_SOURCES = {
    "mullapudi2016": ("Mullapudi2016", ["autoscheduler.experimental_gpu_schedule=1", "autoscheduler.parallelism=132"]),
    "anderson2021": ("Anderson2021", ["autoscheduler.parallelism=132"]),
}
# Anderson2021 may place a Func between GPU block loops, which Halide then rejects
# (seen on attention_scores: "Funcs cannot be scheduled in between GPU block loops"),
# or fail with an empty message (self_attention_probs); such a function is searched
# again without block-level compute_at (the third of the four search_space_options:
# compute_root, inline, block level, thread level).
ANDERSON_RETRY = ["autoscheduler.search_space_options=1101"]
# Functions whose default Anderson2021 schedule Halide then rejects when the frozen
# header is applied (output_layernorm: `sum.compute_at(mean, seqi).store_at(mean, seq)`,
# "a potential race condition"): searched with ANDERSON_RETRY from the start.
ANDERSON_RESTRICTED = {"output_layernorm"}
# Li2018 is not frozen: Halide 21's Li2018 emits a .schedule.h that does not compile
# (Funcs and Vars used undeclared, e.g. `scores$1.compute_root().split(key,v1,v2,...)`),
# so its variants run the autoscheduler at build time instead (cmake/AttnVariants.cmake).
FUSED_EXTRA = {"adams2019": ["autoscheduler.beam_size=1"], "anderson2021": ["autoscheduler.beam_size=1"]}
# Adams2019 may emit an unroll of a loop whose extent is not constant, which Halide then
# rejects (seen on avx2's fused layer with the flash core: "Can only unroll for loops
# over a constant extent", q_heads over head_dim); such a function is searched again
# for 4 cores instead of 2, which leads it to another schedule.
RETRY = {"anderson2021": ANDERSON_RETRY, "adams2019": ["autoscheduler.parallelism=4"]}


def with_params(params, overrides):
    """params with each key=value of overrides replacing the same key (or added)."""
    keys = {o.split("=", 1)[0] for o in overrides}
    return [p for p in params if p.split("=", 1)[0] not in keys] + overrides
DEFAULT_ISAS = ["sse41", "avx2", "avx512_zen4", "cuda"]


def cmake_stages():
    text = (ROOT / "cmake" / "AttnVariants.cmake").read_text()
    block = re.search(r"set\(ATTN_STAGES(.*?)\)", text, re.S).group(1)
    stages = []
    for spec in re.findall(r'"([^"]+)"', block):
        name, generator, params = (spec.split("|") + [""])[:3]
        stages.append((name, generator, [p for p in params.split(",") if p]))
    return stages


def cmake_missing():
    """{source or source_isa: functions not provided} (ATTN_MISSING_* in cmake/AttnVariants.cmake)."""
    text = (ROOT / "cmake" / "AttnVariants.cmake").read_text()
    found = dict(re.findall(r"set\(ATTN_MISSING_(\w+)\s+([^)]*)\)", text))
    for key, names in found.items():  # one level of ${ATTN_MISSING_...} references
        found[key] = re.sub(r"\$\{ATTN_MISSING_(\w+)\}", lambda m: found.get(m.group(1), ""), names)
    return {key: set(names.split()) for key, names in found.items()}


def cmake_targets():
    text = (ROOT / "cmake" / "AttnTargets.cmake").read_text()
    return dict(re.findall(r'set\(ATTN_TARGET_(\w+)\s+"([^"]+)"\)', text))


# The algorithm's pure Vars (generators/attention_algorithm.h, Dims). Halide 21's
# Mullapudi2016 emitter uses some of them in reorder() without declaring them, and its
# GPU schedules use the Vars their tile() calls create (key_vo, key_vi, ...) undeclared
# too. As Halide identifies a Var by its name, declaring every such Var at the top of
# the schedule function makes the emitted schedule compile without changing what it does.
PURE_VARS = ["hidden", "seq", "batch", "head", "head_dim", "key", "query", "in_feature", "query_block",
             "query_in_block", "key_block", "key_chunk", "key_in_chunk"]
MARKER = "// Declared by tools/freeze_schedules.py"
SCHEDULING_CALL = re.compile(r"\.(?:tile|gpu|gpu_blocks|gpu_threads|reorder|compute_at|store_at|split|fuse|"
                             r"vectorize|unroll)\(((?:[^()]|\([^()]*\))*)\)")


def declare_pure_vars(text):
    if MARKER in text:
        return text
    declared = set(re.findall(r"^    (?:Var|Func) ([\w$]+)[(= ]", text, re.M))
    declared |= set(re.findall(r"^\s*RVar ([\w$]+)[(= ]", text, re.M))
    used = []
    for args in SCHEDULING_CALL.findall(text):
        args = re.sub(r"\w+::\w+", " ", args)  # TailStrategy::ShiftInwards, ...
        used += re.findall(r"(?<![\w$])([A-Za-z_][\w$]*)", args)
    missing = [v for v in PURE_VARS if v not in declared]
    missing += sorted({v for v in used if v not in declared and v not in PURE_VARS and v not in ("true", "false")})
    if not missing:
        return text
    decl = f"    {MARKER} (Vars the emitter may use undeclared):\n"
    decl += "".join(f'    [[maybe_unused]] Var {v}("{v}");\n' for v in missing)
    return text.replace("    using ::Halide::Var;\n", "    using ::Halide::Var;\n" + decl, 1)


# Halide 21's Anderson2021 emitter starts the schedule function with
# `auto pipeline = get_pipeline();`, which redeclares its parameter and does not compile.
GET_PIPELINE = "    auto pipeline = get_pipeline();\n"


def fix_emitted(text):
    return declare_pure_vars(text.replace(GET_PIPELINE, ""))


def schedules_isa(source, isa):
    return source in (GPU_SOURCES if isa in GPU_ISAS else SOURCES)


def freeze_one(generator_exe, plugin_dir, source, isa, target, stage):
    name, generator, params = stage
    autoscheduler, as_params = (GPU_SOURCES if isa in GPU_ISAS else SOURCES)[source]
    if generator == "attention_layer":
        as_params = as_params + FUSED_EXTRA.get(source, [])
    if source == "anderson2021" and name in ANDERSON_RESTRICTED:
        as_params = with_params(as_params, ANDERSON_RETRY)
    function = f"attn_{name}_{source}_{isa}"
    plugin = plugin_dir / f"libautoschedule_{autoscheduler.lower()}.so"
    with tempfile.TemporaryDirectory() as tmp:
        def command(autoscheduler_params):
            return [str(generator_exe), "-g", generator, "-o", tmp, "-e", "schedule", "-f", function, "-p",
                    str(plugin), f"target={target}", f"autoscheduler={autoscheduler}", *autoscheduler_params, *params]

        start = time.time()
        result = subprocess.run(command(as_params), capture_output=True, text=True, timeout=900)
        if result.returncode != 0 and source in RETRY:
            result = subprocess.run(command(with_params(as_params, RETRY[source])), capture_output=True, text=True,
                                    timeout=900)
        if result.returncode != 0:
            raise RuntimeError(f"{function}: generator failed:\n{result.stderr[-2000:]}")
        out = FROZEN / source / isa / f"{name}.schedule.h"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(fix_emitted((pathlib.Path(tmp) / f"{function}.schedule.h").read_text()))
    return out, time.time() - start


def write_registry():
    entries = []
    for header in sorted(FROZEN.glob("*/*/*.schedule.h")):
        source, isa, stage = header.parent.parent.name, header.parent.name, header.name[: -len(".schedule.h")]
        text = header.read_text()
        function = re.search(r"inline void (apply_schedule_\w+)\(", text).group(1)
        lookups = re.findall(r"Func (\w+) = pipeline\.get_func\((\d+)\);", text)
        funcs = ", ".join(f'{{{index}, "{name}"}}' for name, index in sorted(lookups, key=lambda x: int(x[1])))
        entries.append((header.relative_to(FROZEN), source, isa, stage, function, funcs))
    lines = ["// Generated by tools/freeze_schedules.py. Do not edit: regenerate with tools/freeze_schedules.sh.",
             "// ATTN_FROZEN(source, isa, stage, apply function, {{pipeline index, Func name}, ...})"]
    lines += [f'#include "{path}"' for path, *_ in entries]
    lines += [f"ATTN_FROZEN({s}, {i}, {st}, {fn}, ({{{funcs}}}))" for _, s, i, st, fn, funcs in entries]
    (FROZEN / "registry.inc").write_text("\n".join(lines) + "\n")
    return len(entries)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generator", help="the built attn_generators executable")
    parser.add_argument("--plugins", help="folder of Halide's libautoschedule_*.so")
    parser.add_argument("--registry-only", action="store_true",
                        help="only re-declare pure Vars in existing headers and rewrite registry.inc")
    all_sources = list(dict.fromkeys([*SOURCES, *GPU_SOURCES]))
    parser.add_argument("--sources", nargs="+", default=all_sources, choices=all_sources)
    parser.add_argument("--isas", nargs="+", default=DEFAULT_ISAS)
    parser.add_argument("--stages", nargs="+", help="AOT function names (default: all of ATTN_STAGES)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)))
    args = parser.parse_args()
    if args.registry_only:
        for header in FROZEN.glob("*/*/*.schedule.h"):
            header.write_text(fix_emitted(header.read_text()))
        print(f"registry: {write_registry()} frozen schedules")
        return
    if not args.generator or not args.plugins:
        parser.error("--generator and --plugins are required")

    targets = cmake_targets()
    stages = [s for s in cmake_stages() if not args.stages or s[0] in args.stages]
    missing = cmake_missing()
    work = [(src, isa, st) for src in args.sources for isa in args.isas if schedules_isa(src, isa) for st in stages
            if st[0] not in missing.get(src, set()) | missing.get(f"{src}_{isa}", set())]
    for isa in args.isas:
        if isa not in targets:
            sys.exit(f"unknown ISA {isa}; known: {', '.join(targets)}")
    print(f"freezing {len(work)} schedules with {args.jobs} jobs", flush=True)
    failures = 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(freeze_one, pathlib.Path(args.generator), pathlib.Path(args.plugins), src, isa,
                               targets[isa], st): (src, isa, st[0]) for src, isa, st in work}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            src, isa, stage = futures[future]
            try:
                out, seconds = future.result()
                print(f"[{done}/{len(work)}] {src} {isa} {stage}: {seconds:.1f} s", flush=True)
            except Exception as e:  # report every failure, keep the others
                failures += 1
                print(f"[{done}/{len(work)}] {src} {isa} {stage}: FAILED {e}", file=sys.stderr, flush=True)
    print(f"registry: {write_registry()} frozen schedules", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
