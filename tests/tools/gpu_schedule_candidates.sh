#!/usr/bin/env bash
# The GPU flash core with parameters other than its defaults, against the reference on
# OpenCL (PoCL): the hand-written GPU schedule's non-default flash cores compiled as tuning
# candidates (tools/autotune.py compile_candidate, as tools/gpu_autotune.py bundles them),
# then run by the variant suites beside the compiled variants (attn_tests --candidate):
# every layer problem, the benchmarks' problems, the packed batches and the edge shapes.
#  - the fused layer and its packed twin: 4 queries a thread, 8 threads a query, 32 queries
#    a block (64 threads);
#  - the attention core alone: 2 queries a thread, 32 threads a query, 16 queries a block.
# The defaults are the compiled manual_opencl variant's, which the same suites run anyway.
# Usage: gpu_schedule_candidates.sh PYTHON ATTN_GENERATORS ATTN_TESTS WORK_DIR
set -euo pipefail
python="$1" generators="$2" tests="$3" work="$4"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rm -rf "$work" && mkdir -p "$work"

"$python" - "$root" "$generators" "$work" <<'PY'
import pathlib, sys
root, generators, work = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
sys.path.insert(0, str(root / "tools"))
import autotune
target = autotune.MANIFEST.target("opencl")
candidates = {
    "flash_t4": ("attention_layer", ["attention_layer", "attention_layer_packed"],
                 {"gpu_thread_queries": 4, "gpu_query_lanes": 8, "query_block": 32}),
    "core_t2": ("attention_core", ["attention_core"],
                {"gpu_thread_queries": 2, "gpu_query_lanes": 32, "query_block": 16}),
}
for suffix, (generator, functions, params) in candidates.items():
    folder = work / suffix
    folder.mkdir()
    status, message = autotune.compile_candidate(generators, None, generator, target, functions, "manual", params,
                                                 suffix, folder / f"{suffix}.so", 600)
    if status != "compiled":
        sys.exit(f"{suffix}: {status}: {message}")
    print(f"{suffix}: {', '.join(functions)} with {params}, compiled for {target}")
PY

# The suites that take every variant (support/variant_param.h, tested_variants), for the
# candidates alone; LongContext's 2048-8192 tokens are left to the compiled variants.
# A case of a function the candidate lacks passes by being refused: each candidate must
# have run at least 20 cases of its own to the end, none refused.
filter='AllVariants/*candidate_*:BenchmarkProblems/*candidate_*'
"$tests" --candidate="$work/flash_t4/flash_t4.so:flash_t4:opencl" --candidate="$work/core_t2/core_t2.so:core_t2:opencl" \
  --gtest_filter="$filter" > "$work/tests.log" 2>&1 || { grep -E '^\[  FAILED|Failure|error' "$work/tests.log" | head -40; exit 1; }
for suffix in flash_t4 core_t2; do
  ran=$(awk -v name="/candidate_${suffix}__" '
    /^\[ RUN      \]/ { refused = 0 }
    /^\[ REFUSED  \]/ { refused = 1 }
    /^\[       OK \]/ && index($0, name) && !refused { ran++ }
    END { print ran + 0 }' "$work/tests.log")
  echo "candidate_${suffix}: $ran cases ran and matched the reference"
  (( ran >= 20 )) || { echo "FAIL: candidate_${suffix} ran fewer than 20 cases"; exit 1; }
done
