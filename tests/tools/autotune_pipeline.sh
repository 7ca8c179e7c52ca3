#!/usr/bin/env bash
# The autotuner's pipeline on a small search (masked_softmax, baseline ISA):
#  - a candidate that computes the wrong thing is rejected by the harness's reference
#    check before it is timed;
#  - a two-candidate search compiles, checks and times both, and a second run resumes
#    from the cache without compiling or measuring anything again;
#  - the default and the search's best other candidate are timed again, interleaved
#    (bench/compare.py), and those paired ratios pick the winner (the default stays unless
#    a candidate is measurably faster);
#  - a candidate library's bf16 and int8 layers are cases of the harness too.
# Usage: autotune_pipeline.sh PYTHON CXX HALIDE_INCLUDE_DIR ATTN_BENCH ATTN_GENERATORS PLUGINS WORK_DIR
# (PYTHON: the project's .venv, which has tqdm)
set -euo pipefail
python="$1" cxx="$2" halide_include="$3" bench="$4" generators="$5" plugins="$6" work="$7"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rm -rf "$work" && mkdir -p "$work"

# A wrong masked_softmax: all probabilities 0. It has what a Halide function exports: an
# entry point taking its arguments as an array, and metadata naming them.
cat > "$work/wrong.cpp" <<'CPP'
#include <HalideRuntime.h>
#include <cstring>
namespace {
const halide_filter_argument_t arguments[] = {
    {"scores", halide_argument_kind_input_buffer, 4, {halide_type_float, 32, 1}},
    {"key_padding_mask", halide_argument_kind_input_buffer, 2, {halide_type_uint, 8, 1}},
    {"causal", halide_argument_kind_input_scalar, 0, {halide_type_uint, 1, 1}},
    {"probs", halide_argument_kind_output_buffer, 4, {halide_type_float, 32, 1}}};
const halide_filter_metadata_t metadata = {halide_filter_metadata_t::VERSION, 4, arguments, "x86-64-linux-sse41",
                                           "attn_masked_softmax_wrong"};
}  // namespace
extern "C" int attn_masked_softmax_wrong_argv(void **args) {
    auto *probs = static_cast<halide_buffer_t *>(args[3]);
    std::size_t n = 1;
    for (int d = 0; d < probs->dimensions; ++d) n *= std::size_t(probs->dim[d].extent);
    std::memset(probs->host, 0, n * sizeof(float));
    return 0;
}
extern "C" const halide_filter_metadata_t *attn_masked_softmax_wrong_metadata() { return &metadata; }
CPP
"$cxx" -std=c++17 -shared -fPIC -I "$halide_include" "$work/wrong.cpp" -o "$work/wrong.so"
"$bench" --candidate="$work/wrong.so:wrong:sse41" --benchmark_filter='^masked_softmax/candidate_wrong/b1_s128_h384_n12$' \
  --benchmark_format=json > "$work/wrong.json"
grep -q '"error_occurred": true' "$work/wrong.json" || { echo "the wrong candidate was not rejected"; exit 1; }
grep -q 'max error' "$work/wrong.json" || { echo "the rejection does not give the error"; cat "$work/wrong.json"; exit 1; }
echo "wrong candidate rejected: $(grep -o '"error_message": "[^"]*' "$work/wrong.json" | head -c 200)"

tune() {
  "$python" "$root/tools/autotune.py" --generator "$generators" --bench "$bench" --plugins "$plugins" --isa sse41 \
    --function masked_softmax --shape-classes short --problems b1_s128_h384_n12 --max-candidates 2 --repetitions 2 \
    --min-time 0.01 --no-freeze --cache "$work/cache"
}
first=$(tune 2>&1 | tr '\r' '\n')
echo "$first" | tail -3
echo "$first" | grep -q "tried 2 of 2 candidates (0 from the cache).*'measured': 2" ||
  { echo "the search did not measure both"; exit 1; }
[[ -f "$(ls -d "$work"/cache/*/sse41/masked_softmax/manual/ 2>/dev/null)candidate.so" ]] ||
  { echo "no compiled candidate in the cache"; exit 1; }
second=$(tune 2>&1 | tr '\r' '\n')
echo "$second" | tail -1
echo "$second" | grep -q "tried 2 of 2 candidates (2 from the cache).*'measured': 2" ||
  { echo "the second run did not resume from the cache"; exit 1; }

# The finalists timed again, interleaved: a search of weighted_sum's hand-written parameters
# alone (--sources manual), whose default and other candidate bench/compare.py times in the
# same 5 rounds; their paired ratio picks the winner.
confirmed=$("$python" "$root/tools/autotune.py" --generator "$generators" --bench "$bench" --plugins "$plugins" \
  --isa sse41 --function weighted_sum --sources manual --shape-classes short --problems b1_s128_h384_n12 \
  --max-candidates 2 --repetitions 2 --min-time 0.01 --confirm 1 --confirm-rounds 5 --no-freeze \
  --cache "$work/cache" 2>&1 | tr '\r' '\n')
echo "$confirmed" | grep -v '%|' | tail -4
echo "$confirmed" | grep -q "tried 2 of 2 candidates (0 from the cache).*'measured': 2" ||
  { echo "the hand-written search did not measure its two candidates"; exit 1; }
echo "$confirmed" | grep -q "timing the default and the search's 1 best other candidates again, interleaved, 5 rounds" ||
  { echo "the finalists were not timed again interleaved"; exit 1; }
echo "$confirmed" | grep -Eq "confirmed interleaved: its time over the default's, paired: b1_s128_h384_n12 [0-9.]+" ||
  { echo "no paired ratio for the winner"; exit 1; }
"$python" - "$(ls "$work"/cache/*/sse41/weighted_sum/confirmed_short/comparison.json)" <<'PY' || exit 1
import json, sys
doc = json.load(open(sys.argv[1]))
[group] = [g for g in doc["groups"] if g["function"] == "weighted_sum"]
timed = {impl: e["ms"] for impl, e in group["impls"].items() if e.get("ms")}
assert len(timed) == 2 and all(len(ms) == 5 for ms in timed.values()), timed
print(f"confirmed interleaved: {sorted(timed)}, 5 rounds each")
PY

# The rule: the default stays unless a candidate is measurably faster on some problem (its
# interval below 1) and no slower by median on any; of those, the lowest worst-case ratio.
"$python" - "$root/tools" <<'PY' || exit 1
import sys
sys.path.insert(0, sys.argv[1])
from autotune import paired_winner
ratios = {"default": {"a": 1.0, "b": 1.0}, "faster": {"a": 0.9, "b": 0.99}, "fastest": {"a": 0.8, "b": 0.95},
          "noise": {"a": 0.8, "b": 0.8}, "mixed": {"a": 0.7, "b": 1.05}, "slower_median": {"a": 0.7, "b": 1.01}}
intervals = {"default": {"a": (1, 1), "b": (1, 1)}, "faster": {"a": (0.85, 0.95), "b": (0.9, 1.1)},
             "fastest": {"a": (0.7, 1.1), "b": (0.9, 0.98)}, "noise": {"a": (0.5, 1.2), "b": (0.6, 1.1)},
             "mixed": {"a": (0.6, 0.8), "b": (1.02, 1.1)}, "slower_median": {"a": (0.6, 0.8), "b": (0.9, 1.1)}}
assert paired_winner(ratios, intervals, "default") == "fastest", "not the lowest worst-case ratio"
for gone in ("fastest", "faster"):
    del ratios[gone], intervals[gone]
assert paired_winner(ratios, intervals, "default") == "default", "noise or a loss replaced the default"
print("paired_winner: the best measurable gain wins; noise, a loss by median or a measurable loss keep the default")
PY

# A candidate's bf16 and int8 layers (a library with attention_layer_bf16 or _int8, as
# tools/autotune.py or a user compiles one) are cases of the harness too, checked against the
# reference before they are timed: candidate_<suffix>_bf16 and _int8.
for precision in bf16 int8; do
  "$generators" -g attention_layer -f "attn_attention_layer_${precision}_reduced" -o "$work" -e object,c_header \
    target=x86-64-linux-sse41-no_runtime function="attention_layer_$precision" schedule=manual output_probs=false \
    precision="$precision" core_precision=bf16
done
"$cxx" -shared -o "$work/reduced.so" "$work"/attn_attention_layer_{bf16,int8}_reduced.o
"$bench" --candidate="$work/reduced.so:reduced:sse41" \
  --benchmark_filter='^attention_layer/candidate_reduced_(bf16|int8)/b1_s128_h384_n12$' --benchmark_min_time=0.01 \
  --benchmark_format=json > "$work/reduced.json"
for precision in bf16 int8; do
  python3 - "$work/reduced.json" "$precision" <<'PY' || exit 1
import json, sys
runs = {b["name"]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
name = f"attention_layer/candidate_reduced_{sys.argv[2]}/b1_s128_h384_n12"
run = runs.get(name)
if run is None or run.get("error_occurred"):
    sys.exit(f"{name}: not run ({run.get('error_message') if run else 'no such case'})")
print(f"{name}: checked against the reference (max error {run['max_error']:.2g}) and timed")
PY
done
