#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and its driver (no toolchain or network needed
# there): runs every test of the CUDA variants, which the suite skips elsewhere,
# against the reference (fused layer, stages, properties, benchmark problems) and the
# GPU runtime tests (CUDA device memory end to end). Build where the toolchain is
# (tools/test.sh) and bring build/release/tests/attn_tests along: it is self-contained.
# Usage: tools/test_gpu.sh [gtest options]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tests=build/release/tests/attn_tests
[[ -x "$tests" ]] || { echo "test_gpu: $tests is missing; build it first (tools/test.sh)" >&2; exit 1; }
exec "$tests" --gtest_filter='*_cuda*:Gpu.*' "$@"
