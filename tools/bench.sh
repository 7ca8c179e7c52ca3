#!/usr/bin/env bash
# The schedule comparison, in one command: builds attn_bench, then bench/compare.py times
# every variant of the variant list (fused, and by stage at short contexts) beside the
# peers (OpenBLAS, PyTorch and ONNX Runtime, from .venv-peers: tools/peer-requirements.txt)
# on the shared problem list, interleaved: in each round every implementation of a
# problem runs once, in a rotating order. Results go to generated/results/:
#   comparison.json   every sample of every round, the machine and the versions
#   comparison.md     medians, spreads and paired ratios with their intervals
#   comparison.png    the chart
# Usage: tools/bench.sh [bench/compare.py options: --rounds N --min-time S --filter REGEX ...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/setup.sh
peers_venv=.venv-peers
ensure_venv "$peers_venv" tools/peer-requirements.txt  # the peers (PyTorch, ONNX Runtime) and matplotlib
cmake --preset release >/dev/null
cmake --build --preset release --target attn_bench
"$peers_venv/bin/python" bench/compare.py --bench build/release/bench/attn_bench --out generated/results "$@"
