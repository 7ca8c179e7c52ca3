#!/usr/bin/env bash
# The autotuner (tools/autotune.py): searches, measures and freezes the fastest
# schedule of one AOT function for one ISA into generated/tuned/<isa>/. Builds the
# generators and the benchmark harness first. Arguments go to tools/autotune.py, e.g.
#   tools/autotune.sh --isa avx2 --function attention_layer --budget-minutes 30
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target attn_generators attn_bench
plugins="$(halide_library_dir)"
python3 tools/autotune.py --generator build/release/attn_generators --bench build/release/bench/attn_bench \
  --plugins "$plugins" "$@"
