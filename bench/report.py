#!/usr/bin/env python3
"""Renders the schedule comparison from Google Benchmark JSON files (attn_bench and
bench/peers.py) as a Markdown table of ratios and a PNG chart.

Every time is the median over repetitions of wall-clock time, all from one run.
Ratios: "x roofline" is time / openblas_roofline time (1.00 = as fast as OpenBLAS
doing only the layer's GEMMs; on a GPU, cublas_roofline, cuBLAS sgemm); "vs best
peer" is best peer time / time (> 1 = faster than every fp32 peer; bf16 is listed
for context only); "vs manual" is time / the hand-written variant's time on the same
ISA (> 1 = slower than hand-written).
"""
import argparse
import collections
import json
import pathlib

ROOFLINES = ("openblas_roofline", "cublas_roofline")
# Peers held to float32 accuracy; pytorch_sdpa_bf16 is shown beside them, not ranked.
FP32_PEERS = ("openblas_unfused", "onnxruntime", "pytorch", "pytorch_eager", "pytorch_sdpa")
PEERS = ROOFLINES + FP32_PEERS + ("pytorch_sdpa_bf16",)


def roofline_ms(impls):
    return next((impls[r]["ms"] for r in ROOFLINES if "ms" in impls.get(r, {})), None)


def load(paths):
    """{(stage, impl, problem): {ms, gflops, peak, error}} and the first file's context."""
    runs = collections.defaultdict(dict)
    context = {}
    for path in paths:
        doc = json.load(open(path))
        context = context or doc.get("context", {})
        iteration_times = collections.defaultdict(list)
        for b in doc["benchmarks"]:
            key = tuple(b.get("run_name", b["name"]).split("/")[:3])
            if len(key) != 3:
                continue
            entry = runs[key]
            if b.get("error_occurred"):
                entry["error"] = b.get("error_message", "error")
                continue
            # Google Benchmark 1.7 measures memory once, in the last repetition, and
            # leaves the field uninitialized in the others: keep the last one's.
            if "max_bytes_used" in b and b.get("repetition_index", 0) >= entry.get("peak_repetition", -1):
                entry["peak"], entry["peak_repetition"] = b["max_bytes_used"], b.get("repetition_index", 0)
            scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
            if b.get("run_type") == "aggregate" and b.get("aggregate_name") == "median":
                entry["ms"] = b["real_time"] * scale
                entry["gflops"] = b.get("GFLOP/s")
            elif b.get("run_type", "iteration") == "iteration":
                iteration_times[key].append((b["real_time"] * scale, b.get("GFLOP/s")))
        for key, samples in iteration_times.items():  # single repetitions have no aggregate
            if "ms" not in runs[key] and samples:
                samples.sort()
                runs[key]["ms"], runs[key]["gflops"] = samples[len(samples) // 2]
    return runs, context


def isa_of(impl):
    return impl.split("_", 1)[1] if "_" in impl and not impl.startswith(PEERS) else ""


def fused_rows(runs, problem):
    impls = {impl: r for (stage, impl, p), r in runs.items() if stage == "self_attention" and p == problem}
    roofline = roofline_ms(impls)
    peers = {i: r["ms"] for i, r in impls.items() if i in FP32_PEERS and "ms" in r}
    best_peer = min(peers.values()) if peers else None
    rows = []
    for impl, r in sorted(impls.items(), key=lambda kv: kv[1].get("ms", float("inf"))):
        manual = impls.get("manual_" + isa_of(impl), {}).get("ms") if isa_of(impl) else None
        rows.append((impl, r, roofline, best_peer, manual))
    return rows, roofline, peers


AUTOSCHEDULERS = ("mullapudi2016", "adams2019", "li2018")


def autotuned_section(runs, problems, stages):
    """Autotuned vs the best of (hand-written, each autoscheduler's default), same ISA, same run."""
    rows = []
    for p in problems:
        for stage in stages:
            impls = {i: r["ms"] for (s, i, q), r in runs.items() if s == stage and q == p["name"] and "ms" in r}
            for impl, ms in sorted(impls.items()):
                if not impl.startswith("autotuned_"):
                    continue
                isa = isa_of(impl)
                manual = impls.get("manual_" + isa)
                autos = {a: impls[f"{a}_{isa}"] for a in AUTOSCHEDULERS if f"{a}_{isa}" in impls}
                best_auto = min(autos.items(), key=lambda x: x[1]) if autos else (None, None)
                best_other = min([t for t in [manual, best_auto[1]] if t is not None], default=None)
                rows.append(f"| {p['name']} | {stage} | {isa} | {ms:.3f} | {fmt(manual, '{:.3f}')} | "
                            f"{best_auto[0] or '-'} {fmt(best_auto[1], '{:.3f}')} | "
                            f"{fmt(manual / ms if manual else None)}x | "
                            f"{fmt(best_auto[1] / ms if best_auto[1] else None)}x | "
                            f"{fmt(best_other / ms if best_other else None)}x |")
    if not rows:
        return []
    return ["", "## Autotuned variants against the defaults (same ISA, same run)", "",
            "Speedups are default time / autotuned time (> 1: the autotuned variant is faster).", "",
            "| problem | function | ISA | autotuned ms | manual ms | best autoscheduler default ms | "
            "vs manual | vs best autoscheduler | vs best of both |",
            "|---|---|---|---|---|---|---|---|---|", *rows, ""]


def fmt(x, pattern="{:.2f}"):
    return "-" if x is None else pattern.format(x)


def markdown(runs, context, problems):
    out = ["# Schedule comparison", ""]
    out.append(f"Machine: {context.get('cpu_model', '?')}, {context.get('num_cpus', '?')} cores "
               f"({context.get('host_name', '?')}), {context.get('date', '?')}; Halide {context.get('halide', '?')}, "
               f"{context.get('openblas', 'OpenBLAS ?')}. Medians of wall-clock time over repetitions, one run.")
    out += ["", "## Fused layer: summary", "",
            "| problem | model | roofline ms | best variant | ms | x roofline | best peer | ms | speedup vs best peer |",
            "|---|---|---|---|---|---|---|---|---|"]
    for p in problems:
        rows, roofline, peers = fused_rows(runs, p["name"])
        ours = [(i, r["ms"]) for i, r, *_ in rows if i not in PEERS and "ms" in r]
        if not ours:
            continue
        best_impl, best_ms = min(ours, key=lambda x: x[1])
        peer_impl, peer_ms = min(peers.items(), key=lambda x: x[1]) if peers else (None, None)
        out.append(f"| {p['name']} | {p['model']} | {fmt(roofline)} | {best_impl} | {best_ms:.2f} | "
                   f"{fmt(best_ms / roofline if roofline else None)} | {peer_impl or '-'} | {fmt(peer_ms)} | "
                   f"{fmt(peer_ms / best_ms if peer_ms else None)}x |")
    out += ["", "## Fused layer: every variant and peer", ""]
    for p in problems:
        rows, *_ = fused_rows(runs, p["name"])
        if not rows:
            continue
        out += [f"### {p['name']} ({p['model']})", "",
                "| implementation | ms | GFLOP/s | x roofline | vs best peer | vs manual (same ISA) | peak heap MiB |",
                "|---|---|---|---|---|---|---|"]
        for impl, r, roofline, best_peer, manual in rows:
            if "ms" not in r:
                out.append(f"| {impl} | {r.get('error', 'not run')[:80]} | | | | | |")
                continue
            ms = r["ms"]
            peak = r.get("peak")
            out.append(f"| {impl} | {ms:.3f} | {fmt(r.get('gflops'), '{:.1f}')} | "
                       f"{fmt(ms / roofline if roofline else None)} | "
                       f"{fmt(best_peer / ms if best_peer else None)} | "
                       f"{fmt(ms / manual if manual and not impl.startswith('manual') else None)} | "
                       f"{fmt(peak / 2**20 if peak is not None else None, '{:.1f}')} |")
        out.append("")
    stages = ["qkv_projection", "attention_scores", "masked_softmax", "weighted_sum", "output_layernorm"]
    out += autotuned_section(runs, problems, ["self_attention"] + stages)
    for p in problems[:1]:
        impls = sorted({i for (s, i, q) in runs if q == p["name"] and s in stages})
        out += [f"## Stages alone: {p['name']} (ms)", "", "| implementation | " + " | ".join(stages) + " |",
                "|---|" + "---|" * len(stages)]
        for impl in impls:
            cells = [fmt(runs.get((s, impl, p["name"]), {}).get("ms"), "{:.3f}") for s in stages]
            out.append(f"| {impl} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def chart(runs, problems, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = ["autotuned", "manual", "mullapudi2016", "adams2019", "anderson2021", "li2018", "openblas_unfused",
              "onnxruntime", "pytorch"]
    names = [p["name"] for p in problems]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(names)), 5))
    width = 0.8 / len(groups)
    for g_index, group in enumerate(groups):
        values = []
        for name in names:
            impls = {i: r for (s, i, p), r in runs.items() if s == "self_attention" and p == name and "ms" in r}
            roofline = roofline_ms(impls)
            times = [r["ms"] for i, r in impls.items() if i == group or i.startswith(group + "_")]
            values.append(min(times) / roofline if times and roofline else 0)
        ax.bar([x + g_index * width for x in range(len(names))], values, width, label=group)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="OpenBLAS GEMM roofline")
    ax.set_yscale("log")
    ax.set_ylabel("time / roofline (lower is faster; best ISA per schedule)")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))])
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_title("Fused BERT self-attention layer, CPU")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", required=True, help="problem list from attn_bench --problems_json")
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--chart", required=True)
    parser.add_argument("results", nargs="+", help="Google Benchmark JSON files")
    args = parser.parse_args()
    runs, context = load(args.results)
    problems = [p for p in json.load(open(args.problems)) if any(k[2] == p["name"] for k in runs)]
    pathlib.Path(args.markdown).write_text(markdown(runs, context, problems))
    chart(runs, problems, args.chart)
    print(f"wrote {args.markdown} and {args.chart}")


if __name__ == "__main__":
    main()
