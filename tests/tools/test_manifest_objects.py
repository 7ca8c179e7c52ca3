#!/usr/bin/env python3
"""tools/manifest.py's shared objects: a build generates each distinct generator run once, and a
library whose run another library already makes (a tuned winner that is the hand-written
default, a shape class with another class's winner) uses that library's object (aot_libraries'
`object`, SAME_AS in attn_manifest.cmake). Checks that
  - sharing follows generation_key: same generator, target and resolved parameters, and the
    object's own library is its own object (no chains), the hand-written one where it is among them;
  - generation_key resolves the hand-written defaults as the generators do (a GPU's, a CPU's, 0);
  - two libraries that share an object do lower to the same code: the generator's stmt of each,
    names aside, for a CPU and a CUDA pair; and a pair that does not share, to different code.
Usage: test_manifest_objects.py GENERATOR WORK_DIR"""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(root / "tools"))
import gpu_kernels  # noqa: E402
import manifest  # noqa: E402

generator, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
work.mkdir(parents=True, exist_ok=True)
m = manifest.load()


def check(condition, message):
    if not condition:
        raise SystemExit(f"FAIL: {message}")


shared = 0
for arch in ("x86-64", "arm-64"):
    libraries = {lib["name"]: lib for lib in m.aot_libraries(arch)}
    for lib in libraries.values():
        owner = libraries.get(lib["object"])
        check(owner is not None, f"{lib['name']}: its object {lib['object']} is no library of the {arch} build")
        check(owner["object"] == owner["name"], f"{lib['name']}: its object's library {owner['name']} uses another's")
        if owner is lib:
            continue
        shared += 1
        same = [(x["isa"], x["generator"], x["plugin"], m.generation_key(x["isa"], x["generator"], x["params"]))
                for x in (lib, owner)]
        check(same[0] == same[1], f"{lib['name']} uses {owner['name']}'s object, but their generator runs differ: "
                                  f"{same[0]} vs {same[1]}")
        group = [x for x in libraries.values() if x["object"] == owner["name"]]
        hand_written = [x["name"] for x in group if m.sources[x["source"]]["kind"] == "hand-written"]
        check(not hand_written or owner["name"] in hand_written,
              f"{lib['name']}: shares {owner['name']}'s object, not the hand-written {hand_written}")
check(shared > 0, "no library shares an object: the tuned winners that are the hand-written defaults should")

# generation_key against the generators' own defaults (schedule_source.cpp: manual_parameter_for).
defaults_cpu, defaults_gpu = m.manual_defaults(), m.manual_defaults(gpu=True)
key = m.generation_key
base = ["function=attention_core", "schedule=manual"]
check(key("avx2", "attention_layer", base) == key("avx2", "attention_layer", base + [f"query_block={defaults_cpu['query_block']}"]),
      "a CPU library given the CPU default query_block does not share the hand-written one's run")
check(key("avx2", "attention_layer", base) != key("avx2", "attention_layer", base + [f"query_block={defaults_gpu['query_block']}"]),
      "a CPU library given the GPU default query_block shares the hand-written one's run")
check(key("cuda", "attention_layer", base) == key("cuda", "attention_layer", base + [f"query_block={defaults_gpu['query_block']}"]),
      "a CUDA library given the GPU default query_block does not share the hand-written one's run")
check(key("cuda", "attention_layer", base) == key("cuda", "attention_layer", base + ["query_block=0"]),
      "query_block=0 (the target's default) is not the default")
check(key("cuda", "attention_layer", base) != key("cuda", "attention_layer", base + ["gpu_split_k=0"]),
      "gpu_split_k=0 (a parameter with no target default: 0 is a value, refused by the generator) shares the "
      "default's run")
check(key("avx2", "attention_layer", base) != key("sse41", "attention_layer", base), "two targets share a run")
check(key("avx2", "attention_layer", base) != key("avx2", "attention_layer", ["function=attention_core", "schedule=adams2019"]),
      "two schedule sources share a run")


def lowered(lib):
    """The library's lowered stmt, as the build's generator run lowers it, its own names taken out."""
    out = work / lib["name"]
    out.mkdir(exist_ok=True)
    text = gpu_kernels.lowered_stmt(generator, "", m.target(lib["isa"]), lib, out).replace(lib["name"], "NAME")
    return re.sub(r"(__|\$)\d+\b", "", text)  # Halide's unique-name counters


x86 = {lib["name"]: lib for lib in m.aot_libraries("x86-64")}


def first(what, condition):
    """The first x86-64 library (manifest order) meeting the condition: the pairs follow the
    frozen winners, which each tuning run changes."""
    found = next((name for name, lib in x86.items() if condition(lib)), None)
    check(found is not None, f"no {what} among the x86-64 build's libraries")
    return found


def tuned(lib):
    return m.sources[lib["source"]]["kind"] == "tuned"


def of_a_class(lib):
    return lib["name"].endswith(tuple("_" + c for c in m.shape_classes))


pairs = [(first("CPU tuned library sharing an object",
                lambda x: tuned(x) and not m.is_gpu(x["isa"]) and x["object"] != x["name"]), True),
         (first("GPU tuned library of one shape class sharing an object",
                lambda x: tuned(x) and m.is_gpu(x["isa"]) and of_a_class(x) and x["object"] != x["name"]), True),
         (first("GPU tuned library of one shape class with an object of its own",
                lambda x: tuned(x) and m.is_gpu(x["isa"]) and of_a_class(x) and x["object"] == x["name"]), False)]
for name, shares in pairs:
    lib = x86[name]
    check((lib["object"] != name) == shares, f"{name} {'does not share' if shares else 'shares'} an object")
    # Not shared: the same function's library of the ISA's hand-written source, which the
    # tuned winner differs from.
    other = x86[lib["object"] if shares else f"attn_{lib['function']}_{m.hand_written(lib['isa'])}_{lib['isa']}"]
    same = lowered(lib) == lowered(other)
    check(same == shares, f"{name} and {other['name']} lower to {'different' if shares else 'the same'} code")
    print(f"{name} and {other['name']}: {'the same' if same else 'different'} lowered code")
print(f"PASS: {shared} libraries use another's object")
