# The variant list: one line per AOT variant, `attn_variant(<schedule source> <ISA>)`.
# Each line builds every stage and the fused layer with that schedule for that
# instruction set (ISAs are defined in cmake/AttnTargets.cmake). The runtime's
# dispatch, the tests and the benchmarks all iterate the header generated from
# this list, so a new line is dispatched, tested and benchmarked with no other change.
attn_variant(manual sse41)
attn_variant(manual avx2)
attn_variant(manual avx512_zen4)
