#!/usr/bin/env python3
"""The interleaved comparison (bench/compare.py, bench/report.py): the statistics, and a
small run through attn_bench --serve whose rounds must be complete, paired and rotating.
Usage: test_compare.py ATTN_BENCH WORK_DIR"""
import json
import pathlib
import re
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(root / "bench"))
import peers as peer_lib  # noqa: E402
import report  # noqa: E402


def check(condition, message):
    if not condition:
        raise SystemExit(f"FAIL: {message}")


# Order statistics: 7 samples give [min, max] (98% coverage), 9 give [x2, x8] (96%).
check(report.median_interval([5, 1, 4, 2, 3, 7, 6]) == (1, 7), "interval of 7 samples")
check(report.median_interval(list(range(1, 10))) == (2, 8), "interval of 9 samples")
check(report.median([4, 1, 3, 2]) == 2.5, "median of an even count")
r = report.Ratio([2.0, 2.2, 1.8, 2.0, 2.1], [1.0, 1.0, 1.0, 1.0, 1.0])
check((r.median, r.lo, r.hi, r.within_noise) == (2.0, 1.8, 2.2, False), f"paired ratio {r}")
check(report.Ratio([1.0, 1.1, 0.95, 1.0, 1.02], [1.0] * 5).within_noise, "a ratio around 1 is within noise")
# The default pick against the fastest CPU variant (a GPU variant is no rival).
variant = lambda ms: {"kind": "variant", "ms": ms}  # noqa: E731
picks = report.default_pick({"context": {"selected_variant": "autotuned_avx2"}}, {
    ("attention_layer", "slow"): {"autotuned_avx2": variant([2.0] * 5), "manual_avx2": variant([1.0, 1.1, 1.0, 0.9, 1.0]),
                                  "manual_opencl": variant([0.1] * 5)},
    ("attention_layer", "fast"): {"autotuned_avx2": variant([1.0] * 5), "manual_avx2": variant([1.2] * 5)}})
check([(p, fastest, round(r.median, 2), r.lo > 1) for _, p, fastest, r in picks] ==
      [("slow", "manual_avx2", 2.0, True), ("fast", "autotuned_avx2", 1.0, False)], f"default pick: {picks}")
# A reduced precision's cases and peers are compared in its own table, never ranked with fp32:
# the int8 peers, though faster here, are not the best fp32 peer, and our int8 case no variant.
check([report.precision_of(i) for i in ("manual_avx2", "manual_avx2_bf16", "manual_avx512_zen4_int8")] ==
      [None, "bf16", "int8"], "precision of a case's name")
peer = lambda ms: {"kind": "peer", "ms": ms}  # noqa: E731
group = {"manual_avx2": variant([2.0] * 5), "manual_avx2_int8": {"kind": "int8", "ms": [1.0] * 5},
         "pytorch": peer([3.0] * 5), "pytorch_int8": peer([0.5] * 5), "onnxruntime_int8": peer([1.5] * 5)}
check(report.best_peer(group)[0] == "pytorch" and report.best_variant(group)[0] == "manual_avx2", "fp32 ranking")
one = ({"problems": [{"name": "b1", "model": "m"}]}, {("attention_layer", "b1"): group})
table = report.precision_section(*one, "int8")
check(table[4].startswith("| problem | int8 variant | ms | fastest fp32 variant | ms | vs fastest fp32 | pytorch_int8 "
                          "ms | vs pytorch_int8 | onnxruntime_int8 ms | vs onnxruntime_int8 | best fp32 peer |")
      and table[6] == "| b1 | manual_avx2_int8 | 1.00 | manual_avx2 | 2.00 | 2.00 [2.00, 2.00] | 0.50 | "
                      "0.50 [0.50, 0.50] | 1.50 | 1.50 [1.50, 1.50] | pytorch | 3.00 [3.00, 3.00] |"
      and len({line.count("|") for line in table[4:7]}) == 1, f"the int8 table: {table}")
check(report.precision_section(*one, "bf16") == [], "no bf16 table without a bf16 case")
# With several thread counts (--threads 1,2: every case named <implementation>@<n>t), each
# count is ranked apart: its best variant and peers, our case against the peer of its count.
threaded = {f"{name}@{n}t": dict(data, ms=[m / n for m in data["ms"]]) for name, data in group.items() for n in (1, 2)}
threaded["manual_avx2@baseline@2t"] = {"kind": "baseline", "ms": [0.1] * 5}
check([(t, sorted(g)) for t, g in report.thread_groups(threaded)][1] ==
      ("@2t", sorted(list(group) + ["manual_avx2@baseline"])), "the 2-thread group, names without the count")
check(report.thread_groups(group) == [("", group)], "one thread count: the group as it is")
table = report.precision_section({"problems": [{"name": "b1", "model": "m"}]},
                                 {("attention_layer", "b1"): threaded}, "int8")
check(table[6].startswith("| b1 | manual_avx2_int8@1t | 1.00 | manual_avx2@1t | 2.00 | 2.00 [2.00, 2.00] | 0.50 |")
      and table[7].startswith("| b1 | manual_avx2_int8@2t | 0.50 | manual_avx2@2t | 1.00 | 2.00 [2.00, 2.00] | 0.25 |")
      and table[7].endswith("| pytorch@2t | 3.00 [3.00, 3.00] |"), f"the int8 table per thread count: {table}")
summary = report.summary_table({"problems": [{"name": "b1", "model": "m"}]},
                               {("attention_layer", "b1"): threaded}, "attention_layer")
check(summary[3].startswith("| b1 | m | - | manual_avx2@2t | 1.00 | - | pytorch@2t | 1.50 | 1.50 ["),
      f"the summary per thread count: {summary}")

bench, work = sys.argv[1], pathlib.Path(sys.argv[2])
rounds = 5
cases = "attention_layer/(manual_avx2|manual_sse41|openblas_roofline|openblas_unfused)/b1_s128_h384_n12$"
listing = subprocess.run([bench, "--serve"], input="list\n", capture_output=True, text=True, check=True).stdout
if "attention_layer/manual_sse41/" not in listing:
    print("SKIP: this build has no manual_sse41 (ATTN_ONLY_VARIANTS builds a subset of the variants)")
    sys.exit(77)
subprocess.run([sys.executable, str(root / "bench/compare.py"), "--bench", bench, "--out", str(work),
                "--rounds", str(rounds), "--min-time", "0.005", "--pause", "0", "--filter", cases, "--no-chart"],
               check=True)
doc = json.loads((work / "comparison.json").read_text())
groups = doc["groups"]
check(len(groups) == 1 and groups[0]["problem"] == "b1_s128_h384_n12", f"one group: {[g['problem'] for g in groups]}")
impls, orders = groups[0]["impls"], groups[0]["orders"]
runnable = [name for name, r in impls.items() if "error" not in r]
check({"manual_sse41", "openblas_roofline", "openblas_unfused"} <= set(runnable), f"timed: {runnable}")
for name in runnable:
    r = impls[name]
    check(len(r["ms"]) == rounds and all(ms > 0 for ms in r["ms"]), f"{name}: one sample per round: {r['ms']}")
    check(name.startswith("openblas_roofline") or r.get("max_error", 1) < 1e-4, f"{name} was checked: {r}")
check(len(orders) == rounds and all(sorted(o) == sorted(runnable) for o in orders), "each round runs everything once")
for r in range(1, rounds):
    check(orders[r] == orders[r - 1][1:] + orders[r - 1][:1], f"round {r} rotates the order of round {r - 1}")
text = (work / "comparison.md").read_text()
check("manual_sse41" in text and "x roofline" in text and "[" in text, "the report shows paired ratios")
# The measured dispatch order (tools/dispatch.py) of this run: its CPU variants, fastest first, no peer.
sys.path.insert(0, str(root / "tools"))
import dispatch  # noqa: E402
import manifest as manifest_lib  # noqa: E402
entry = dispatch.measured_order(doc, manifest_lib.load())
variants_timed = sorted(n for n in runnable if n.startswith("manual_"))
check(sorted(entry["order"]) == variants_timed and entry["time_over_fastest"][0] == 1.0
      and entry["time_over_fastest"] == sorted(entry["time_over_fastest"]) and entry["problems"] == 1,
      f"dispatch order: {entry}")
# It names the CPU by model name and id (family and model, as attn_bench reads /proc/cpuinfo):
# a VM's "AMD EPYC" is any Zen.
cpuinfo = pathlib.Path("/proc/cpuinfo").read_text() if pathlib.Path("/proc/cpuinfo").exists() else ""
family = re.search(r"^cpu family\s*: (\d+)", cpuinfo, re.M)
model = re.search(r"^model\s*: (\d+)", cpuinfo, re.M)
check(entry["cpu_id"] == (f"family {family[1]} model {model[1]}" if family and model else "")
      and entry["cpu_id"] == doc["context"]["cpu_id"], f"the entry's CPU id: {entry['cpu_id']!r}")
# ... and each shape class's: this run's one problem (S=128) is short, so short ranks it alike and
# long ranks nothing.
short = dispatch.shape_class("b1_s128_h384_n12", manifest_lib.load())
check(short == "short" and dispatch.shape_class("b1_s2048_h768_n12", manifest_lib.load()) == "long"
      and dispatch.shape_class("b1_s128_k2048_h768_n12_cross", manifest_lib.load()) == "long"
      and list(entry["classes"]) == [short] and entry["classes"][short]["order"] == entry["order"],
      f"dispatch by shape class: {entry['classes']}")

# Strong scaling: the worker's cases at 1 and 2 threads, in the same rounds, and the table.
subprocess.run([sys.executable, str(root / "bench/compare.py"), "--bench", bench, "--out", str(work / "scaling"),
                "--rounds", str(rounds), "--min-time", "0.005", "--pause", "0", "--threads", "1,2",
                "--filter", "attention_layer/manual_sse41/b1_s128_h384_n12$", "--no-chart"], check=True)
scaling = json.loads((work / "scaling" / "comparison.json").read_text())
impls = scaling["groups"][0]["impls"]
check(sorted(impls) == ["manual_sse41@1t", "manual_sse41@2t"], f"one case per thread count: {sorted(impls)}")
check(all(len(r["ms"]) == rounds for r in impls.values()), "every count timed in every round")
check("Strong scaling" in (work / "scaling" / "comparison.md").read_text(), "the report shows the scaling")

# Two builds (--baseline; here the same one twice): each case of both in every round, the
# baseline's apart from the variants (never ranked or picked), and the table pairing them;
# with --fresh-workers, each round in new worker processes, its cases prepared (checked) again.
subprocess.run([sys.executable, str(root / "bench/compare.py"), "--bench", bench, "--baseline", bench,
                "--fresh-workers", "--out", str(work / "baseline"), "--rounds", str(rounds), "--min-time", "0.005",
                "--pause", "0", "--filter", "attention_layer/manual_sse41/b1_s128_h384_n12$", "--no-chart"],
               check=True)
doc = json.loads((work / "baseline" / "comparison.json").read_text())
check(doc["context"]["fresh_workers"] is True, "the context says the workers were fresh every round")
impls = doc["groups"][0]["impls"]
check(sorted(impls) == ["manual_sse41", "manual_sse41@baseline"] and impls["manual_sse41@baseline"]["kind"] ==
      "baseline" and all(len(r["ms"]) == rounds and r.get("max_error", 1) < 1e-4 for r in impls.values()),
      f"a case of each build, checked and timed every round: {impls}")
check("| b1_s128_h384_n12 | attention_layer | manual_sse41 |" in (work / "baseline" / "comparison.md").read_text(),
      "the report pairs the builds' cases")

# The fp32 and int8 peers of the same layer, where this Python has PyTorch and ONNX Runtime
# (.venv-peers), at 1 and 2 threads beside a variant: each checked against the float64
# reference before it is timed, the int8 ones within INT8_TOLERANCE and further off than fp32's
# tolerance (their projections are quantized); each at both counts, and the variant against
# the fastest fp32 peer of its own count.
names = ("pytorch", "pytorch_int8", "onnxruntime", "onnxruntime_int8")
subprocess.run([sys.executable, str(root / "bench/compare.py"), "--bench", bench, "--out", str(work / "peers"),
                "--rounds", str(rounds), "--min-time", "0.005", "--pause", "0", "--threads", "1,2",
                "--filter", f"attention_layer/(manual_sse41|{'|'.join(names)})/b1_s128_h384_n12$", "--no-chart"],
               check=True)
impls = json.loads((work / "peers" / "comparison.json").read_text())["groups"][0]["impls"]
peers = {name: r for name, r in impls.items() if r["kind"] == "peer"}
print(f"compare: peers present here: {sorted(peers) or 'none (no PyTorch, no ONNX Runtime)'}")
for name, r in peers.items():
    base, count = name.rsplit("@", 1)
    fp32 = peer_lib.Peer.tolerance
    low, high = (fp32, peer_lib.INT8_TOLERANCE) if base.endswith("_int8") else (0, fp32)
    check(base in names and count in ("1t", "2t") and f"{base}@{'2t' if count == '1t' else '1t'}" in peers,
          f"{name}: a peer at both thread counts")
    check("error" not in r and len(r["ms"]) == rounds and low < r.get("max_error", -1) < high,
          f"{name}: checked ({low} < max error < {high}) and timed: {r}")
if any(name.rsplit("@", 1)[0] in ("pytorch", "onnxruntime") for name in peers):
    report_text = (work / "peers" / "comparison.md").read_text()
    table = report_text.split("fastest fp32 peer at the same count")[-1]
    check("fastest fp32 peer at the same count" in report_text and
          "| attention_layer | manual_sse41@1t |" in table and "| attention_layer | manual_sse41@2t |" in table,
          "the variant against the fastest fp32 peer of its own thread count")
print("compare: interleaved rounds complete, paired and rotating; statistics right; scaling across thread counts, "
      "two builds paired, peers included; reduced-precision peers checked and apart")
