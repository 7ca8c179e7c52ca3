#!/usr/bin/env python3
"""Renders an interleaved comparison (bench/compare.py's comparison.json) as a Markdown
table and a PNG chart:  report.py generated/results/comparison.json

Times are medians over the rounds of wall-clock time per call. Every ratio is paired: it
is taken within each round, between two implementations timed in that round, and shown
as the median of the per-round ratios with a distribution-free confidence interval of
that median (order statistics, at least 90%); a ratio whose interval contains 1 is
marked ≈ (within noise: not shown to differ on this machine).

"x roofline" is time / openblas_roofline time (the layer's GEMMs alone as OpenBLAS sgemm;
on a GPU, cublas_roofline): below 1 is faster than a GEMM library doing only the GEMMs.
"vs best peer" is best fp32 peer time / time (> 1: faster than every peer). "vs manual"
is time / the hand-written variant's time on the same ISA (> 1: slower).
"""
import argparse
import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))
import manifest  # noqa: E402

ROOFLINES = ("openblas_roofline", "cublas_roofline")
# Peers held to float32 accuracy; pytorch_sdpa_bf16 is shown beside them, not ranked.
FP32_PEERS = ("openblas_unfused", "onnxruntime", "pytorch", "pytorch_eager", "pytorch_sdpa")
# The layer in a reduced precision: our variants' (<variant>_<precision>, as attn_bench names
# them; kind <precision>) and the peers' in that precision, each precision compared in a
# section of its own, with what our variants compute there, never ranked with fp32.
PRECISIONS = {"bf16": ("bf16 weights and projection inputs, f32 sums (attn::Precision::bf16)", ("pytorch_bf16",)),
              "int8": ("int8 weights per output channel, u8 projection inputs per token, i32 sums "
                       "(attn::Precision::int8)", ("pytorch_int8", "onnxruntime_int8"))}
REDUCED_PEERS = tuple(peer for _, peers in PRECISIONS.values() for peer in peers)
_MANIFEST = manifest.load()
AUTOSCHEDULERS = tuple(_MANIFEST.autoschedulers())
STAGES = tuple(_MANIFEST.stage_functions())  # each stage's function
LAYER = "attention_layer"  # the fused layer's function, as attn_bench names its cases
CORE = "attention_core"  # the attention core alone (Q, K, V in), timed beside PyTorch's SDPA
# The functions with a summary and a per-problem section of their own: (function, title, intro).
SECTIONS = ((LAYER, "Fused layer", None),
            (CORE, "Attention core alone", "Q, K and V in, the context out (q = k = v = the problem's x), beside "
                                           "PyTorch's scaled_dot_product_attention on the same head views."))


def group_function(group):
    """The function a group of the comparison timed (results before the manifest said
    "stage", and self_attention for the fused layer)."""
    function = group.get("function", group.get("stage"))
    return LAYER if function == "self_attention" else function


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[(n - 1) // 2] + xs[n // 2]) / 2


def median_interval(xs, level=0.90):
    """(lo, hi): order statistics x_(k), x_(n+1-k) covering the median with probability >= level."""
    xs = sorted(xs)
    n = len(xs)
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) <= k - 1)
    while k + 1 <= n // 2:
        p_next = below + math.comb(n, k) / 2 ** n
        if 2 * p_next > 1 - level:
            break
        k, below = k + 1, p_next
    k = max(k, 1)
    return xs[k - 1], xs[n - k]


class Ratio:
    """Per-round ratios numerator[r] / denominator[r]: median and interval."""

    def __init__(self, numerator, denominator):
        ratios = [a / b for a, b in zip(numerator, denominator)]
        self.median = median(ratios)
        self.lo, self.hi = median_interval(ratios)

    @property
    def within_noise(self):
        return self.lo <= 1.0 <= self.hi

    def __str__(self):
        return f"{self.median:.2f} [{self.lo:.2f}, {self.hi:.2f}]" + (" ≈" if self.within_noise else "")


def ratio(group, numerator, denominator):
    a, b = group.get(numerator, {}).get("ms"), group.get(denominator, {}).get("ms")
    return Ratio(a, b) if a and b else None


def isa_of(impl):
    return impl.split("_", 1)[1] if impl.split("_", 1)[0] in ("manual", "autotuned") + AUTOSCHEDULERS else ""


def timed(group):
    """{impl: median ms} of the implementations that were timed."""
    return {impl: median(r["ms"]) for impl, r in group.items() if r["ms"]}


def thread_groups(group):
    """[(suffix, group)]: one group per thread count where compare.py ran several (--threads 1,2
    names every case <implementation>@<n>t), its implementations under their own names, so that
    each count's best variant and peers are found as in a run of one count; else [("", group)]."""
    counts = sorted({i.rsplit("@", 1)[1] for i in group if i.rsplit("@", 1)[-1][:-1].isdigit() and i.endswith("t")},
                    key=lambda c: int(c[:-1]))
    if not counts:
        return [("", group)]
    return [("@" + c, {i[:-len(c) - 1]: data for i, data in group.items() if i.endswith("@" + c)}) for c in counts]


def best(group, kinds, names=None):
    times = {i: t for i, t in timed(group).items()
             if group[i]["kind"] in kinds and (names is None or i in names)}
    return min(times.items(), key=lambda x: x[1]) if times else (None, None)


def best_variant(group):
    return best(group, ("variant",))


def best_peer(group):
    return best(group, ("peer",), FP32_PEERS)


def roofline(group):
    return next((r for r in ROOFLINES if group.get(r, {}).get("ms")), None)


def fmt(x, pattern="{:.2f}"):
    return "-" if x is None else pattern.format(x)


def spread(ms):
    """(max - min) / median, in percent: how much one implementation moved across the rounds."""
    return 100 * (max(ms) - min(ms)) / median(ms)


def summary_table(doc, groups, function):
    out = ["| problem | model | roofline ms | best variant | ms | x roofline | best peer | ms | "
           "speedup vs best peer |", "|---|---|---|---|---|---|---|---|---|"]
    for p in doc["problems"]:
        for threads, group in thread_groups(groups.get((function, p["name"])) or {}):
            out.extend(summary_row(p, group, threads))
    return out


def summary_row(p, group, threads):
    """The summary table's row of one problem at one thread count ("" or "@<n>t")."""
    impl, ms = best_variant(group)
    if impl is None:
        return []
    peer, peer_ms = best_peer(group)
    roof = roofline(group)
    return [f"| {p['name']} | {p['model']} | {fmt(median(group[roof]['ms']) if roof else None)} | "
            f"{impl}{threads} | {ms:.2f} | {ratio(group, impl, roof) if roof else '-'} | "
            f"{peer + threads if peer else '-'} | {fmt(peer_ms)} | {ratio(group, peer, impl) if peer else '-'} |"]


def detail_table(p, group):
    roof = roofline(group)
    peer, _ = best_peer(group)
    out = [f"### {p['name']} ({p['model']})", "",
           "| implementation | ms | spread % | GFLOP/s | x roofline | vs best peer | vs manual (same ISA) | "
           "peak heap MiB |", "|---|---|---|---|---|---|---|---|"]
    times = timed(group)
    for impl in sorted(group, key=lambda i: times.get(i, math.inf)):
        r = group[impl]
        if not r["ms"]:
            out.append(f"| {impl} | {r.get('error', 'not run')[:90]} | | | | | | |")
            continue
        ms = median(r["ms"])
        manual = "manual_" + isa_of(impl)
        peak = r.get("peak_bytes")
        out.append(f"| {impl} | {ms:.3f} | {spread(r['ms']):.0f} | {r['gflop'] / ms * 1e3:.1f} | "
                   f"{ratio(group, impl, roof) if roof and impl != roof else '-'} | "
                   f"{ratio(group, peer, impl) if peer and impl != peer else '-'} | "
                   f"{ratio(group, impl, manual) if isa_of(impl) and impl != manual else '-'} | "
                   f"{fmt(peak / 2**20 if peak is not None else None, '{:.1f}')} |")
    return out + [""]


def autotuned_section(doc, groups):
    """Autotuned vs the hand-written default and the best autoscheduler of the same ISA, paired."""
    rows = []
    for p in doc["problems"]:
        for function in (LAYER,) + STAGES:
            group = groups.get((function, p["name"]))
            if not group:
                continue
            times = timed(group)
            for impl in sorted(times):
                if not impl.startswith("autotuned_"):
                    continue
                isa = isa_of(impl)
                autos = {a: times[f"{a}_{isa}"] for a in AUTOSCHEDULERS if f"{a}_{isa}" in times}
                auto = min(autos, key=autos.get) if autos else None
                rows.append(f"| {p['name']} | {function} | {isa} | {times[impl]:.3f} | "
                            f"{ratio(group, 'manual_' + isa, impl) or '-'} | "
                            f"{auto or '-'} | {ratio(group, f'{auto}_{isa}', impl) if auto else '-'} |")
    if not rows:
        return []
    return ["## Autotuned variants against the defaults (same ISA, paired)", "",
            "Speedups are default time / autotuned time per round (> 1: the autotuned variant is faster).", "",
            "| problem | function | ISA | autotuned ms | vs manual | best autoscheduler | vs it |",
            "|---|---|---|---|---|---|---|", *rows, ""]


def stages_section(doc, groups):
    out = []
    for p in doc["problems"]:
        present = [s for s in STAGES if (s, p["name"]) in groups]
        if not present:
            continue
        impls = sorted({i for s in present for i in timed(groups[(s, p["name"])])})
        out += [f"## Stages alone: {p['name']} (median ms)", "", "| implementation | " + " | ".join(present) + " |",
                "|---|" + "---|" * len(present)]
        for impl in impls:
            cells = [fmt(timed(groups[(s, p["name"])]).get(impl), "{:.3f}") for s in present]
            out.append(f"| {impl} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def stage_precision_section(doc, groups):
    """Each stage (and the core) in a reduced precision against the same variant in fp32, paired
    per round, and the core against PyTorch's SDPA in that precision where it was timed."""
    rows = []
    for p in doc["problems"]:
        for stage in STAGES:
            group = groups.get((stage, p["name"]), {})
            for impl in sorted(i for i in timed(group) if group[i].get("kind") in PRECISIONS):
                precision = precision_of(impl)
                fp32 = impl[: -len(precision) - 1]
                peer = f"pytorch_sdpa_{precision}"
                rows.append(f"| {p['name']} | {stage} | {impl} | {fmt(timed(group)[impl], '{:.3f}')} | "
                            f"{ratio(group, fp32, impl) or '-'} | {ratio(group, peer, impl) or '-'} |")
    if not rows:
        return []
    return ["## Stages in a reduced precision", "",
            "Speedup (paired: the other's time / this one's) over the same variant in fp32, and over PyTorch's "
            "scaled_dot_product_attention in that precision (the core).", "",
            "| problem | function | implementation | ms | vs its fp32 | vs PyTorch SDPA, same precision |",
            "|---|---|---|---|---|---|"] + rows + [""]


def scaling_section(doc, groups):
    """Strong scaling, where compare.py timed an implementation at several thread counts
    (<impl>@<n>t): the speedup over the fewest threads, paired per round, and the efficiency,
    speedup / (n / fewest)."""
    rows, against = [], []
    for p in doc["problems"]:
        for (function, problem), group in groups.items():
            if problem != p["name"]:
                continue
            counts = {}
            for impl in timed(group):
                if "@" in impl and impl.endswith("t"):
                    base, n = impl.rsplit("@", 1)
                    counts.setdefault(base, []).append(int(n[:-1]))
            for base, ns in sorted(counts.items()):
                fewest = min(ns)
                for n in sorted(ns):
                    if group[f"{base}@{n}t"]["kind"] == "variant":
                        # Against the fastest fp32 peer at its own thread count, where peers were timed.
                        peer, peer_ms = best(group, ("peer",), [f"{name}@{n}t" for name in FP32_PEERS])
                        if peer:
                            against.append(f"| {problem} | {function} | {base}@{n}t | "
                                           f"{median(group[f'{base}@{n}t']['ms']):.3f} | {peer} | {peer_ms:.3f} | "
                                           f"{ratio(group, peer, f'{base}@{n}t')} |")
                    if n == fewest:
                        continue
                    r = ratio(group, f"{base}@{fewest}t", f"{base}@{n}t")
                    share = n / fewest
                    rows.append(f"| {p['name']} | {function} | {base} | {fewest} -> {n} | "
                                f"{median(group[f'{base}@{fewest}t']['ms']):.3f} | {median(group[f'{base}@{n}t']['ms']):.3f} | "
                                f"{r} | {r.median / share:.2f} [{r.lo / share:.2f}, {r.hi / share:.2f}] |")
    if not rows:
        return []
    return ["## Strong scaling (paired)", "",
            "Speedup: time on the fewest threads / time on more, per round; efficiency: speedup / the "
            "ratio of thread counts (1: perfect).", "",
            "| problem | function | implementation | threads | ms | ms | speedup | efficiency |",
            "|---|---|---|---|---|---|---|---|", *rows, ""] + ([
            "At each thread count, against the fastest fp32 peer at the same count (paired: the peer's "
            "time / ours; > 1: ours is faster).", "",
            "| problem | function | implementation | ms | fastest peer, same threads | ms | speedup |",
            "|---|---|---|---|---|---|---|", *against, ""] if against else [])


def precision_of(impl):
    """The reduced precision of one of our variants' cases (<variant>_<precision>), or None."""
    return next((precision for precision in PRECISIONS if impl.endswith("_" + precision)), None)


def precision_section(doc, groups, precision):
    """The layer in a reduced precision against the fastest fp32 variant and the peers, per problem."""
    what, peers = PRECISIONS[precision]
    rows = []
    for p in doc["problems"]:
        for threads, group in thread_groups(groups.get((LAYER, p["name"])) or {}):
            impl, ms = best(group, (precision,))
            fp32, fp32_ms = best_variant(group)
            if impl is None or fp32 is None:
                continue
            times = timed(group)
            fp32_peer, _ = best_peer(group)
            rows.append(f"| {p['name']} | {impl}{threads} | {ms:.2f} | {fp32}{threads} | {fp32_ms:.2f} | "
                        f"{ratio(group, fp32, impl)} | " +
                        "".join(f"{fmt(times.get(peer))} | {ratio(group, peer, impl) or '-'} | " for peer in peers) +
                        f"{fp32_peer + threads if fp32_peer else '-'} | "
                        f"{ratio(group, fp32_peer, impl) if fp32_peer else '-'} |")
    if not rows:
        return []
    return [f"## The layer in {precision} (paired)", "",
            f"{what}; \"vs\" is the other's time / the {precision} variant's, per round (> 1: {precision} is faster).",
            "", f"| problem | {precision} variant | ms | fastest fp32 variant | ms | vs fastest fp32 | " +
            "".join(f"{peer} ms | vs {peer} | " for peer in peers) + "best fp32 peer | vs best fp32 peer |",
            "|" + "---|" * (8 + 2 * len(peers)), *rows, ""]


def default_pick(doc, groups):
    """[(function, problem, fastest CPU variant, Ratio default / fastest)] for every group where
    the runtime's default pick (context: selected_variant) was timed beside other variants."""
    selected = doc["context"].get("selected_variant")
    rows = []
    for (function, problem), group in groups.items():
        if not selected or not group.get(selected, {}).get("ms"):
            continue
        cpu = [i for i in timed(group) if group[i]["kind"] == "variant" and "@" not in i
               and isa_of(i) not in ("cuda", "opencl")]
        fastest, _ = best(group, ("variant",), cpu)
        if fastest:
            rows.append((function, problem, fastest, ratio(group, selected, fastest)))
    return rows


def default_pick_section(doc, groups):
    rows = default_pick(doc, groups)
    if not rows:
        return []
    out = ["## The default pick against the fastest variant (paired)", "",
           f"`{doc['context']['selected_variant']}` is what `attn::select_variant()` picks on this machine. Ratio: "
           "its time / the fastest CPU variant's, per round (1.00 when it is the fastest); \"slower\" when the "
           "interval lies above 1 (`report.py --check-default` fails then).", "",
           "| function | problem | fastest CPU variant | default / fastest | verdict |", "|---|---|---|---|---|"]
    for function, problem, fastest, r in rows:
        selected = doc["context"]["selected_variant"]
        verdict = "fastest" if fastest == selected else "slower" if r.lo > 1.0 else "within noise"
        out.append(f"| {function} | {problem} | {fastest} | {r} | {verdict} |")
    return out + [""]


def baseline_section(doc, groups):
    """Each case of compare.py --baseline's other build beside the same case of this one."""
    rows = []
    for (function, problem), group in groups.items():
        for impl in timed(group):
            before = impl.replace("@baseline", "", 1)
            if "@baseline" in impl and group.get(before, {}).get("ms"):
                rows.append(f"| {problem} | {function} | {before} | {median(group[impl]['ms']):.3f} | "
                            f"{median(group[before]['ms']):.3f} | {ratio(group, impl, before)} |")
    if not rows:
        return []
    return ["## This build against the baseline build (paired)", "",
            "The same case of the two attn_bench builds (compare.py --baseline), in the same rounds: the "
            "baseline's time / this build's (> 1: this build is faster).", "",
            "| problem | function | implementation | baseline ms | ms | speedup |", "|---|---|---|---|---|---|",
            *rows, ""]


def markdown(doc):
    c = doc["context"]
    groups = {(group_function(g), g["problem"]): g["impls"] for g in doc["groups"]}
    peers = ", ".join(f"{name} {version}" for name, version in c.get("peers", {}).items())
    out = ["# Schedule comparison", "",
           f"Machine: {c.get('cpu_model', '?')}{', ' + c['cpu_id'] if c.get('cpu_id') else ''}, {c.get('num_cpus', '?')} cores ({c.get('host_name', '?')}), "
           f"{c.get('date', '?')}; Halide {c.get('halide', '?')}, {c.get('openblas', 'OpenBLAS ?')}; {peers}.",
           "",
           f"Interleaved: for each problem and function, {c.get('rounds')} rounds in which every implementation ran "
           f"for at least {c.get('min_time')} s (after {c.get('pause', 0.02)} s idle), in an order rotating by one "
           "per round. Times are medians over "
           "the rounds; \"spread %\" is (max - min) / median over them. Ratios are paired (taken within each "
           "round): median [confidence interval of the median, at least 90%]; ≈ marks a ratio whose interval "
           "contains 1 (within this machine's noise). "
           f"Command: `{c.get('command', '?')}`.", ""]
    for function, title, intro in SECTIONS:
        if not any(f == function for f, _ in groups):
            continue
        out += [f"## {title}: summary", ""] + ([intro, ""] if intro else [])
        out += summary_table(doc, groups, function)
        out += ["", f"## {title}: every variant and peer", ""]
        for p in doc["problems"]:
            if (function, p["name"]) in groups:
                out += detail_table(p, groups[(function, p["name"])])
    for precision in PRECISIONS:
        out += precision_section(doc, groups, precision)
    out += default_pick_section(doc, groups)
    out += autotuned_section(doc, groups)
    out += scaling_section(doc, groups)
    out += baseline_section(doc, groups)
    out += stages_section(doc, groups)
    out += stage_precision_section(doc, groups)
    return "\n".join(out) + "\n"


def chart(doc, path):
    """The fused layer's times by problem (nothing when the fused layer was not timed)."""
    if not any(group_function(g) == LAYER for g in doc["groups"]):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = ["autotuned", "manual", *AUTOSCHEDULERS, "openblas_unfused", "onnxruntime", "pytorch",
                "pytorch_eager", "pytorch_sdpa"]
    groups = {g["problem"]: g["impls"] for g in doc["groups"] if group_function(g) == LAYER}
    names = [p["name"] for p in doc["problems"] if p["name"] in groups]
    shown = [f for f in families if any(i == f or i.startswith(f + "_") for g in groups.values() for i in timed(g))]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(names)), 5))
    width = 0.8 / max(1, len(shown))
    for index, family in enumerate(shown):
        values, errors = [], [[], []]
        for name in names:
            group = groups[name]
            roof = roofline(group)
            members = {i: t for i, t in timed(group).items() if (i == family or i.startswith(family + "_"))
                       and group[i]["kind"] not in PRECISIONS and i.split("@")[0] not in REDUCED_PEERS}
            r = ratio(group, min(members, key=members.get), roof) if members and roof else None
            values.append(r.median if r else 0)
            errors[0].append(r.median - r.lo if r else 0)
            errors[1].append(r.hi - r.median if r else 0)
        ax.bar([x + index * width for x in range(len(names))], values, width, yerr=errors, capsize=2, label=family)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="GEMM roofline")
    ax.set_yscale("log")
    ax.set_ylabel("time / roofline, paired (lower is faster;\nbest ISA per schedule; bars: interval)")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))])
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_title(f"Fused BERT self-attention layer, {doc['context'].get('device', 'cpu').upper()}, interleaved")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(doc, markdown_path, chart_path=None):
    pathlib.Path(markdown_path).write_text(markdown(doc))
    if chart_path:
        chart(doc, chart_path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="comparison.json from bench/compare.py")
    parser.add_argument("--markdown", help="default: beside the results, comparison.md")
    parser.add_argument("--chart", help="default: beside the results, comparison.png")
    parser.add_argument("--check-default", action="store_true",
                        help="exit 1 when the default pick is measurably slower than the fastest CPU variant anywhere")
    args = parser.parse_args()
    results = pathlib.Path(args.results)
    doc = json.loads(results.read_text())
    write(doc, args.markdown or results.with_suffix(".md"), args.chart or results.with_suffix(".png"))
    if args.check_default:
        groups = {(group_function(g), g["problem"]): g["impls"] for g in doc["groups"]}
        slower = [(f, p, fastest, r) for f, p, fastest, r in default_pick(doc, groups) if r.lo > 1.0]
        for f, p, fastest, r in slower:
            print(f"report: {f}/{p}: the default {doc['context']['selected_variant']} takes {r} x the time of "
                  f"{fastest}", file=sys.stderr)
        if slower:
            raise SystemExit(1)
        print(f"report: the default {doc['context'].get('selected_variant')} is within noise of the fastest CPU "
              "variant, or is it, on every problem")


if __name__ == "__main__":
    main()
