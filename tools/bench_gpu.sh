#!/usr/bin/env bash
# The GPU comparison, run on a machine with an NVIDIA GPU, its driver and PyTorch: every
# CUDA variant of the variant list, by stage and fused, on the shared problem list
# (device-resident data, attn::synchronize() inside the timed loop), interleaved in
# rounds with the GPU peers of bench/peers.py (PyTorch eager fp32 as BertSelfAttention
# computes it, scaled_dot_product_attention fp32 and bf16, a cuBLAS sgemm roofline of
# the projections). Needs no network: build attn_bench where the toolchain is (cmake
# --build --preset release --target attn_bench) and bring build/release/bench/attn_bench
# along, with Google Benchmark's and OpenBLAS's shared libraries if that machine lacks
# them (LD_LIBRARY_PATH). Results go to bench/results/gpu/.
# Usage: tools/bench_gpu.sh [--python PYTHON] [bench/compare.py options]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=python3
if [[ "${1:-}" == "--python" ]]; then python="$2"; shift 2; fi
bench=build/release/bench/attn_bench
[[ -x "$bench" ]] || { echo "bench_gpu: $bench is missing; build it first" >&2; exit 1; }
"$python" bench/compare.py --device cuda --bench "$bench" --out bench/results/gpu "$@"
