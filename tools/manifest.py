"""manifest.json, the project's one table, for every consumer: the functions, ISAs,
schedule sources, shape classes and the hand-written schedule's parameters, checked, with
the lists derived from them, and the one builder of generator parameters. At configure time
the build runs it to write the same table for C++ (attn/generated/manifest.h) and for
CMake (attn_manifest.cmake: every AOT library to build, with its generator parameters):

    python3 tools/manifest.py emit --header <dir>/attn/generated/manifest.h --cmake <file> [--arch arm-64]
    python3 tools/manifest.py target arm64      # an ISA's Halide target

    import manifest
    m = manifest.load()
    m.variants()                 # [("autotuned", "sse41"), ...], manifest order
    m.function("attention_layer")["generator"]
    m.generator_params("attention_layer", "adams2019")
"""
import argparse
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATH = ROOT / "manifest.json"
# The tuned sources' winners (tools/autotune.sh writes them): <isa>/<function>.json.
TUNED = ROOT / "generated" / "tuned"
# The measured default order per CPU (tools/dispatch.py writes it).
DISPATCH = ROOT / "generated" / "dispatch.json"

# The dimensions min_shapes may bound, in attn::kProblemDimensions' order (the test
# Manifest.MinShapeDimensionsAreTheRuntimes compares them).
MIN_SHAPE_DIMENSIONS = ["batch", "seq_q", "seq_k", "heads", "head_dim", "hidden"]
SOURCE_KINDS = ["hand-written", "tuned", "frozen", "in-process"]
# The kinds this project writes or tunes: their CUDA kernels are checked (tools/gpu_kernels.py)
# and JIT-compiled at gpu_max_registers' count; the autoschedulers' at autoscheduled_count.
OWN_KINDS = ("hand-written", "tuned")
# The precisions of a function's GEMM operands (DESIGN.md, "Reduced precision"), as attn::Precision lists them.
PRECISIONS = ["fp32", "bf16", "int8"]

# The fused layer's functions come from this generator; every other generator is one stage's.
LAYER_GENERATOR = "attention_layer"


class Manifest:
    def __init__(self, data):
        self.data = data
        self.functions = {f["name"]: f for f in data["functions"]}
        self.isas = {i["name"]: i for i in data["isas"]}
        self.sources = {s["name"]: s for s in data["schedule_sources"]}
        self.shape_classes = {c["name"]: c for c in data["shape_classes"]["classes"]}
        self.manual_parameters = {p["name"]: p for p in data["manual_parameters"]}
        self._check()

    def _check(self):
        def error(message):
            raise ValueError(f"manifest.json: {message}")
        for isa in self.isas.values():
            for source in isa["variants"]:
                if source not in self.sources:
                    error(f"ISA {isa['name']}: unknown schedule source {source!r}")
        for source in self.sources.values():
            name = source["name"]
            if source["kind"] not in SOURCE_KINDS:
                error(f"schedule source {name}: kind {source['kind']!r} is not one of {', '.join(SOURCE_KINDS)}")
            for where, functions in source.get("not_provided", {}).items():
                if where != "all" and where not in self.isas:
                    error(f"{name}: not_provided names unknown ISA {where!r}")
                for f in functions:
                    if f not in self.functions:
                        error(f"{name}: not_provided names unknown function {f!r}")
            for where, bounds in source.get("min_shapes", {}).items():
                if where not in self.isas:
                    error(f"{name}: min_shapes names unknown ISA {where!r}")
                for f, extents in bounds.items():
                    if f not in self.functions:
                        error(f"{name}: min_shapes names unknown function {f!r}")
                    for dimension in extents:
                        if dimension not in MIN_SHAPE_DIMENSIONS:
                            error(f"{name}: min_shapes of {f} on {where} names {dimension!r}, "
                                  f"not one of {', '.join(MIN_SHAPE_DIMENSIONS)}")
            if source.get("min_shapes") and not source.get("min_shapes_because"):
                error(f"schedule source {name} has min_shapes but no min_shapes_because")
        for source, isa, _ in self.min_shape_rows():
            if not self.hand_written(isa):
                error(f"ISA {isa}: schedule source {source} has min_shapes there, so the ISA needs a "
                      "hand-written variant to run the shapes below them")
        generators = {f["generator"] for f in self.functions.values()}
        variant_names = {f"{s}_{i}" for s, i in self.variants()}
        for f in self.functions.values():
            if f.get("precision", "fp32") not in PRECISIONS:
                error(f"{f['name']}: precision {f['precision']!r} is not one of {', '.join(PRECISIONS)}")
            for v in f.get("built_for", []):
                if v not in variant_names:
                    error(f"{f['name']}: built_for names {v!r}, not a variant (<source>_<isa>) of the manifest")
            if "built_for" in f and not f.get("built_for_because"):
                error(f"{f['name']}: built_for needs built_for_because")
            # A reduced precision's function: `<its fp32 function>_<precision>`, with that one's
            # arguments (int8 adds weight_scales; a dense layer kv_is_x, so that self-attention
            # rounds or quantizes x once), and its register tiles for tools/isa_check.py.
            precision = f.get("precision", "fp32")
            if precision != "fp32":
                base = self.functions.get(f["name"].removesuffix("_" + precision))
                if not f["name"].endswith("_" + precision) or base is None or base.get("precision", "fp32") != "fp32":
                    error(f"{f['name']}: a {precision} function is named <an fp32 function>_{precision}")
                elif [a for a in f["arguments"] if a not in ("weight_scales", "kv_is_x")] != base["arguments"]:
                    error(f"{f['name']}: expected the arguments of {base['name']} (and weight_scales in int8, "
                          "kv_is_x in a dense layer)")
                if not f.get("register_tiles") or any(t not in f["manual_parameters"] for t in f["register_tiles"]):
                    error(f"{f['name']}: register_tiles lists its products' register tiles, each by the manual "
                          "parameter of its vectors (one of its manual_parameters)")
            if f.get("tuned_with", f["generator"]) not in generators:
                raise ValueError(f"manifest.json: {f['name']}: tuned_with names unknown generator {f['tuned_with']!r}")
            for p in f["manual_parameters"]:
                if p not in self.manual_parameters:
                    raise ValueError(f"manifest.json: {f['name']}: unknown manual parameter {p!r}")
        for name, isa in self.isas.items():
            if any(p not in PRECISIONS for p in isa.get("precisions", [])):
                error(f"ISA {name}: precisions must be of {', '.join(PRECISIONS)}")
            if isa["device"] == "cpu" and not isinstance(isa.get("vector_registers"), int):
                raise ValueError(f"manifest.json: CPU ISA {name} needs vector_registers (the register tiles' bound)")
        for name, p in self.manual_parameters.items():
            if p.get("device", "all") not in ("all", "gpu"):
                raise ValueError(f"manifest.json: manual parameter {name}: device {p['device']!r} is not all or gpu")
            for key in ("search", "gpu_search"):
                if any(not p["min"] <= v <= p["max"] for v in p.get(key, [])):
                    raise ValueError(f"manifest.json: manual parameter {name}: a {key} value is outside "
                                     f"[{p['min']}, {p['max']}]")

    def function(self, name):
        return self.functions[name]

    def generator_params(self, function, source=None, params=None, autoscheduler_run=False):
        """The generator parameters of one AOT function: the one builder, for the build (through
        the emitted .cmake), `attn generate` (through the header), the autotuner and the
        freezer. The function, how it is scheduled, and the function's own parameters:
          - source, no params: the source's schedule (hand-written, frozen or in process);
          - params: the hand-written schedule with them (a tuned source's winner, a candidate);
          - autoscheduler_run: the source's autoscheduler run now with `params` (freezing, tuning).
        With no source, only the function's own parameters."""
        out = [] if source is None else [f"function={function}"]
        if autoscheduler_run:
            out += [f"autoscheduler={self.sources[source]['autoscheduler']}"]
            out += [f"autoscheduler.{k}={v}" for k, v in params.items()]
        elif params is not None:
            uses = self.functions[function]["manual_parameters"]
            out += ["schedule=manual"] + [f"{k}={v}" for k, v in params.items() if k in uses]
        elif source is not None:
            out += [f"schedule={source}"]
        return out + [f"{k}={v}" for k, v in self.functions[function]["params"].items()]

    def plugin(self, source):
        """The file name of the autoscheduler plugin the source's generator run loads, or None."""
        name = self.sources[source].get("autoscheduler")
        return f"libautoschedule_{name.lower()}.so" if name else None

    def functions_of_generator(self, generator):
        return [name for name, f in self.functions.items() if f["generator"] == generator]

    def functions_tuned_with(self, generator):
        """The functions a tuning of the generator's parameters serves: its own, and those of
        other generators that run the same schedule code (tuned_with)."""
        return [name for name, f in self.functions.items() if f.get("tuned_with", f["generator"]) == generator]

    def fused(self, function):
        """Whether the function is of the fused layer's family: the layer generator's functions
        and those tuned with it (attention_core, its flash core alone), which share the
        autoscheduler limits of fused_layer_params."""
        return function in self.functions_tuned_with(LAYER_GENERATOR)

    def packed_twin(self, function):
        """The function of the same generator and params computing packed sequences, or None."""
        f = self.functions[function]
        if f["params"].get("packed") == "true":
            return None
        want = {**f["params"], "packed": "true"}
        return next((name for name, g in self.functions.items()
                     if g["generator"] == f["generator"] and g["params"] == want), None)

    def stage_functions(self):
        """The fp32 functions of the stages (every generator but the fused layer's); a stage's
        reduced-precision function (<stage>_bf16) is timed as <variant>_bf16 beside it."""
        return [name for name, f in self.functions.items()
                if f["generator"] != LAYER_GENERATOR and self.precision(name) == "fp32"]

    def layer_functions(self):
        return self.functions_of_generator(LAYER_GENERATOR)

    def variants(self, kind=None, arch=None):
        """(source, ISA) of every variant, in manifest order; only sources of `kind` and ISAs of
        `arch` if given."""
        return [(s, i) for i, isa in self.isas.items() for s in isa["variants"]
                if (kind is None or self.sources[s]["kind"] == kind) and (arch is None or self.arch(i) == arch)]

    def provides(self, source, isa, function):
        """Whether the variant <source>_<isa> has the function: its source's not_provided, and the
        function's built_for (the variants it is built for, when it names them). ISA "all": on
        some ISA."""
        not_provided = self.sources[source].get("not_provided", {})
        if function in not_provided.get("all", []) + not_provided.get(isa, []):
            return False
        if self.precision(function) not in self.isas.get(isa, {}).get("precisions", PRECISIONS):
            return False
        built_for = self.functions[function].get("built_for")
        if built_for is None:
            return True
        return any(v == f"{source}_{isa}" or (isa == "all" and v.startswith(source + "_")) for v in built_for)

    def not_provided_rows(self):
        """(source, ISA or "all", function) of every variant without a function: its source's
        not_provided, and the variants a function's built_for leaves out."""
        rows = [(n, where, f) for n, s in self.sources.items()
                for where, functions in s.get("not_provided", {}).items() for f in functions]
        for function in self.functions:
            rows += [(source, name, function) for name, isa in self.isas.items()
                     if self.precision(function) not in isa.get("precisions", PRECISIONS) for source in isa["variants"]]
            if "built_for" not in self.functions[function]:
                continue
            for source in self.sources:
                if not self.provides(source, "all", function):
                    rows.append((source, "all", function))
                else:
                    rows += [(source, isa, function) for isa in self.isas if not self.provides(source, isa, function)]
        return rows

    def precision(self, function):
        return self.functions[function].get("precision", "fp32")

    def is_gpu(self, isa):
        return self.isas[isa]["device"] != "cpu"

    def gpu_max_registers(self, source):
        """The register cap CUDA's JIT compiles a source's kernels with (gpu_max_registers): the
        hand-written and tuned kernels' `count`; the autoscheduled ones' `autoscheduled_count`."""
        caps = self.data["gpu_max_registers"]
        kind = self.sources[source]["kind"] if source in self.sources else "hand-written"
        return caps["count"] if kind in OWN_KINDS else caps["autoscheduled_count"]

    def target(self, isa):
        return self.isas[isa]["halide_target"]

    def f32_lanes(self, isa):
        """Floats in one of the ISA's vectors (Halide's natural_vector_size<float>, which the test
        Manifest.F32LanesAreHalides checks): the width of the panels a CPU's fp32 layer reads its
        prepared weights in (attn_gen::WeightLayout::panels); 0 on a GPU, whose weights stay rows."""
        if self.is_gpu(isa):
            return 0
        features = self.target(isa).split("-")[2:]
        return 16 if "avx512" in features else 8 if "avx" in features else 4

    def arch(self, isa):
        """The ISA's architecture: the first two parts of its Halide target (x86-64, arm-64)."""
        return "-".join(self.target(isa).split("-")[:2])

    def runtime_target(self, arch):
        targets = {a: t for a, t in self.data["runtime_target"].items() if a != "about"}
        if arch not in targets:
            raise ValueError(f"runtime_target has no entry for architecture {arch!r} (it has {', '.join(targets)})")
        return targets[arch]

    def autoscheduler_params(self, source, isa, function):
        """key=value parameters of the source's autoscheduler on the ISA's device, for the function."""
        s = self.sources[source]
        params = dict(s.get("autoscheduler_params", {}).get("gpu" if self.is_gpu(isa) else "cpu", {}))
        if self.fused(function):
            params.update(s.get("fused_layer_params", {}))
        return params

    def autoschedulers(self):
        """The sources an autoscheduler makes (frozen or run in process)."""
        return [name for name, s in self.sources.items() if s.get("autoscheduler")]

    def frozen_isas(self, source):
        """The ISAs with a variant of the frozen source, as the frozen schedules are kept: an ISA
        that reuses another's (frozen_schedules_of) counts as that one."""
        isas = [self.isas[i].get("frozen_schedules_of", i) for s, i in self.variants("frozen") if s == source]
        return list(dict.fromkeys(isas))

    def manual_defaults(self, gpu=False, arm=False):
        """Each hand-written parameter's default on a CPU, on a GPU (its gpu_default) or on Arm
        (its arm_default)."""
        return {name: p.get("gpu_default", p["default"]) if gpu else p.get("arm_default", p["default"]) if arm
                else p["default"] for name, p in self.manual_parameters.items()}

    def tuning_parameters(self, function, gpu=False):
        """The hand-written parameters a schedule of the function reads on a CPU, or on a GPU:
        the GPU schedule reads the GPU-only ones (device "gpu"), and those with GPU values to
        search (gpu_search: the query and key blocks) where it runs the flash core, in the
        functions with a key_block; the CPU schedule reads every other."""
        uses = self.functions[function]["manual_parameters"]

        def on_gpu(p):
            return p.get("device") == "gpu" or ("gpu_search" in p and "key_block" in uses)
        return [n for n in uses
                if (on_gpu(self.manual_parameters[n]) if gpu else self.manual_parameters[n].get("device") != "gpu")]

    def hand_written(self, isa):
        """The ISA's hand-written schedule source (the fallback of its other variants), or None."""
        return next((s for s in self.isas[isa]["variants"] if self.sources[s]["kind"] == "hand-written"), None)

    def min_shape_rows(self):
        """(source, ISA, {dimension: extent}) of every min_shapes entry, for the ISA it names and
        every ISA that takes its frozen schedules (frozen_schedules_of) with a variant of the source."""
        rows = []
        for name, source in self.sources.items():
            for where, bounds in source.get("min_shapes", {}).items():
                for isa, entry in self.isas.items():
                    if entry.get("frozen_schedules_of", isa) == where and name in entry["variants"]:
                        rows += [(name, isa, {"function": f, **extents}) for f, extents in bounds.items()]
        return rows

    def tuned_classes(self, isa, function):
        """A tuned source's compiled functions of one ISA: [(shape classes, hand-written params)],
        from generated/tuned/<isa>/<function>.json."""
        path = TUNED / isa / f"{function}.json"
        if not path.exists():
            raise ValueError(f"{path.relative_to(ROOT)} is missing: the autotuned variant of {isa} needs a winner for "
                             f"{function}; run tools/autotune.sh --isa {isa} --function "
                             f"{self.functions[function].get('tuned_with', function)}")
        entries = json.loads(path.read_text())["classes"]
        for e in entries:
            for c in e["shape_classes"]:
                if c not in self.shape_classes:
                    raise ValueError(f"{path}: shape class {c!r} is not one of manifest.json's "
                                     f"({', '.join(self.shape_classes)})")
        return [(e["shape_classes"], e["params"]) for e in entries]

    @staticmethod
    def tuned_text(function, classes):
        """A tuned source's winners of one function as generated/tuned/<isa>/<function>.json
        holds them: [(shape classes, params)], one line each; the search that chose them is in
        <function>.provenance.json beside it."""
        lines = [json.dumps({"shape_classes": c, "params": p}) for c, p in classes]
        return ("{\n" f' "function": {json.dumps(function)},\n'
                f' "provenance": {json.dumps(function + ".provenance.json")},\n'
                ' "classes": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n")

    def max_seq(self, classes):
        """The largest max(S_q, S_k) the classes serve together (0: unbounded)."""
        bounds = [self.shape_classes[c].get("max_seq", 0) for c in classes]
        return 0 if 0 in bounds else max(bounds)

    def built_variants(self, arch, only=None):
        """The variants a build for `arch` makes: its architecture's, and of those only the
        names (<source>_<isa>) matching `only` (a regex, ATTN_ONLY_VARIANTS) if given."""
        return [(s, i) for s, i in self.variants(arch=arch) if not only or re.search(only, f"{s}_{i}")]

    def generation_key(self, isa, generator, params):
        """What a generator run's output depends on: the generator, the ISA's target and the
        parameters, the hand-written schedule's given or defaulted as the generator resolves them
        (schedules/schedule_source.cpp: manual_parameter_for), the function's name left out."""
        given = dict(p.split("=", 1) for p in params if not p.startswith("function="))
        if given.get("schedule") == "manual":
            defaults = self.manual_defaults(gpu=self.is_gpu(isa), arm=self.arch(isa) == "arm-64")
            for name, p in self.manual_parameters.items():
                # A parameter with a default of its own on a GPU or on Arm is 0 until resolved.
                takes_target_default = p["default"] != p.get("gpu_default", p["default"]) or \
                    p["default"] != p.get("arm_default", p["default"])
                if name not in given or (given[name] == "0" and takes_target_default):
                    given[name] = str(defaults[name])
        return (generator, self.target(isa), tuple(sorted(given.items())))

    def aot_libraries(self, arch, only=None):
        """Every AOT library of the build for `arch`, in manifest order: one per built variant,
        provided function and (for a tuned source) entry of its shape classes. Each is a dict:
        name, source, isa, function, generator, max_seq, plugin (a CMake target), params, and
        object: the library whose generated object it uses. That is its own name, or, where
        libraries have the same generator run (a tuned winner that is the hand-written default,
        a class whose winner another class has), the hand-written variant's library, else the
        first in manifest order: the kernels would be the same, instruction for instruction, so
        they are generated once."""
        libraries, first = [], {}
        for source, isa in self.built_variants(arch, only):
            for function, f in self.functions.items():
                if not self.provides(source, isa, function):
                    continue
                if self.sources[source]["kind"] == "tuned":
                    entries = self.tuned_classes(isa, function)
                    builds = [(("_" + classes[0]) if len(entries) > 1 else "", self.max_seq(classes),
                               self.generator_params(function, source, params)) for classes, params in entries]
                else:
                    builds = [("", 0, self.generator_params(function, source))]
                for suffix, max_seq, params in builds:
                    plugin = self.sources[source].get("plugin", "")
                    libraries.append({"name": f"attn_{function}_{source}_{isa}{suffix}", "source": source,
                                      "isa": isa, "function": function, "generator": f["generator"],
                                      "max_seq": max_seq, "plugin": plugin, "params": params,
                                      "key": (plugin, self.generation_key(isa, f["generator"], params))})
        # The hand-written variant's own objects first, so that a build of it alone (the
        # sanitizer run's) finds them under its names in a build of every variant.
        for lib in sorted(libraries, key=lambda lib: self.sources[lib["source"]]["kind"] != "hand-written"):
            first.setdefault(lib["key"], lib["name"])
        return [{**{k: v for k, v in lib.items() if k != "key"}, "object": first[lib["key"]]} for lib in libraries]

    def inputs(self, arch, only=None):
        """The files the emitted tables of a build's variants depend on."""
        tuned = [TUNED / isa / f"{function}.json" for source, isa in self.built_variants(arch, only)
                 if self.sources[source]["kind"] == "tuned"
                 for function in self.functions if self.provides(source, isa, function)]
        return [PATH, pathlib.Path(__file__).resolve(), DISPATCH] + tuned


def load(path=PATH):
    return Manifest(json.loads(pathlib.Path(path).read_text()))


# ---- the C++ header and the CMake include ----

def _c(text):
    """A C string literal."""
    return json.dumps(text, ensure_ascii=False)


def _names(items):
    """A Names literal: a list of string literals (empty: Names{})."""
    return "Names{{" + ", ".join(_c(i) for i in items) + "}}"


HEADER = """\
// Generated by tools/manifest.py from manifest.json. Do not edit.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <string_view>

namespace attn::manifest {{

// A list of names (or of key=value parameters), iterable.
struct Names {{
    std::initializer_list<const char *> items;
    constexpr const char *const *begin() const {{ return items.begin(); }}
    constexpr const char *const *end() const {{ return items.end(); }}
    constexpr std::size_t size() const {{ return items.size(); }}
    constexpr bool contains(std::string_view name) const {{
        for (const char *item : items) {{
            if (name == item) return true;
        }}
        return false;
    }}
}};

struct Function {{
    const char *name, *stage, *generator;
    Names params;  // its own generator parameters, key=value
    Names arguments, manual_parameters;
    bool fused_layer;  // of the fused layer's generator; else a stage, or the attention core
    const char *precision;  // of its GEMMs' operands: "fp32", "bf16" or "int8" (attn::Precision)
}};
inline constexpr Function kFunctions[] = {{
{functions}}};

struct Isa {{
    const char *name, *halide_target, *device;
    Names cpu_features;
    int dispatch_rank;  // 0: chosen by name only
    bool cross_compiled;  // for another architecture than this build's: never linked here
    const char *frozen_schedules_of;
    Names variants;  // the schedule sources it is built with
    int f32_lanes;  // floats a vector: an fp32 CPU layer's weight panels (attn_gen::WeightLayout::panels); 0: GPU
}};
inline constexpr Isa kIsas[] = {{
{isas}}};

struct ScheduleSource {{
    const char *name, *kind;
    int dispatch_priority;  // 0: chosen by name only
    const char *autoscheduler;
    Names cpu_params, gpu_params;  // the autoscheduler's, key=value
    Names not_bitwise_reproducible_on;  // ISAs
    const char *min_shapes_because;  // why its kernels need the extents of kMinShapes
    int gpu_max_registers;  // CUDA's JIT register cap for its kernels (manifest.json: gpu_max_registers)
}};
inline constexpr ScheduleSource kScheduleSources[] = {{
{sources}}};

// The smallest extents a source's own kernels of a function run on an ISA (min_shapes;
// an ISA with frozen_schedules_of inherits them); below them, a call runs the ISA's
// hand-written variant. Every other (source, ISA, function) runs every shape.
inline constexpr const char *kMinShapeDimensions[] = {{{dimensions}}};
struct MinShape {{
    const char *source, *isa, *function;
    long long extents[std::size(kMinShapeDimensions)];  // by kMinShapeDimensions (attn::kProblemDimensions)
}};
inline constexpr std::initializer_list<MinShape> kMinShapes = {{
{min_shapes}}};

struct NotProvided {{
    const char *source, *isa, *function;  // isa "all": on every ISA
}};
inline constexpr std::initializer_list<NotProvided> kNotProvided = {{
{not_provided}}};

struct ShapeClass {{
    const char *name;
    int max_seq;  // the largest max(S_q, S_k) of the class; 0: no bound
}};
inline constexpr ShapeClass kShapeClasses[] = {{
{classes}}};

// The shared memory a GPU kernel's block may use (manifest.json: gpu_shared_memory_per_block).
inline constexpr int kGpuSharedMemoryPerBlock = {shared_memory};
// The registers a hand-written or tuned CUDA kernel's thread may use (manifest.json:
// gpu_max_registers); each schedule source's cap is ScheduleSource::gpu_max_registers.
inline constexpr int kGpuMaxRegisters = {max_registers};

// The hand-written schedule's parameters: each one's one home (tools/autotune.py searches them).
struct ManualParameter {{
    const char *name;
    int default_value, gpu_default, arm_default, min, max;
}};
inline constexpr ManualParameter kManualParameters[] = {{
{parameters}}};

constexpr const ManualParameter &manual_parameter(std::string_view name) {{
    for (const ManualParameter &p : kManualParameters) {{
        if (name == p.name) return p;
    }}
    throw "manifest.json: no such manual parameter";
}}

// The generator parameters of each function of each schedule source that is not tuned, on
// a target of the caller's (attn generate): tools/manifest.py's builder, as the build uses it.
struct GeneratorParams {{
    const char *source, *function;
    Names params;
    const char *plugin;  // the autoscheduler plugin library it loads, or ""
}};
inline constexpr GeneratorParams kGeneratorParams[] = {{
{generator_params}}};

}}  // namespace attn::manifest

// X("feature") for every CPU feature an ISA needs (__builtin_cpu_supports takes literals).
#define ATTN_FOR_EACH_CPU_FEATURE(X){features}
"""


def emit_header(m, path, arch):
    rows = lambda items: "".join(f"    {{{i}}},\n" for i in items)  # noqa: E731
    functions = [", ".join([_c(n), _c(f["stage"]), _c(f["generator"]), _names(m.generator_params(n)),
                            _names(f["arguments"]), _names(f["manual_parameters"]),
                            "true" if f["generator"] == LAYER_GENERATOR else "false", _c(m.precision(n))])
                 for n, f in m.functions.items()]
    isas = [", ".join([_c(n), _c(i["halide_target"]), _c(i["device"]), _names(i.get("cpu_features", [])),
                       str(i.get("dispatch_rank", 0)), "true" if m.arch(n) != arch else "false",
                       _c(i.get("frozen_schedules_of", n)), _names(i["variants"]), str(m.f32_lanes(n))])
            for n, i in m.isas.items()]
    sources = []
    for n, s in m.sources.items():
        params = s.get("autoscheduler_params", {})
        sources.append(", ".join([_c(n), _c(s["kind"]), str(s.get("dispatch_priority", 0)),
                                  _c(s.get("autoscheduler", "")),
                                  _names([f"{k}={v}" for k, v in params.get("cpu", {}).items()]),
                                  _names([f"{k}={v}" for k, v in params.get("gpu", {}).items()]),
                                  _names(s.get("not_bitwise_reproducible_on", [])),
                                  _c(s.get("min_shapes_because", "")), str(m.gpu_max_registers(n))]))
    min_shapes = [", ".join([_c(source), _c(isa), _c(e["function"])]) + ", {" +
                  ", ".join(str(e.get(d, 1)) for d in MIN_SHAPE_DIMENSIONS) + "}"
                  for source, isa, e in m.min_shape_rows()]
    not_provided = [", ".join([_c(n), _c(where), _c(f)]) for n, where, f in m.not_provided_rows()]
    classes = [f"{_c(n)}, {c.get('max_seq', 0)}" for n, c in m.shape_classes.items()]
    parameters = [", ".join([_c(n), str(p["default"]), str(p.get("gpu_default", p["default"])),
                             str(p.get("arm_default", p["default"])), str(p["min"]),
                             str(p["max"])]) for n, p in m.manual_parameters.items()]
    generator_params = [", ".join([_c(source), _c(function), _names(m.generator_params(function, source)),
                                   _c(m.plugin(source) if s["kind"] == "in-process" else "")])
                        for source, s in m.sources.items() if s["kind"] != "tuned"
                        for function in m.functions if m.provides(source, "all", function)]
    features = list(dict.fromkeys(f for n, i in m.isas.items() if m.arch(n) == arch for f in i["cpu_features"]))
    text = HEADER.format(functions=rows(functions), isas=rows(isas), sources=rows(sources),
                         dimensions=", ".join(_c(d) for d in MIN_SHAPE_DIMENSIONS), min_shapes=rows(min_shapes),
                         not_provided=rows(not_provided), classes=rows(classes),
                         shared_memory=m.data["gpu_shared_memory_per_block"]["bytes"],
                         max_registers=m.data["gpu_max_registers"]["count"], parameters=rows(parameters),
                         generator_params=rows(generator_params),
                         features="".join(f" X({_c(f)})" for f in features))
    _write_if_changed(path, text)


def emit_dispatch_header(m, path):
    """generated/dispatch.json as attn/generated/dispatch.h: read by the runtime's dispatch
    alone, so that a new measurement rebuilds no kernel."""
    measured = json.loads(DISPATCH.read_text())["measured"] if DISPATCH.exists() else []
    rows = []
    variants = {f"{s}_{i}" for s, i in m.variants()}
    for e in measured:
        for name, c in e.get("classes", {}).items():
            if name not in m.shape_classes:
                raise ValueError(f"generated/dispatch.json: {e['cpu_model']}: no shape class {name!r} in manifest.json")
        for name in [v for order in [e["order"]] + [c["order"] for c in e.get("classes", {}).values()] for v in order]:
            if name not in variants:
                raise ValueError(f"generated/dispatch.json: {e['cpu_model']}: no variant {name!r} in manifest.json")
        classes = "{" + ", ".join("{" + _c(name) + ", " + _names(c["order"]) + "}"
                                  for name, c in e.get("classes", {}).items()) + "}"
        rows.append("    {" + ", ".join([_c(e["cpu_model"]), _c(e.get("cpu_id", "")), _names(e["isas"]), _c(e["date"]),
                                          _c(e["source"]),
                                          _names(e["order"]), classes]) + "},\n")
    text = ("// Generated by tools/manifest.py from generated/dispatch.json (tools/dispatch.py). Do not edit.\n"
            "#pragma once\n\n#include \"attn/generated/manifest.h\"\n\nnamespace attn::manifest {\n\n"
            "// One shape class's ranking: the variants timed on every problem of the class, closest to\n"
            "// the fastest first.\n"
            "struct ClassOrder {\n    const char *shape_class;\n    Names order;\n};\n\n"
            "// A measured default: on a CPU of this model name and id (\"\": any id, for a measurement\n"
            "// made before ids were recorded) whose widest instruction set is among `isas`, the first\n"
            "// variant of `order` that runs (the variants timed on every problem, closest to the fastest\n"
            "// first); a call of a shape class, the first of that class's order that runs.\n"
            "struct MeasuredOrder {\n    const char *cpu_model, *cpu_id;\n    Names isas;\n    const char *date, *source;\n"
            "    Names order;\n    std::initializer_list<ClassOrder> classes;\n};\n"
            "inline constexpr std::initializer_list<MeasuredOrder> kMeasuredOrders = {\n"
            + "".join(rows) + "};\n\n}  // namespace attn::manifest\n")
    _write_if_changed(path, text)


def emit_cmake(m, path, arch, only):
    """The build's data: the runtime target, the ISAs of its architecture, every variant's AOT
    libraries with their generator parameters (cmake/AttnVariants.cmake builds them), and the
    files they came from."""
    def cmake_list(items):
        return " ".join(f"[==[{i}]==]" for i in items)
    lines = ["# Generated by tools/manifest.py from manifest.json and generated/tuned/. Do not edit.",
             f"set(ATTN_RUNTIME_TARGET [==[{m.runtime_target(arch)}]==])",
             f"set(ATTN_MANIFEST_INPUTS {cmake_list(str(p) for p in m.inputs(arch, only))})"]
    for name, isa in m.isas.items():
        if m.arch(name) == arch:
            lines.append(f"set(ATTN_ISA_{name}_TARGET [==[{isa['halide_target']}]==])")
    variants = [f"{s}_{i}" for s, i in m.built_variants(arch, only)]
    lines.append(f"set(ATTN_VARIANTS {' '.join(variants)})")
    libraries = m.aot_libraries(arch, only)
    for v in variants:
        names = [lib["name"] for lib in libraries if f"{lib['source']}_{lib['isa']}" == v]
        source, isa = next((lib["source"], lib["isa"]) for lib in libraries if f"{lib['source']}_{lib['isa']}" == v)
        lines.append(f"set(ATTN_VARIANT_{v} SOURCE {source} ISA {isa} LIBRARIES {' '.join(names)})")
    for lib in libraries:
        plugin = f" PLUGIN {lib['plugin']}" if lib["plugin"] else ""
        same = f" SAME_AS {lib['object']}" if lib["object"] != lib["name"] else ""
        lines.append(f"set(ATTN_LIBRARY_{lib['name']} FUNCTION {lib['function']} GENERATOR {lib['generator']} "
                     f"MAX_SEQ {lib['max_seq']}{plugin}{same} PARAMS {cmake_list(lib['params'])})")
    _write_if_changed(path, "\n".join(lines) + "\n")


def _write_if_changed(path, text):
    """Leaves an unchanged file as it is, so that nothing depending on it rebuilds."""
    path = pathlib.Path(path)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    emit = sub.add_parser("emit", help="write the C++ header and the CMake include")
    emit.add_argument("--header", required=True)
    emit.add_argument("--dispatch-header", help="also write generated/dispatch.json's table here")
    emit.add_argument("--cmake", required=True)
    emit.add_argument("--only-variants", default="", help="a regex over variant names (ATTN_ONLY_VARIANTS)")
    emit.add_argument("--arch", default="x86-64", help="the build's architecture: x86-64 or arm-64")
    target = sub.add_parser("target", help="print an ISA's Halide target")
    target.add_argument("isa")
    args = parser.parse_args()
    try:
        m = load()
    except (ValueError, KeyError, FileNotFoundError) as e:
        sys.exit(f"tools/manifest.py: {e}")
    if args.command == "target":
        if args.isa not in m.isas:
            sys.exit(f"tools/manifest.py: no ISA {args.isa!r} (manifest.json has {', '.join(m.isas)})")
        print(m.target(args.isa))
        return
    try:
        emit_header(m, args.header, args.arch)
        if args.dispatch_header:
            emit_dispatch_header(m, args.dispatch_header)
        emit_cmake(m, args.cmake, args.arch, args.only_variants)
    except ValueError as e:
        sys.exit(f"tools/manifest.py: {e}")


if __name__ == "__main__":
    main()
