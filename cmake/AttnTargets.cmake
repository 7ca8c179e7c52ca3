# Instruction sets the project builds for, and the Halide target of each. The
# runtime checks the matching CPU features before calling a variant
# (runtime/src/cpu_features.cpp); keep the two in step.
set(ATTN_TARGET_sse41 "x86-64-linux-sse41")
set(ATTN_TARGET_avx2 "x86-64-linux-sse41-avx-avx2-fma-f16c")
set(ATTN_TARGET_avx512_skylake "x86-64-linux-sse41-avx-avx2-fma-f16c-avx512-avx512_skylake")
set(ATTN_TARGET_avx512_zen4
    "x86-64-linux-sse41-avx-avx2-fma-f16c-avx512-avx512_skylake-avx512_cannonlake-avx512_zen4")
# GPU targets: the host part is the x86-64 baseline (it only checks arguments and
# launches kernels). CUDA needs no toolkit to build (Halide emits PTX through LLVM) and
# only the driver to run; capability 8.0 PTX runs on A100, and is JIT-compiled for
# newer GPUs (H100, H200). OpenCL runs the same device-neutral schedules on PoCL, the
# CPU OpenCL of CI machines, where no GPU is.
set(ATTN_TARGET_cuda "x86-64-linux-sse41-cuda-cuda_capability_80")
set(ATTN_TARGET_opencl "x86-64-linux-sse41-opencl")
# The Halide runtime every variant shares: the baseline host, with the CUDA and OpenCL
# modules (they open their driver libraries only when a GPU variant runs).
set(ATTN_RUNTIME_TARGET "x86-64-linux-sse41-cuda-opencl")
# Cross-compiled only (schedules/variants.cmake: attn_cross_variant): built, never run here.
set(ATTN_TARGET_arm64 "arm-64-linux")
