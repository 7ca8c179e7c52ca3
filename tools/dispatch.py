#!/usr/bin/env python3
"""The measured dispatch order: which variant the runtime picks by default on a CPU where it
was measured (generated/dispatch.json, read into the build by tools/manifest.py).

    tools/dispatch.py generated/results/comparison.json [more comparison.json ...]

From each interleaved comparison (bench/compare.py) of the fused layer, the CPU variants
timed on every one of its attention_layer problems are ranked by the geometric mean, over
those problems, of their median time over the fastest variant's: the first is the one
closest to the fastest everywhere. So are they over the problems of each shape class
(manifest.json, by max(S_q, S_k)): an Attention made without naming a variant runs each
call with its class's first. One entry per CPU (its model name and its id, the family and
model attn_bench records: a VM's "AMD EPYC" is any Zen) and measured instruction sets (a
newer comparison of the same replaces the older). The runtime uses an entry when the
host's CPU is the entry's and the host's widest instruction set was measured (an entry
without an id, made before ids were recorded, matches the model name alone, after those
with the host's id); otherwise it falls back to the rule (runtime/src/variants.cpp).
"""
import argparse
import json
import math
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "bench"))
import manifest as manifest_lib  # noqa: E402
from report import group_function, isa_of, timed  # noqa: E402

DISPATCH = ROOT / "generated" / "dispatch.json"
LAYER = "attention_layer"


def shape_class(problem, manifest):
    """The shape class of a problem, by max(S_q, S_k) (problems/problem.cpp names them
    b<B>_s<S_q>[_k<S_k>]_h<H>_...)."""
    seq = max(int(n) for n in re.findall(r"_[sk](\d+)(?=_)", problem))
    return next(name for name, c in manifest.shape_classes.items() if not c.get("max_seq") or seq <= c["max_seq"])


def ranking(medians, what):
    """The variants timed on every problem of `medians` ({variant: median} per problem), closest
    to the fastest first, and each one's geometric mean time over the fastest."""
    everywhere = set.intersection(*(set(t) for t in medians))
    if not everywhere:
        raise SystemExit(f"dispatch: no CPU variant was timed on every attention_layer problem{what}")
    score = {v: math.exp(sum(math.log(t[v] / min(t.values())) for t in medians) / len(medians)) for v in everywhere}
    order = sorted(everywhere, key=lambda v: (score[v], v))
    return {"problems": len(medians), "order": order, "time_over_fastest": [round(score[v], 4) for v in order]}


def measured_order(doc, manifest):
    """The entry of one comparison: its CPU, the instruction sets measured, the ranking over
    every problem and the ranking over each shape class's."""
    cpu_isas = [name for name, isa in manifest.isas.items() if isa["device"] == "cpu"]
    groups = [g for g in doc["groups"] if group_function(g) == LAYER]
    if not groups:
        raise SystemExit("dispatch: the comparison timed no attention_layer problem")
    medians = {}
    for g in groups:
        impls = g["impls"]
        times = {i: t for i, t in timed(impls).items()
                 if impls[i]["kind"] == "variant" and "@" not in i and isa_of(i) in cpu_isas}
        if times:
            medians[g["problem"]] = times
    overall = ranking(list(medians.values()), "")
    classes = {}
    for name in manifest.shape_classes:
        of_class = [t for p, t in medians.items() if shape_class(p, manifest) == name]
        if of_class:
            classes[name] = ranking(of_class, f" of shape class {name}")
    c = doc["context"]
    return {"cpu_model": c.get("cpu_model", "unknown"), "cpu_id": c.get("cpu_id", ""),
            "isas": [i for i in cpu_isas if any(isa_of(v) == i for v in overall["order"])],
            "date": c.get("date", "?"), "command": c.get("command", "?"), **overall, "classes": classes}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("comparisons", nargs="+", help="comparison.json files of bench/compare.py")
    parser.add_argument("--out", default=str(DISPATCH))
    args = parser.parse_args()
    manifest = manifest_lib.load()
    out = pathlib.Path(args.out)
    entries = json.loads(out.read_text())["measured"] if out.exists() else []
    for path in args.comparisons:
        entry = measured_order(json.loads(pathlib.Path(path).read_text()), manifest)
        entry["source"] = str(pathlib.Path(path).resolve().relative_to(ROOT)) if pathlib.Path(
            path).resolve().is_relative_to(ROOT) else path
        key = ("cpu_model", "cpu_id", "isas")
        entries = [e for e in entries if [e.get(k, "") for k in key] != [entry[k] for k in key]]
        entries.append(entry)
        by_class = ", ".join(f"{name} {c['order'][0]} ({c['problems']})" for name, c in entry["classes"].items())
        print(f"dispatch: {entry['cpu_model']}, {entry['cpu_id'] or 'no id'} ({' '.join(entry['isas'])}): "
              f"{entry['order'][0]} first, over "
              f"{entry['problems']} problems; by shape class: {by_class}")
    doc = {"about": ["Written by tools/dispatch.py from interleaved comparisons; never edit by hand. On a host of",
                     "an entry's cpu_model and cpu_id (its family and model; an entry without one, measured before",
                     "they were recorded, holds for any) whose widest instruction set is among its isas, the",
                     "runtime's default variant is the first of its order that runs (entries with the host's id",
                     "first), and an Attention made without naming a variant runs each call with the first of its",
                     "shape class's order that runs (docs/design.md, 'The manifest, variants, and how dispatch works')."],
           "measured": entries}
    out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
