# The variant list: one line per AOT variant, `attn_variant(<schedule source> <ISA>)`.
# Each line builds every stage and the fused layer with that schedule for that
# instruction set (ISAs are defined in cmake/AttnTargets.cmake). The runtime's
# dispatch, the tests and the benchmarks all iterate the header generated from
# this list, so a new line is dispatched, tested and benchmarked with no other change.

# Autotuned (tools/autotune.sh): the hand-written schedule with the parameters that
# measured fastest for that ISA, frozen with their provenance in
# schedules/autotuned/<isa>/<function>.json. Listed first, so select_variant() prefers
# them over the other variants of the same ISA.
attn_variant(autotuned sse41)
attn_variant(autotuned avx2)

# Hand-written expert schedules (schedules/cpu_manual.cpp).
attn_variant(manual sse41)
attn_variant(manual avx2)
attn_variant(manual avx512_skylake)  # Intel Skylake-SP to Sapphire Rapids: no zen4 extras needed
attn_variant(manual avx512_zen4)

# Autoscheduled: Mullapudi2016 and Adams2019 frozen per target under
# schedules/frozen/<source>/<isa>/
# (regenerate with tools/freeze_schedules.sh; never edited by hand); Li2018 run at
# build time, since its emitted schedules do not compile (cmake/AttnVariants.cmake).
attn_variant(mullapudi2016 sse41)
attn_variant(mullapudi2016 avx2)
attn_variant(mullapudi2016 avx512_zen4)
attn_variant(adams2019 sse41)
attn_variant(adams2019 avx2)
attn_variant(adams2019 avx512_zen4)
attn_variant(li2018 sse41)
attn_variant(li2018 avx2)
attn_variant(li2018 avx512_zen4)

# GPU: every stage and the fused layer for CUDA (built here, no toolkit needed; runnable
# where a CUDA driver and device are): the hand-written schedules
# (schedules/gpu_manual.cpp), Anderson2021 and Mullapudi2016 (experimental GPU
# schedule) frozen for the target, Li2018 run at build time.
attn_variant(manual cuda)
attn_variant(anderson2021 cuda)
attn_variant(mullapudi2016 cuda)
attn_variant(li2018 cuda)
# The same GPU schedules through OpenCL: CI runs them on the CPU (PoCL), checking the
# GPU schedules against the reference on machines without a GPU.
attn_variant(manual opencl)
attn_variant(anderson2021 opencl)
attn_variant(mullapudi2016 opencl)
attn_variant(li2018 opencl)

# Cross-compiled to show the generators target other CPUs: built, not run here.
attn_cross_variant(manual arm64)
