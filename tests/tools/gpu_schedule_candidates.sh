#!/usr/bin/env bash
# The hand-written GPU schedule with parameters other than its defaults, against the
# reference on OpenCL (PoCL): candidates of the GPU tuner's space compiled as it compiles
# them (tools/autotune.py compile_candidate, as tools/gpu_autotune.py bundles them), then run
# by the variant suites beside the compiled variants (attn_tests --candidate): every layer
# problem, the benchmarks' problems, the packed batches, the stages' problems, the edge shapes.
#  - layer: the fused layer and its packed twin, the flash core with 4 queries a thread, 8
#    threads a query, 32 queries a block; the projections unrolled by 2 input features;
#  - core: the attention core alone, 2 queries a thread, 32 threads a query;
#  - qkv, output: the projection stages, unrolled by 4, the reduction split in 2.
# The defaults are the compiled manual_opencl variant's, which the same suites run anyway.
# Exits 77 (skipped) where the candidates cannot run: no OpenCL device.
# Usage: gpu_schedule_candidates.sh PYTHON ATTN_GENERATORS ATTN_TESTS WORK_DIR OPENCL_TARGET
set -euo pipefail
python="$1" generators="$2" tests="$3" work="$4" target="$5"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rm -rf "$work" && mkdir -p "$work"

# Compiles each candidate into $work/<suffix>/<suffix>.so; prints the suffixes.
suffixes=$("$python" - "$root" "$generators" "$work" "$target" <<'PY'
import pathlib, sys
root, generators, work, target = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3]), sys.argv[4]
sys.path.insert(0, str(root / "tools"))
import autotune
candidates = {
    "layer": ("attention_layer", ["attention_layer", "attention_layer_packed"],
              {"gpu_thread_queries": 4, "gpu_query_lanes": 8, "query_block": 32, "gpu_unroll_k": 2}),
    "core": ("attention_core", ["attention_core"], {"gpu_thread_queries": 2, "gpu_query_lanes": 32, "query_block": 16}),
    "qkv": ("qkv_projection", ["qkv_projection"], {"gpu_unroll_k": 4, "gpu_split_k": 2}),
    "output": ("output_layernorm", ["output_layernorm"], {"gpu_unroll_k": 4, "gpu_split_k": 2}),
}
for suffix, (generator, functions, params) in candidates.items():
    folder = work / suffix
    folder.mkdir()
    status, message = autotune.compile_candidate(generators, None, generator, target, functions, "manual", params,
                                                 suffix, folder / f"{suffix}.so", 600)
    if status != "compiled":
        sys.exit(f"{suffix}: {status}: {message}")
    print(f"{suffix}: {', '.join(functions)} with {params}, compiled for {target}", file=sys.stderr)
    print(suffix)
PY
)
flags=()
for suffix in $suffixes; do flags+=("--candidate=$work/$suffix/$suffix.so:$suffix:opencl"); done

# The suites that take every variant (support/variant_param.h, tested_variants), for the
# candidates alone; LongContext's 2048-8192 tokens are left to the compiled variants. A case
# of a function the candidate lacks passes by being refused: each candidate must have run
# at least 8 cases of its own to the end, none refused.
status=0
"$tests" "${flags[@]}" --gtest_filter='AllVariants/*candidate_*:BenchmarkProblems/*candidate_*' \
  > "$work/tests.log" 2>&1 || status=$?
# attn_tests prints each candidate's state first: "candidate candidate_<suffix> (opencl): runs here" or why not.
if not_here=$(grep -E '^candidate candidate_[a-z0-9_]+ \(opencl\): ' "$work/tests.log" | grep -v ': runs here$'); then
  echo "skipped: $not_here"
  exit 77
fi
if (( status != 0 )); then
  tail -n 60 "$work/tests.log"
  exit 1
fi
for suffix in $suffixes; do
  ran=$(awk -v name="/candidate_${suffix}__" '
    /^\[ RUN      \]/ { refused = 0 }
    /^\[ REFUSED  \]/ { refused = 1 }
    /^\[       OK \]/ && index($0, name) && !refused { ran++ }
    END { print ran + 0 }' "$work/tests.log")
  echo "candidate_${suffix}: $ran cases ran and matched the reference"
  (( ran >= 8 )) || { echo "FAIL: candidate_${suffix} ran fewer than 8 cases"; exit 1; }
done
# A case of a function a candidate lacks is refused naming what its library lacks (not a
# schedule source's not_provided, which is a compiled variant's reason).
refusals=$(grep -F '[ REFUSED  ] candidate_core (does not provide attention_layer): ' "$work/tests.log" || true)
grep -Fq "its library $work/core/core.so has no attn_attention_layer_core" <<< "$refusals" ||
  { echo "FAIL: the refusal does not name the candidate's library"; grep -m3 'REFUSED' "$work/tests.log"; exit 1; }
echo "candidate_core refuses attention_layer: $(grep -m1 -o 'its library [^)]*' "$work/tests.log")"
