#!/usr/bin/env bash
# The GPU comparison, run on a machine with an NVIDIA GPU, its driver and PyTorch:
# every CUDA variant of the variant list, by stage and fused, on the shared problem
# list (device-resident data, attn::synchronize() inside the timed loop), beside the
# GPU peers of bench/peers.py --device cuda (PyTorch eager fp32 as BertSelfAttention
# computes it, scaled_dot_product_attention fp32 and bf16, a cuBLAS sgemm roofline of
# the projections), in the same <stage>/<variant>/<problem> naming and Google
# Benchmark JSON, then the table. Needs no network: build attn_bench where the
# toolchain is (cmake --build --preset release --target attn_bench) and bring
# build/release/bench/attn_bench along, with Google Benchmark's and OpenBLAS's shared
# libraries if that machine lacks them (LD_LIBRARY_PATH). Results go to bench/results/gpu/.
# Usage: tools/bench_gpu.sh [--repetitions N] [--min-time SECONDS] [--python PYTHON]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repetitions=5 min_time=0.3 python=python3
while (($#)); do
  case "$1" in
    --repetitions) repetitions="$2"; shift 2 ;;
    --min-time) min_time="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    *) echo "usage: tools/bench_gpu.sh [--repetitions N] [--min-time SECONDS] [--python PYTHON]" >&2; exit 2 ;;
  esac
done
bench=build/release/bench/attn_bench
[[ -x "$bench" ]] || { echo "bench_gpu: $bench is missing; build it first" >&2; exit 1; }
out=bench/results/gpu
mkdir -p "$out"
"$bench" --problems_json="$out/problems.json"
"$bench" --benchmark_filter='/[a-z0-9]+_cuda/' --benchmark_repetitions="$repetitions" \
  --benchmark_min_time="$min_time" --benchmark_out="$out/attn_bench_cuda.json" --benchmark_out_format=json
"$python" bench/peers.py --device cuda --problems "$out/problems.json" --out "$out/peers_cuda.json" \
  --repetitions "$repetitions" --min-time "$min_time"
"$python" bench/report.py --problems "$out/problems.json" --markdown "$out/comparison.md" \
  --chart "$out/comparison.png" "$out/attn_bench_cuda.json" "$out/peers_cuda.json"
