#!/usr/bin/env python3
"""Regenerates the frozen autoscheduled schedules under generated/frozen/.

For every frozen schedule source of manifest.json, every ISA that has a variant of it and
every function it provides there, runs the project's generator with the autoscheduler
plugin and the manifest's parameters, and keeps the emitted .schedule.h as
generated/frozen/<source>/<isa>/<function>.schedule.h, then writes
generated/frozen/registry.inc, which records for each schedule the pipeline index
and name of every Func it looks up, so a schedule that no longer matches the
algorithm fails the build (see schedules/schedule_source.cpp). Never edit the
outputs by hand; run:

    tools/freeze_schedules.sh [--sources adams2019 ...] [--isas avx2 ...] [--functions ...] [--jobs N]
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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import manifest as manifest_lib  # noqa: E402
from manifest import ROOT  # noqa: E402

FROZEN = ROOT / "generated" / "frozen"

# How to get a schedule out of Halide 21's autoschedulers where their first try fails
# (what to run is manifest.json's; these are workarounds of the tool):
# Anderson2021 may place a Func between GPU block loops, which Halide then rejects
# (seen on attention_scores: "Funcs cannot be scheduled in between GPU block loops"),
# or fail with an empty message; such a function is searched again without block-level
# compute_at (the third of the four search_space_options: compute_root, inline, block
# level, thread level).
ANDERSON_RETRY = {"search_space_options": "1101"}
# Functions whose default Anderson2021 schedule Halide then rejects when the frozen
# header is applied (output_layernorm: `sum.compute_at(mean, seqi).store_at(mean, seq)`,
# "a potential race condition"): searched with ANDERSON_RETRY from the start.
ANDERSON_RESTRICTED = {"output_layernorm"}
# Adams2019 may emit an unroll of a loop whose extent is not constant, which Halide then
# rejects (seen on avx2's fused layer with the flash core: "Can only unroll for loops
# over a constant extent", q_heads over head_dim); such a function is searched again
# for 4 cores instead of 2, which leads it to another schedule.
RETRY = {"anderson2021": ANDERSON_RETRY, "adams2019": {"parallelism": "4"}}
# Schedules whose first try emits, but which the build then rejects once their splits are
# guarded (schedules/schedule_source.cpp, guard_every_split: "Can only unroll for loops
# over a constant extent", seen on the packed layer): searched with these parameters,
# found by trying, from the start.
RETRY_FROM_THE_START = {("adams2019", "sse41", "attention_layer_packed_probs"): {"parallelism": "16"},
                        ("adams2019", "avx512_zen4", "attention_layer_packed"): RETRY["adams2019"]}


def with_params(params, overrides):
    """The autoscheduler parameters with overrides replacing the same keys (or added)."""
    return {**params, **overrides}


# Halide 21's emitters use some of the algorithm's Vars (Mullapudi2016 in reorder()) and
# the Vars their own tile() calls create (key_vo, key_vi, ...) without declaring them. As
# Halide identifies a Var by its name, declaring every identifier the scheduling calls
# use undeclared, at the top of the schedule function, makes the emitted schedule compile
# without changing what it does.
MARKER = "// Declared by tools/freeze_schedules.py"
SCHEDULING_CALL = re.compile(r"\.(?:tile|gpu|gpu_blocks|gpu_threads|gpu_lanes|reorder|reorder_storage|compute_at|"
                             r"store_at|split|fuse|vectorize|unroll|parallel|bound|bound_extent|rfactor|"
                             r"compute_with|atomic)\(((?:[^()]|\([^()]*\))*)\)")


def declare_used_vars(text):
    if MARKER in text:
        return text
    declared = set(re.findall(r"^    (?:Var|Func) ([\w$]+)[(= ]", text, re.M))
    declared |= set(re.findall(r"^\s*RVar ([\w$]+)[(= ]", text, re.M))
    used = []
    for args in SCHEDULING_CALL.findall(text):
        args = re.sub(r"\w+::\w+", " ", args)  # TailStrategy::ShiftInwards, ...
        args = re.sub(r'"[^"]*"', " ", args)  # names in strings
        used += re.findall(r"(?<![\w$])([A-Za-z_][\w$]*)", args)
    missing = sorted({v for v in used if v not in declared and v not in ("true", "false")})
    if not missing:
        return text
    decl = f"    {MARKER} (Vars the emitter uses undeclared):\n"
    decl += "".join(f'    [[maybe_unused]] Var {v}("{v}");\n' for v in missing)
    return text.replace("    using ::Halide::Var;\n", "    using ::Halide::Var;\n" + decl, 1)


# Halide 21's Anderson2021 emitter starts the schedule function with
# `auto pipeline = get_pipeline();`, which redeclares its parameter and does not compile.
GET_PIPELINE = "    auto pipeline = get_pipeline();\n"


def fix_emitted(text):
    return declare_used_vars(text.replace(GET_PIPELINE, ""))


def freeze_one(manifest, generator_exe, plugin_dir, source, isa, function):
    as_params = manifest.autoscheduler_params(source, isa, function)
    if source == "anderson2021" and function in ANDERSON_RESTRICTED:
        as_params = with_params(as_params, ANDERSON_RETRY)
    if (source, isa, function) in RETRY_FROM_THE_START:
        as_params = with_params(as_params, RETRY_FROM_THE_START[(source, isa, function)])
    symbol = f"attn_{function}_{source}_{isa}"
    plugin = plugin_dir / manifest.plugin(source)
    with tempfile.TemporaryDirectory() as tmp:
        def command(autoscheduler_params):
            return [str(generator_exe), "-g", manifest.function(function)["generator"], "-o", tmp, "-e", "schedule",
                    "-f", symbol, "-p", str(plugin), f"target={manifest.target(isa)}",
                    *manifest.generator_params(function, source, autoscheduler_params, autoscheduler_run=True)]

        start = time.time()
        result = subprocess.run(command(as_params), capture_output=True, text=True, timeout=900)
        if result.returncode != 0 and source in RETRY:
            result = subprocess.run(command(with_params(as_params, RETRY[source])), capture_output=True, text=True,
                                    timeout=900)
        if result.returncode != 0:
            raise RuntimeError(f"{symbol}: generator failed:\n{result.stderr[-2000:]}")
        out = FROZEN / source / isa / f"{function}.schedule.h"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(fix_emitted((pathlib.Path(tmp) / f"{symbol}.schedule.h").read_text()))
    return out, time.time() - start


def write_registry():
    entries = []
    for header in sorted(FROZEN.glob("*/*/*.schedule.h")):
        source, isa, function = header.parent.parent.name, header.parent.name, header.name[: -len(".schedule.h")]
        text = header.read_text()
        lookups = re.findall(r"Func (\w+) = pipeline\.get_func\((\d+)\);", text)
        funcs = ", ".join(f'{{{index}, "{name}"}}' for name, index in sorted(lookups, key=lambda x: int(x[1])))
        apply = re.search(r"inline void (apply_schedule_\w+)\(", text).group(1)
        entries.append((header.relative_to(FROZEN), source, isa, function, apply, funcs))
    lines = ["// Generated by tools/freeze_schedules.py. Do not edit: regenerate with tools/freeze_schedules.sh.",
             "// ATTN_FROZEN(source, isa, function, apply function, {{pipeline index, Func name}, ...})"]
    lines += [f'#include "{path}"' for path, *_ in entries]
    lines += [f"ATTN_FROZEN({s}, {i}, {f}, {fn}, ({{{funcs}}}))" for _, s, i, f, fn, funcs in entries]
    (FROZEN / "registry.inc").write_text("\n".join(lines) + "\n")
    return len(entries)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generator", help="the built attn_generators executable")
    parser.add_argument("--plugins", help="folder of Halide's libautoschedule_*.so")
    parser.add_argument("--registry-only", action="store_true",
                        help="only re-declare pure Vars in existing headers and rewrite registry.inc")
    manifest = manifest_lib.load()
    frozen_sources = [name for name, s in manifest.sources.items() if s["kind"] == "frozen"]
    parser.add_argument("--sources", nargs="+", default=frozen_sources, choices=frozen_sources)
    parser.add_argument("--isas", nargs="+", help="ISAs (default: every ISA with a variant of the source)")
    parser.add_argument("--functions", nargs="+", choices=list(manifest.functions),
                        help="functions (default: all that the source provides)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)))
    args = parser.parse_args()
    if args.registry_only:
        for header in FROZEN.glob("*/*/*.schedule.h"):
            header.write_text(fix_emitted(header.read_text()))
        print(f"registry: {write_registry()} frozen schedules")
        return
    if not args.generator or not args.plugins:
        parser.error("--generator and --plugins are required")

    work = [(source, isa, function) for source in args.sources for isa in manifest.frozen_isas(source)
            if not args.isas or isa in args.isas
            for function in manifest.functions if not args.functions or function in args.functions
            if manifest.provides(source, isa, function)]
    print(f"freezing {len(work)} schedules with {args.jobs} jobs", flush=True)
    failures = 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(freeze_one, manifest, pathlib.Path(args.generator), pathlib.Path(args.plugins), src,
                               isa, function): (src, isa, function) for src, isa, function in work}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            src, isa, function = futures[future]
            try:
                out, seconds = future.result()
                print(f"[{done}/{len(work)}] {src} {isa} {function}: {seconds:.1f} s", flush=True)
            except Exception as e:  # report every failure, keep the others
                failures += 1
                print(f"[{done}/{len(work)}] {src} {isa} {function}: FAILED {e}", file=sys.stderr, flush=True)
    print(f"registry: {write_registry()} frozen schedules", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
