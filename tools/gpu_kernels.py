#!/usr/bin/env python3
"""The CUDA kernels of a build, judged without a GPU: registers, spills, shared memory,
threads per block and the occupancy they allow on an H100, and the work of each
function's call with its time at the H100's peaks.

For every CUDA AOT object of the build (every variant of an ISA whose device is cuda,
manifest.json), it takes the PTX Halide embeds (one module per object, a NUL-terminated
text from ".version"), assembles it with `ptxas -v --gpu-name sm_90` (registers, spill
stores and loads, static shared memory per kernel), and runs the object's generator
again with `-e stmt`: the lowered host code holds each kernel's launch,
halide_cuda_run(state, name, blocks x/y/z, threads x/y/z, dynamic shared bytes, ...),
whose threads and shared bytes are bounded here by interval arithmetic over the
enclosing lets (a constant, an upper bound, or "symbolic" where the lets do not bound
them: the flash core's sizes depend on data-dependent key ranges). The work (FLOPs,
bytes) of each function on each problem the benchmark times on a GPU comes from the
benchmark itself (attn_bench --serve, `list`: the runtime's by-name calls, CallWork).

    python3 tools/gpu_kernels.py --build build/release       # writes generated/results/gpu/kernels.md, .json
    python3 tools/gpu_kernels.py --build build/release --check
        # the CI test (tests/gpu_kernels.cmake): fails when a kernel of a hand-written or tuned
        # CUDA variant spills, or its static + bounded dynamic shared memory is over
        # manifest.json's gpu_shared_memory_per_block, or when a kernel of any CUDA variant
        # cannot launch (its block needs more registers than an SM has); exit 77 without ptxas
    python3 tools/gpu_kernels.py --ptx FILE --check [--max-registers N]   # one PTX file alone

The build writes each CUDA object's lowered stmt beside it (cmake/AttnVariants.cmake), which
is read instead of running the generator again where it is as new as the object (about 10 s
for every CUDA object of a build on 2 cores; lowering them again took a minute); --cache DIR
keeps each object's figures, keyed by its bytes.
"""
import argparse
import concurrent.futures
import datetime
import hashlib
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import manifest as manifest_lib  # noqa: E402
from manifest import ROOT  # noqa: E402

SKIP = 77  # CTest's SKIP_RETURN_CODE

# The H100 (SXM) peaks a kernel's time is judged against: fp32 without tensor cores, HBM3.
PEAK_FLOPS = 67e12
PEAK_BYTES_PER_S = 3.35e12
# An sm_90 multiprocessor's limits (CUDA occupancy calculator, compute capability 9.0).
SM_REGISTERS = 65536
SM_THREADS = 2048
SM_BLOCKS = 32
SM_SHARED = 228 * 1024
SHARED_RESERVED_PER_BLOCK = 1024
REGISTER_GRANULE = 256  # registers are allocated per warp, in units of 256
WARP = 32
# Sources whose CUDA kernels the check holds to no spills and the shared memory limit: the
# schedules this project writes or tunes (the autoschedulers' are reported, not judged).
CHECKED_KINDS = manifest_lib.OWN_KINDS


def find_ptxas(given):
    if given:
        return given if os.access(given, os.X_OK) else None
    installed = "/usr/local/cuda/bin/ptxas"
    return shutil.which("ptxas") or (installed if os.access(installed, os.X_OK) else None)


def ptx_of(obj):
    """The PTX module Halide embedded in an AOT object."""
    data = obj.read_bytes()
    start = data.find(b".version")
    if start < 0:
        raise SystemExit(f"{obj}: no PTX (.version) in it")
    if data.find(b".version", start + 1) >= 0:
        raise SystemExit(f"{obj}: more than one PTX module; this tool expects Halide's one per object")
    return data[start:data.index(b"\0", start)].decode()


def ptxas_version(ptxas):
    out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, check=True).stdout
    return next((line for line in out.splitlines() if line.startswith("Cuda compilation tools")), out.strip())


def assemble(ptxas, ptx, gpu_name, max_registers=None):
    """ptxas -v's figures per kernel, in the module's order: {name: {registers, spill_stores,
    spill_loads, stack_frame, static_shared}}."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "module.ptx"
        path.write_text(ptx)
        cmd = [ptxas, "-v", "--gpu-name", gpu_name, "-o", os.devnull, str(path)]
        if max_registers:
            cmd[1:1] = ["--maxrregcount", str(max_registers)]
        run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"ptxas failed:\n{run.stderr}")
    # In the module's order (ptxas reports them in another), which is roughly the launches'.
    kernels, current = {name: None for name in re.findall(r"^\.visible \.entry (\S+)\(", ptx, re.M)}, None
    for line in run.stderr.splitlines():
        if m := re.search(r"Compiling entry function '([^']+)'", line):
            current = kernels[m.group(1)] = {"registers": 0, "spill_stores": 0, "spill_loads": 0,
                                             "stack_frame": 0, "static_shared": 0}
        elif current is None:
            continue
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            current.update(stack_frame=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif m := re.search(r"Used (\d+) registers", line):
            current["registers"] = int(m.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                current["static_shared"] = int(s.group(1))
    missing = [name for name, figures in kernels.items() if figures is None]
    if missing:
        raise SystemExit(f"ptxas reported nothing of {', '.join(missing)}")
    return kernels


# --- Bounds of the launch arguments in Halide's lowered host code (-e stmt) ---------------

INF = math.inf
UNKNOWN = (-INF, INF)
TOKEN = re.compile(r"\s*(?:(\d+\.\d*(?:e[+-]?\d+)?f?|\d+)|([A-Za-z_][\w.$]*)|(<=|>=|==|!=|&&|\|\||[-+*/%<>!(),\[\]]))")


def tokens(text):
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"cannot read {text[pos:pos + 20]!r}")
        out.append(m.group(1) or m.group(2) or m.group(3))
        pos = m.end()
    return out


def _mul(a, b):
    products = [0 if 0 in (x, y) else x * y for x in a for y in b]
    return min(products), max(products)


class Bounds:
    """The interval of an expression of Halide's stmt text, given the module's lets (a name
    let twice with different values is unknown) and the bounds `known` of some names.
    Variables Halide names <buffer>.extent.<d> are extents, never negative; anything else
    not let is unknown."""

    def __init__(self, lets, known=None):
        self.lets = lets
        self.known = known or {}
        self.resolving = set()

    def of(self, text):
        try:
            self.toks, self.i = tokens(text), 0
            value = self._expr()
            return value if self.i == len(self.toks) else UNKNOWN
        except (ValueError, IndexError, ZeroDivisionError):
            return UNKNOWN

    def _peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def _take(self, want=None):
        tok = self.toks[self.i]
        if want is not None and tok != want:
            raise ValueError(f"expected {want}, got {tok}")
        self.i += 1
        return tok

    # Precedence, loosest first, as Halide prints: || && comparisons + - * / %.
    def _expr(self):
        a = self._and()
        while self._peek() == "||":
            self._take(), self._and()
            a = (0, 1)
        return a

    def _and(self):
        a = self._compare()
        while self._peek() == "&&":
            self._take(), self._compare()
            a = (0, 1)
        return a

    def _compare(self):
        a = self._sum()
        while self._peek() in ("<", ">", "<=", ">=", "==", "!="):
            self._take(), self._sum()
            a = (0, 1)
        return a

    def _sum(self):
        a = self._product()
        while self._peek() in ("+", "-"):
            op, b = self._take(), self._product()
            a = (a[0] + b[0], a[1] + b[1]) if op == "+" else (a[0] - b[1], a[1] - b[0])
        return a

    def _product(self):
        a = self._unary()
        while self._peek() in ("*", "/", "%"):
            op, b = self._take(), self._unary()
            if op == "*":
                a = _mul(a, b)
            elif b[0] == b[1] and b[0] > 0 and b[0] != INF:  # Halide's integer division floors
                a = (a[0] if a[0] == -INF else a[0] // b[0], a[1] if a[1] == INF else a[1] // b[0]) if op == "/" \
                    else (0, b[0] - 1)
            else:
                a = UNKNOWN
        return a

    def _unary(self):
        tok = self._peek()
        if tok == "-":
            self._take()
            a = self._unary()
            return -a[1], -a[0]
        if tok == "!":
            self._take(), self._unary()
            return 0, 1
        if tok == "(":
            self._take()
            if re.fullmatch(r"u?int\d+|float\d+", self._peek() or "") and self.toks[self.i + 1] == ")":
                self._take(), self._take()  # a cast: the value's bounds (the sizes here fit their types)
                return self._unary()
            a = self._expr()
            self._take(")")
            return a
        tok = self._take()
        if re.fullmatch(r"\d+", tok):
            return int(tok), int(tok)
        if re.fullmatch(r"[\d.]+(e[+-]?\d+)?f?", tok):
            return UNKNOWN
        if self._peek() == "(":  # a call
            self._take()
            args = [self._expr()]
            while self._peek() == ",":
                self._take()
                args.append(self._expr())
            self._take(")")
            if tok == "min":
                return min(a[0] for a in args), min(a[1] for a in args)
            if tok == "max":
                return max(a[0] for a in args), max(a[1] for a in args)
            if tok == "select" and len(args) == 3:
                return min(args[1][0], args[2][0]), max(args[1][1], args[2][1])
            return UNKNOWN
        if self._peek() == "[":  # a load: not followed
            self._take()
            self._expr()
            self._take("]")
            return UNKNOWN
        return self._variable(tok)

    def _variable(self, name):
        if name in self.known:
            return self.known[name]
        value = self.lets.get(name)
        if value is not None and name not in self.resolving:
            self.resolving.add(name)
            saved = self.toks, self.i
            bound = self.of(value)
            self.toks, self.i = saved
            self.resolving.discard(name)
            if re.search(r"\.extent\.\d+$", name):
                bound = (max(bound[0], 0), bound[1])
            return bound
        return (0, INF) if re.search(r"\.extent\.\d+$", name) else UNKNOWN


def split_arguments(text):
    """The top-level comma-separated arguments of a call whose '(' precedes `text`."""
    args, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([":
            depth += 1
        elif c in ")]":
            if depth == 0:
                args.append(text[start:i].strip())
                return args
            depth -= 1
        elif c == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
    raise ValueError("unbalanced call")


def launches(stmt):
    """Each kernel's launch in the stmt: {name: {threads: (lo, hi), dynamic_shared: (lo, hi)}}
    (a kernel launched from several places: the union of their bounds)."""
    lets = {}
    for m in re.finditer(r"^\s*let (\S+) = (.*)$", stmt, re.M):
        name, value = m.group(1), m.group(2)
        lets[name] = value if lets.get(name, value) == value else None
    # Where an allocation's size varies from block to block, Halide computes the largest on
    # the host first: X.shared_size[0] = max(X.shared_size[0], size) in a loop over the
    # blocks (from 0), then let X.shared_size_var = X.shared_size[0]. So that let is bounded
    # by 0 and each such size (as generators/gpu_shared_memory.cpp bounds it).
    sizes = {}
    for m in re.finditer(r"^\s*(\S+\.shared_size)\[0\] = max\(\1\[0\], (.*)\)$", stmt, re.M):
        sizes.setdefault(m.group(1) + "_var", []).append(m.group(2))
    probe = Bounds(lets)
    known = {}
    for name, values in sizes.items():
        if lets.get(name) != name[:-len("_var")] + "[0]":
            continue
        bounds = [probe.of(v) for v in values]
        known[name] = (0, max([0] + [b[1] for b in bounds]))
    bounds = Bounds(lets, known)
    found = {}
    for m in re.finditer(r"halide_cuda_run\(", stmt):
        args = split_arguments(stmt[m.end():stmt.index("\n", m.end())])
        name = args[1].strip('"')
        threads = (1, 1)
        for a in args[5:8]:
            threads = _mul(threads, bounds.of(a))
        shared = bounds.of(args[8])
        old = found.get(name)
        if old:
            threads = (min(old["threads"][0], threads[0]), max(old["threads"][1], threads[1]))
            shared = (min(old["dynamic_shared"][0], shared[0]), max(old["dynamic_shared"][1], shared[1]))
        found[name] = {"threads": threads, "dynamic_shared": shared}
    return found


def lowered_stmt(generator, plugins, target, library, tmp):
    """The library's lowered stmt, from its generator run as the build runs it."""
    cmd = [str(generator), "-n", library["name"], "-d", "0", "-g", library["generator"], "-f", library["name"],
           "-e", "stmt", "-o", str(tmp), f"target={target}-no_runtime", *library["params"]]
    if library["plugin"]:  # a source run in process loads its autoscheduler, as the build does
        if not plugins:
            raise SystemExit(f"{library['name']} needs Halide's autoscheduler plugins: --plugins DIR")
        cmd[9:9] = ["-p", str(pathlib.Path(plugins) / manifest_lib.load().plugin(library["source"]))]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{library['name']}: the generator failed ({' '.join(cmd)}):\n{run.stderr[-2000:]}")
    return (pathlib.Path(tmp) / f"{library['name']}.stmt").read_text(errors="replace")


# --- Occupancy and the table ---------------------------------------------------------------

def occupancy(registers, threads, shared):
    """Resident blocks and warps per sm_90 multiprocessor, and what limits them; `shared`
    None leaves shared memory out (then the figures are upper bounds)."""
    warps = math.ceil(threads / WARP)
    per_warp = math.ceil(max(registers, 1) * WARP / REGISTER_GRANULE) * REGISTER_GRANULE
    limits = {"threads": SM_THREADS // (warps * WARP), "blocks": SM_BLOCKS,
              "registers": SM_REGISTERS // (per_warp * warps)}
    if shared is not None:
        limits["shared"] = SM_SHARED // (shared + SHARED_RESERVED_PER_BLOCK)
    blocks = min(limits.values())
    return {"blocks": blocks, "warps": blocks * warps, "of_max": blocks * warps / (SM_THREADS // WARP),
            "limited_by": [k for k, v in limits.items() if v == blocks]}


def exact(interval):
    return interval[0] if interval[0] == interval[1] and interval[0] not in (-INF, INF) else None


def bound_text(interval):
    if exact(interval) is not None:
        return str(exact(interval))
    return f"≤ {interval[1]}" if interval[1] != INF else "symbolic"


def kernel_rows(variant, function, figures, launched):
    """One row per kernel: ptxas's figures, and its launch's (None: no stmt) with the occupancy."""
    rows = []
    for name, f in figures.items():
        row = {"variant": variant, "function": function, "kernel": name, **f}
        launch = launched.get(name) if launched is not None else None
        if launch is None:
            row["threads"] = row["dynamic_shared"] = None
            row["dynamic_shared_text"] = "not known (no stmt)" if launched is None else "not launched"
        else:
            row["threads"] = exact(launch["threads"])
            # The most threads a launch may have, where the lets bound it (None: unbounded).
            row["threads_at_most"] = None if launch["threads"][1] == INF else launch["threads"][1]
            upper = launch["dynamic_shared"][1]
            row["dynamic_shared"] = None if upper == INF else upper  # an upper bound
            row["dynamic_shared_exact"] = exact(launch["dynamic_shared"]) is not None
            row["dynamic_shared_text"] = bound_text(launch["dynamic_shared"])
        if row["threads"]:
            shared = None if row["dynamic_shared"] is None else row["static_shared"] + row["dynamic_shared"]
            row["occupancy"] = occupancy(row["registers"], row["threads"], shared)
            row["occupancy"]["shared_known"] = shared is not None
        rows.append(row)
    return rows


def cuda_libraries(m, build, sources=None):
    """The CUDA AOT libraries of the variants the build makes (attn_manifest.cmake's ATTN_VARIANTS:
    its architecture's, after ATTN_ONLY_VARIANTS), in manifest order; only of `sources` if given."""
    emitted = build / "attn_manifest.cmake"
    if not emitted.exists():
        raise SystemExit(f"{emitted} is missing: configure the build first")
    built = set(re.search(r"^set\(ATTN_VARIANTS (.*)\)$", emitted.read_text(), re.M).group(1).split())
    libraries = []
    for source, isa in m.variants():
        if m.isas[isa]["device"] != "cuda" or f"{source}_{isa}" not in built:
            continue
        if sources is None or source in sources:
            libraries += [lib for lib in m.aot_libraries(m.arch(isa)) if (lib["source"], lib["isa"]) == (source, isa)]
    return libraries


def work_rows(bench, cuda_variants):
    """(function, problem, flops, bytes) of every case the benchmark times on a CUDA variant."""
    listing = subprocess.run([str(bench), "--serve"], input="list\n", capture_output=True, text=True, check=True)
    cases = json.loads(listing.stdout.splitlines()[0])["cases"]
    if cases and "gbyte" not in cases[0]:
        raise SystemExit(f"{bench} lists no bytes per case (gbyte): rebuild it (cmake --build ... --target attn_bench)")
    rows = {}
    for c in cases:
        if c["name"].split("/")[1] in cuda_variants:
            rows[(c["function"], c["problem"])] = {"function": c["function"], "problem": c["problem"],
                                                   "flops": c["gflop"] * 1e9, "bytes": c["gbyte"] * 1e9}
    for r in rows.values():
        compute, memory = r["flops"] / PEAK_FLOPS, r["bytes"] / PEAK_BYTES_PER_S
        r.update(peak_us=max(compute, memory) * 1e6, bound="compute" if compute >= memory else "memory")
    return list(rows.values())


def markdown(doc):
    out = ["# CUDA kernels, judged without a GPU", "",
           f"Written by `{doc['command']}` on {doc['date']}; never edit it by hand. PTX from the build's AOT "
           f"objects, assembled by ptxas for {doc['gpu_name']} ({doc['ptxas']}) with at most "
           f"{doc['max_registers']} registers a thread (`--maxrregcount`: the cap the runtime gives CUDA's JIT "
           "for the variant's schedule source, manifest.json: gpu_max_registers).", "",
           "Per kernel: registers per thread; spill stores/loads (bytes per thread); static shared memory "
           "(ptxas) and dynamic shared memory per block (Halide's launch in the lowered stmt: a constant, "
           "`≤` an upper bound its lets prove, `symbolic` where they prove none); threads per block (the "
           "launch's, where constant); resident blocks and warps per SM on sm_90 (65536 registers in "
           "units of 256 per warp, 2048 threads, 32 blocks, 228 KiB shared with 1 KiB reserved per "
           "block) and what limits them (`≤`: shared memory unknown, left out). The limit a block may use "
           f"is {doc['shared_limit']} bytes (manifest.json: gpu_shared_memory_per_block).", ""]
    by_variant = {}
    for k in doc["kernels"]:
        by_variant.setdefault(k["variant"], []).append(k)
    out += ["| variant | function | kernels | register cap | most registers | spills | largest shared (B) |",
            "|---|---|---:|---:|---:|---|---|"]
    for variant, kernels in by_variant.items():
        functions = {}
        for k in kernels:
            functions.setdefault(k["function"], []).append(k)
        for function, ks in functions.items():
            spills = sum(k["spill_stores"] + k["spill_loads"] for k in ks)
            sizes = [k["static_shared"] + (k["dynamic_shared"] or 0) for k in ks]
            symbolic = any(k["dynamic_shared"] is None for k in ks)
            largest = f"{max(sizes)}{' + symbolic' if symbolic else ''}"
            out.append(f"| {variant} | {function} | {len(ks)} | {ks[0]['cap']} | {max(k['registers'] for k in ks)} | "
                       f"{'none' if spills == 0 else f'{spills} B'} | {largest} |")
    out += ["", "## Every kernel", "",
            "| variant | function | kernel | regs | spill st/ld (B) | static smem (B) | dynamic smem (B) | "
            "threads | blocks/SM | warps/SM | occupancy | limited by |",
            "|---|---|---|---:|---|---:|---|---:|---:|---:|---:|---|"]
    for k in doc["kernels"]:
        o = k.get("occupancy")
        le = "" if not o or o["shared_known"] else "≤ "
        occ = (f"{le}{o['blocks']} | {le}{o['warps']} | {le}{o['of_max']:.0%} | {', '.join(o['limited_by'])}"
               if o else "— | — | — | —")
        out.append(f"| {k['variant']} | {k['function']} | `{k['kernel']}` | {k['registers']} | "
                   f"{k['spill_stores']}/{k['spill_loads']} | {k['static_shared']} | {k['dynamic_shared_text']} | "
                   f"{k['threads'] or '—'} | {occ} |")
    out += ["", "## Work per call and its time at the H100's peaks", "",
            f"Each function on each problem the benchmark times on a GPU (attn_bench's cases; the packed "
            f"problems run attention_layer_packed): FLOPs and bytes of the runtime's by-name call (CallWork: "
            f"GEMM FLOPs, each input and output touched once; a causal mask counts the whole S×S; a packed "
            f"problem sums its sequences' calls), and max(FLOPs / {doc['peak_flops'] / 1e12:g} "
            f"TFLOP/s, bytes / {doc['peak_bytes_per_s'] / 1e12:g} TB/s): no schedule is faster.", "",
            "| function | problem | GFLOP | MB | time at peak (µs) | bound |", "|---|---|---:|---:|---:|---|"]
    for w in doc["work"]:
        out.append(f"| {w['function']} | {w['problem']} | {w['flops'] / 1e9:.3f} | {w['bytes'] / 1e6:.1f} | "
                   f"{w['peak_us']:.1f} | {w['bound']} |")
    return "\n".join(out) + "\n"


# A kernel that transposes a projection's weight (the algorithm's <q|k|v>_weight_t, w_o_t).
WEIGHT_TRANSPOSE = re.compile(r"^_kernel_(?:[qkv]_weight_t|w_o_t)_s\d")


def check(rows, limit, fused_layer_functions=(), checked_variants=None):
    """The failures: a kernel of any variant that cannot launch (its block needs more registers
    than an SM has: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES); and, for the kernels of
    `checked_variants` (None: all), spills, shared memory over the limit, or a fused layer's
    kernel transposing a weight on every call (its GPU weights arrive prepared, transposed
    once by the runtime: algorithm/attention_algorithm.h, WeightLayout)."""
    failures = []
    for k in rows:
        where = f"{k['variant']} {k['function']} {k['kernel']}"
        # A block as large as its launch may make it (exact, or the bound the lets prove).
        threads = k.get("threads") or k.get("threads_at_most")
        if threads and occupancy(k["registers"], threads, None)["blocks"] == 0:
            failures.append(f"{where}: cannot launch: its block of {'' if k.get('threads') else 'up to '}"
                            f"{threads} threads at {k['registers']} registers each needs more than an SM's "
                            f"{SM_REGISTERS}")
        if checked_variants is not None and k["variant"] not in checked_variants:
            continue
        if k["function"] in fused_layer_functions and WEIGHT_TRANSPOSE.match(k["kernel"]):
            failures.append(f"{where}: transposes a weight on every call, which the runtime prepared once")
        if k["spill_stores"] or k["spill_loads"]:
            failures.append(f"{where}: spills {k['spill_stores']} bytes stored, {k['spill_loads']} bytes loaded "
                            f"per thread ({k['registers']} registers)")
        shared = k["static_shared"] + (k["dynamic_shared"] or 0)
        if shared > limit:
            failures.append(f"{where}: {k['static_shared']} bytes static + {k['dynamic_shared_text']} dynamic "
                            f"shared memory per block, over the {limit} a block may use "
                            "(manifest.json: gpu_shared_memory_per_block)")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build/release", help="the build folder (its AOT objects, generator)")
    parser.add_argument("--gpu-name", default="sm_90", help="ptxas --gpu-name (default sm_90, the H100)")
    parser.add_argument("--ptxas", help="the ptxas executable (default: on PATH, or /usr/local/cuda/bin)")
    parser.add_argument("--plugins", help="Halide's libautoschedule_*.so folder (for an in-process source)")
    parser.add_argument("--bench", help="attn_bench (default: <build>/bench/attn_bench)")
    parser.add_argument("--out", default=str(ROOT / "generated/results/gpu"), help="where kernels.md, .json go")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a hand-written or tuned CUDA variant's kernel spills or is over the "
                             "shared memory limit, or any CUDA variant's kernel cannot launch; no table")
    parser.add_argument("--ptx", help="one PTX file instead of the build (with --check: its kernels judged)")
    parser.add_argument("--max-registers", type=int,
                        help="ptxas --maxrregcount (default each schedule source's cap, manifest.json's gpu_max_registers, the cap the runtime "
                             "gives the CUDA JIT; lower it to see where spills start)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="generators run at once")
    parser.add_argument("--cache", help="a folder keeping each object's figures, keyed by its bytes")
    args = parser.parse_args()

    ptxas = find_ptxas(args.ptxas)
    if not ptxas:
        print("SKIP: ptxas not found (install the CUDA toolkit, or --ptxas PATH)")
        return SKIP
    m = manifest_lib.load()
    limit = m.data["gpu_shared_memory_per_block"]["bytes"]
    caps = m.data["gpu_max_registers"]

    if args.ptx:
        path = pathlib.Path(args.ptx)
        cap = args.max_registers or caps["count"]
        rows = kernel_rows(path.name, "-", assemble(ptxas, path.read_text(), args.gpu_name, cap), None)
        for k in rows:
            print(f"{k['kernel']}: {k['registers']} registers, spills {k['spill_stores']}/{k['spill_loads']} B, "
                  f"{k['static_shared']} B static shared")
        failures = check(rows, limit) if args.check else []
        for f in failures:
            print(f"FAIL: {f}")
        return 1 if failures else 0

    build = pathlib.Path(args.build).resolve()
    libraries = cuda_libraries(m, build)
    if not libraries:
        print("SKIP: this build has no CUDA variant")
        return SKIP
    missing = [lib["object"] for lib in libraries if not (build / f"{lib['object']}.o").exists()]
    if missing:
        raise SystemExit(f"{build} lacks {', '.join(missing)}.o: build it first")
    generator = build / "attn_generators"
    plugins = args.plugins
    if plugins is None:
        try:
            import halide
            plugins = os.path.join(halide.install_dir(), "lib64")
        except ImportError:
            plugins = ""

    version = ptxas_version(ptxas)

    def one(library):
        # A library generated once for several (tools/manifest.py, aot_libraries) is read from
        # the object it uses (the hand-written variant's), its kernels named as this one's would be.
        obj = build / f"{library['object']}.o"

        def renamed(by_kernel):
            return {k.replace(library["object"], library["name"]): v for k, v in by_kernel.items()}
        cap = args.max_registers or m.gpu_max_registers(library["source"])
        # The object holds the kernels and the host code that launches them, so its bytes key
        # both ptxas's figures and the stmt's launches (--cache: a test run after a build that
        # left the CUDA objects alone assembles and lowers nothing).
        key = hashlib.sha256(obj.read_bytes() + f"{version} {args.gpu_name} {cap}".encode()).hexdigest()
        cached = pathlib.Path(args.cache) / f"{library['name']}.json" if args.cache else None
        if cached and cached.exists() and json.loads(cached.read_text()).get("key") == key:
            entry = json.loads(cached.read_text())
            figures, launched = entry["figures"], {k: {f: tuple(b) for f, b in v.items()}
                                                   for k, v in entry["launched"].items()}
        else:
            figures = renamed(assemble(ptxas, ptx_of(obj), args.gpu_name, cap))
            built = build / f"{library['object']}.stmt"  # the build writes it beside the object
            if built.exists() and built.stat().st_mtime >= obj.stat().st_mtime:
                launched = renamed(launches(built.read_text(errors="replace")))
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    launched = launches(lowered_stmt(generator, plugins, m.target(library["isa"]), library, tmp))
            if cached:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(json.dumps({"key": key, "figures": figures, "launched": launched}))
        strays = sorted(set(launched) ^ set(figures))
        if strays:  # the object and its generator's stmt disagree: a stale build
            raise SystemExit(f"{library['name']}: kernels {', '.join(strays)} are in only one of the object's PTX "
                             "and the generator's stmt; rebuild")
        return [{**k, "cap": cap} for k in
                kernel_rows(f"{library['source']}_{library['isa']}", library["function"], figures, launched)]

    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = [k for ks in pool.map(one, libraries) for k in ks]

    if args.check:
        checked = {f"{s}_{i}" for s, i in m.variants() if m.sources[s]["kind"] in CHECKED_KINDS}
        failures = check(rows, limit, m.layer_functions(), checked)
        variants = dict.fromkeys(k["variant"] for k in rows)
        for v in variants:
            ks = [k for k in rows if k["variant"] == v]
            largest = max(ks, key=lambda k: k["static_shared"] + (k["dynamic_shared"] or 0))
            symbolic = sum(k["dynamic_shared"] is None for k in ks)
            print(f"{v}: {len(ks)} kernels of {len({k['function'] for k in ks})} functions, at most "
                  f"{max(k['registers'] for k in ks)} registers; largest bounded shared memory "
                  f"{largest['static_shared'] + (largest['dynamic_shared'] or 0)} B ({largest['kernel']}); "
                  f"{symbolic} with symbolic dynamic shared memory (held to the limit by the build's "
                  "generators/gpu_shared_memory.cpp and the OpenCL tests)")
        for f in failures:
            print(f"FAIL: {f}")
        return 1 if failures else 0

    bench = pathlib.Path(args.bench) if args.bench else build / "bench" / "attn_bench"
    cuda_variants = {f"{s}_{i}" for s, i in m.variants() if m.isas[i]["device"] == "cuda"}
    command = "python3 tools/gpu_kernels.py --build " + os.path.relpath(build, ROOT)
    if args.gpu_name != "sm_90":
        command += f" --gpu-name {args.gpu_name}"
    if args.max_registers:
        command += f" --max-registers {args.max_registers}"
    doc = {"command": command, "date": datetime.date.today().isoformat(), "gpu_name": args.gpu_name, "ptxas": version,
           "max_registers": args.max_registers or f"{caps['count']} (hand-written and tuned) or "
                                                  f"{caps['autoscheduled_count']} (autoscheduled)",
           "shared_limit": limit, "peak_flops": PEAK_FLOPS, "peak_bytes_per_s": PEAK_BYTES_PER_S,
           "kernels": rows, "work": work_rows(bench, cuda_variants)}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # One kernel or work row a line: a diff of two runs shows what changed.
    rows_text = {key: ",\n  ".join(json.dumps(r, ensure_ascii=False) for r in doc[key]) for key in ("kernels", "work")}
    head = {k: v for k, v in doc.items() if k not in rows_text}
    (out / "kernels.json").write_text(json.dumps(head, indent=1, ensure_ascii=False)[:-2] + ",\n" + ",\n".join(
        f' "{key}": [\n  {text}\n ]' for key, text in rows_text.items()) + "\n}\n")
    (out / "kernels.md").write_text(markdown(doc))
    print(f"wrote {out / 'kernels.md'}, {out / 'kernels.json'}: {len(rows)} kernels of {len(libraries)} objects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
