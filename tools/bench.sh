#!/usr/bin/env bash
# The schedule comparison, in one command: builds attn_bench, runs every variant of
# the variant list by stage and for the fused layer on the shared problem list,
# beside the OpenBLAS peers (Google Benchmark JSON), then the PyTorch and ONNX
# Runtime peers (bench/peers.py, in .venv-peers from tools/peer-requirements.txt),
# and renders the Markdown table and PNG chart. Results go to bench/results/:
#   attn_bench.json, attn_bench_s4096.json (the default run's second pass), peers.json
#                                 Google Benchmark JSON (medians and every repetition)
#   comparison.md, comparison.png the table of ratios and the chart
# Usage: tools/bench.sh [--repetitions N] [--min-time SECONDS] [--filter REGEX]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repetitions=5 min_time=0.3 filter="."
while (($#)); do
  case "$1" in
    --repetitions) repetitions="$2"; shift 2 ;;
    --min-time) min_time="$2"; shift 2 ;;
    --filter) filter="$2"; shift 2 ;;
    *) echo "usage: tools/bench.sh [--repetitions N] [--min-time SECONDS] [--filter REGEX]" >&2; exit 2 ;;
  esac
done
source tools/setup.sh

peers_venv=.venv-peers
ensure_venv "$peers_venv" tools/peer-requirements.txt  # the peers (PyTorch, ONNX Runtime) and matplotlib

cmake --preset release >/dev/null
cmake --build --preset release --target attn_bench
out=bench/results
mkdir -p "$out"
./build/release/bench/attn_bench --problems_json="$out/problems.json"
# At S=4096 the autoscheduled variants take from seconds to minutes per iteration
# (their schedules were made for S=128), so by default that problem runs only the
# hand-written and autotuned variants and OpenBLAS, in a second pass. With --filter, one pass runs
# exactly what the filter matches (Google Benchmark 1.7 filters take one POSIX
# regex, or "-regex" to exclude).
run_bench() {  # filter, output
  ./build/release/bench/attn_bench --benchmark_filter="$1" --benchmark_repetitions="$repetitions" \
    --benchmark_min_time="$min_time" --benchmark_out="$2" --benchmark_out_format=json
}
results=("$out/attn_bench.json")
if [[ "$filter" == "." ]]; then
  run_bench "-_s4096_" "$out/attn_bench.json"
  run_bench "^self_attention/(autotuned|manual|openblas).*_s4096_" "$out/attn_bench_s4096.json"
  results+=("$out/attn_bench_s4096.json")
else
  run_bench "$filter" "$out/attn_bench.json"
fi
"$peers_venv/bin/python" bench/peers.py --problems "$out/problems.json" --out "$out/peers.json" \
  --repetitions "$repetitions" --min-time "$min_time" --filter "$filter"
"$peers_venv/bin/python" bench/report.py --problems "$out/problems.json" --markdown "$out/comparison.md" \
  --chart "$out/comparison.png" "${results[@]}" "$out/peers.json"
