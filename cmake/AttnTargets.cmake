# Instruction sets the project builds for, and the Halide target of each. The
# runtime checks the matching CPU features before calling a variant
# (runtime/src/cpu_features.cpp); keep the two in step.
set(ATTN_TARGET_sse41 "x86-64-linux-sse41")
set(ATTN_TARGET_avx2 "x86-64-linux-sse41-avx-avx2-fma-f16c")
set(ATTN_TARGET_avx512_skylake "x86-64-linux-sse41-avx-avx2-fma-f16c-avx512-avx512_skylake")
set(ATTN_TARGET_avx512_zen4
    "x86-64-linux-sse41-avx-avx2-fma-f16c-avx512-avx512_skylake-avx512_cannonlake-avx512_zen4")
# Cross-compiled only (schedules/variants.cmake: attn_cross_variant): built, never run here.
set(ATTN_TARGET_arm64 "arm-64-linux")
