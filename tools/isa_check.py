#!/usr/bin/env python3
"""The instructions a reduced-precision function compiles to, checked in its object file, as
Halide's own simd_op_check does: every bf16 function (manifest.json: precision) built for an
ISA with avx512bf16 must use vdpbf16ps, and every int8 one built for an ISA with avx512vnni
vpdpbusd, in each of its register tiles (manifest.json: register_tiles); one built for an ISA without the feature (the
fallback) must use none, and no AVX-512 register either, so that it runs where AVX-512 does not; an int8 fallback
must use vpmaddubsw in each of its register tiles instead (its pairs summed in 16 bits, attn_gen::Int8Sum). On an
ISA with AMX (avx512_sapphirerapids), a layer's four projections are AMX tile products instead (tdpbf16ps, tdpbusd:
at least 4 in all, one a projection), and so are its flash core's QKᵀ and P·V (tdpbf16ps, at least 2 in the
core's parallel tasks), and the core alone's; elsewhere no tile instruction. A bf16 flash core (a layer's, or
the core alone's) built for an ISA with avx512bf16 rounds its exponentials with vcvtne2ps2bf16 in its parallel
tasks; elsewhere no function uses it.

    python3 tools/isa_check.py --build build/release          # every bf16 and int8 object this build made
    python3 tools/isa_check.py --build build/release --show   # and the counts per object

Exits 1 naming each object that breaks the rule, 0 when all hold (and when the build made none:
a build of another architecture, or of a subset of the variants, says so).
"""
import argparse
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import manifest  # noqa: E402

# Per reduced precision: the instruction of its products, the CPU feature it needs
# (manifest.json's cpu_features name), and the fallback's instruction (None: plain f32 arithmetic).
INSTRUCTIONS = {"bf16": ("vdpbf16ps", "avx512bf16", None), "int8": ("vpdpbusd", "avx512vnni", "vpmaddubsw")}
# On an ISA with AMX (its feature per precision), a layer's four projections are AMX tile
# products (attn_gen::Linear::amx_tile) instead of register tiles, and its bf16 flash core's two
# products too (attn_gen::FlashAttention::dot_tile, context_tile): at least one tile instruction each.
# The core's are those in its parallel tasks, the functions Halide names after its Func `ctx`.
AMX = {"bf16": ("tdpbf16ps", "amx-bf16"), "int8": ("tdpbusd", "amx-int8")}
AMX_PROJECTIONS = 4
AMX_CORE = ("tdpbf16ps", 2)
CORE_TASKS = re.compile(r"_par_for_ctx")
# A bf16 flash core's rounding of its exponentials (attn_gen::Bf16Core::rounding_instruction),
# the feature it needs, and when the generator uses it: the hand-written schedule on a Halide
# target with avx512_zen4 (which alone gives LLVM avx512bf16 in Halide 21).
CORE_ROUNDING = ("vcvtne2ps2bf16", "avx512bf16")


def rounds_with_instruction(m, lib):
    params = m.functions[lib["function"]]["params"]
    core_precision = {"attention_layer": params.get("core_precision", "fp32"),
                      "attention_core": params.get("precision", "fp32")}.get(lib["generator"], "fp32")
    return (core_precision == "bf16" and lib["source"] == "manual" and
            "avx512_zen4" in m.isas[lib["isa"]]["halide_target"].split("-"))


def count(disassembly, pattern):
    return len(re.findall(pattern, disassembly))


def count_by_function(disassembly, instructions, functions):
    """Per instruction, how many lines use it inside and outside the functions whose symbol
    matches `functions`, as objdump lists them (a `<symbol>:` line opens each), in one pass."""
    counts = {i: [0, 0] for i in instructions}
    patterns = {i: re.compile(rf"\b{i}\b") for i in instructions}
    inside = False
    for line in disassembly.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            inside = bool(functions.search(header.group(1)))
            continue
        for i, pattern in patterns.items():
            if pattern.search(line):
                counts[i][0 if inside else 1] += 1
    return {i: tuple(c) for i, c in counts.items()}


def check(m, build, arch, show):
    failures, checked = [], 0
    for lib in m.aot_libraries(arch):
        precision = m.precision(lib["function"])
        if precision not in INSTRUCTIONS or lib["object"] != lib["name"]:
            continue  # (a library generated once for several is checked as the one whose object it uses)
        instruction, feature, fallback = INSTRUCTIONS[precision]
        path = pathlib.Path(build) / f"{lib['name']}.o"
        if not path.exists():
            continue  # not made by this build (ATTN_ONLY_VARIANTS, or prebuilt kernels)
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True,
                              check=True).stdout
        dot, zmm = count(text, rf"\b{instruction}\b"), count(text, r"%zmm\d+")
        fallback_dot = count(text, rf"\b{fallback}\b") if fallback else 0
        native = feature in m.isas[lib["isa"]]["cpu_features"]
        # Each register tile is at least the hand-written schedule's rows × its vectors (the
        # manual parameters' defaults) products: fewer, and some tile lost the instruction.
        defaults = {p["name"]: p["default"] for p in m.data["manual_parameters"]}
        tiles = m.functions[lib["function"]]["register_tiles"]
        tile_instruction, amx_feature = AMX[precision]
        layer = lib["generator"] == "attention_layer"
        amx = amx_feature in m.isas[lib["isa"]]["cpu_features"] and (layer or lib["generator"] == "attention_core")
        # The tile products an AMX function needs: its projections' (a layer's) outside the core's
        # tasks, and its core's in them; none of either kind in the other's place.
        core_instruction, core_tiles = AMX_CORE
        rounding, rounding_feature = CORE_ROUNDING
        by_function = count_by_function(text, {core_instruction, tile_instruction, rounding}, CORE_TASKS)
        core_dot, core_outside = by_function[core_instruction]
        projection_inside, projection_dot = by_function[tile_instruction]
        misplaced = 0 if core_instruction == tile_instruction else core_outside + projection_inside
        rounding_in_core, rounding_outside = by_function[rounding]
        rounding_needed = rounds_with_instruction(m, lib)
        tile_counts = {"projections": (projection_dot, tile_instruction, AMX_PROJECTIONS if layer else 0),
                       "core": (core_dot, core_instruction, core_tiles)}
        if amx:
            # (every product is an AMX tile's there: no register tile has vdpbf16ps or vpdpbusd,
            # schedules/cpu_manual.cpp's native_bf16)
            tiles, native = [], False
        needed = sum(defaults["tile_rows"] * defaults[t] for t in tiles)
        checked += 1
        if show:
            tile_text = ", ".join(f"{n} {i} ({where})" for where, (n, i, _) in tile_counts.items())
            print(f"{lib['name']}: {dot} {instruction}, {fallback_dot} {fallback or '-'}, {tile_text}, "
                  f"{rounding_in_core} {rounding} (core), "
                  f"{zmm} zmm operands ({'AMX' if amx else 'native' if native else 'fallback'})")
        for where, (n, i, needed_tiles) in tile_counts.items():
            if amx and n < needed_tiles:
                what = "its projections'" if where == "projections" else "its flash core's QKᵀ and P·V"
                failures.append(f"{path.name}: {n} {i} in {where}, expected at least {needed_tiles} ({what} tiles) "
                                f"on {lib['isa']}, which has {amx_feature}")
            if not amx and n:
                failures.append(f"{path.name}: {n} {i} on {lib['isa']}, whose {lib['function']} has no AMX tiles")
        if rounding_needed and not rounding_in_core:
            failures.append(f"{path.name}: no {rounding} in its flash core's tasks, which round the exponentials "
                            f"to bf16 with it on {lib['isa']}, which has {rounding_feature}")
        if rounding_outside or (rounding_in_core and not rounding_needed):
            failures.append(f"{path.name}: {rounding_in_core + rounding_outside} {rounding}, which only a bf16 flash "
                            f"core's tasks use, from the hand-written schedule on an ISA with {rounding_feature}")
        if misplaced:
            failures.append(f"{path.name}: {misplaced} {core_instruction} outside its flash core or "
                            f"{tile_instruction} inside it")
        if native and dot < needed:
            failures.append(f"{path.name}: {dot} {instruction}, expected at least {needed} (its {len(tiles)} register "
                            f"tiles) on {lib['isa']}, which has {feature}")
        if not native and (dot or (zmm and "avx512f" not in m.isas[lib["isa"]]["cpu_features"])):
            failures.append(f"{path.name}: {dot} {instruction} and {zmm} zmm operands on {lib['isa']}, which has "
                            f"neither {feature} nor, unless listed, AVX-512")
        # (The int8 fallback's tiles hold fewer rows, as many as the registers allow beside the
        # pairs' operands: at least one row of each tile's vectors.)
        fallback_needed = sum(defaults[t] for t in tiles)
        if not native and fallback and fallback_dot < fallback_needed:
            failures.append(f"{path.name}: {fallback_dot} {fallback}, expected at least {fallback_needed} (its "
                            f"{len(tiles)} register tiles) on {lib['isa']}, which lacks {feature}")
    return checked, failures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", required=True, help="the build folder holding the AOT objects")
    parser.add_argument("--arch", default="x86-64", help="the build's architecture (manifest.py's)")
    parser.add_argument("--show", action="store_true", help="print each object's counts")
    args = parser.parse_args()
    checked, failures = check(manifest.load(), args.build, args.arch, args.show)
    for f in failures:
        print(f"isa_check: {f}")
    print(f"isa_check: {checked} bf16 and int8 object(s) checked, {len(failures)} failing"
          + ("" if checked else " (this build made none)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
