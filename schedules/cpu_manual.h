// Hand-written expert CPU schedules, one per generator: GEMM-shaped reductions in
// register tiles (by default 4 rows × 3 vectors) over packed weight panels; the
// fused layer's flash core (attn_gen::FlashAttention) a query block at a time, each key
// block's scores and exponentials in L2 (no S×S buffer unless probabilities are an
// output, memory O(S)); the residual and LayerNorm in the output projection's epilogue.
// GuardWithIf on every split of an output: shapes are runtime values (S = 1, 97,
// 113, d = 40, ...); register tiles at an edge stay whole thanks to the algorithm's
// clamped reads, and what they compute past the edge is never stored. The measured
// comparison is generated/results/comparison.md.
#pragma once

#include "../algorithm/attention_algorithm.h"

namespace attn_sched {

// The hand-written schedules' own parameters: generator parameters whose defaults, ranges
// and searched values are manifest.json's manual_parameters (their one home), tuned per
// ISA, function and shape class by tools/autotune.py. (The flash core's key block belongs
// to the algorithm: attn_gen::Blocking.)
struct CpuTiling {
    // The register tile of every GEMM-shaped reduction: tile_rows rows by tile_vectors
    // vectors of accumulators (12 of the 16 vector registers of SSE/AVX2 by default,
    // leaving room for the loaded row and the broadcasts). The tile is a constant-size Func
    // computed inside its consumer's tile and fully unrolled, so LLVM keeps it in registers
    // for the whole reduction; the algorithm clamps edge reads, so edge tiles are whole too.
    int tile_rows, tile_vectors;
    // Query rows per block of the attention core (of the flash core's algorithm, and of
    // the stages' schedules): each tile of K or V loaded for a block is reused by all of
    // its rows, so larger blocks stream K and V fewer times at long contexts; a block's
    // scores and exponentials (query_block × key_block floats each) stay in L2.
    int query_block;
    // The weighted sum's tile: context_vectors vectors of the head dimension (16 floats
    // on AVX2 divide d = 32, 64, 80) by tile_rows query rows.
    int context_vectors;
};

// Whether the target sums u8·i8 quads natively (vpdpbusd), which decides how the algorithm
// sums int8 products (attn_gen::Int8Sum), and bf16 pairs (vdpbf16ps), which with amx_tiles
// decides whether the flash core holds its bf16 operands as f32 values (attn_gen::Bf16Core::widened:
// neither instruction).
bool native_int8(const Halide::Target &target);
bool native_bf16(const Halide::Target &target);
// Whether the bf16 and int8 projections run in AMX tiles (attn_gen::LayerInputs::amx_tiles), and a
// bf16 flash core's products (attn_gen::Bf16Core::amx_tiles).
bool amx_tiles(const Halide::Target &target);

void schedule_qkv_projection_cpu(attn_gen::Linear q, attn_gen::Linear k, attn_gen::Linear v, const CpuTiling &tiling,
                                 const Halide::Target &target);
void schedule_attention_scores_cpu(attn_gen::Scores scores, const CpuTiling &tiling, const Halide::Target &target);
void schedule_masked_softmax_cpu(attn_gen::MaskedSoftmax softmax, const CpuTiling &tiling,
                                 const Halide::Target &target);
void schedule_weighted_sum_cpu(attn_gen::WeightedSum context, const CpuTiling &tiling, const Halide::Target &target);
void schedule_output_layernorm_cpu(attn_gen::OutputLayerNorm output, const CpuTiling &tiling,
                                   const Halide::Target &target);
void schedule_attention_layer_cpu(attn_gen::AttentionLayer layer, bool probs_are_output, const CpuTiling &tiling,
                                  const Halide::Target &target);
// The attention core alone: the flash core, key_end (each batch's last real key) and `out`,
// the generator's copy of its context.
void schedule_attention_core_cpu(attn_gen::FlashAttention flash, Halide::Func key_end, Halide::Func out,
                                 const CpuTiling &tiling, const Halide::Target &target);

}  // namespace attn_sched
