// Hand-written expert CPU schedules, one per generator: GEMM-shaped reductions in
// register tiles (4 rows × 3 vectors, 12 accumulators) over packed weight panels, an
// attention core that keeps one block of query rows' scores in cache (flash-style:
// no S×S buffer unless probabilities are an output, memory O(S)), softmax fused into
// the scores, the residual and LayerNorm into the output projection's epilogue.
// GuardWithIf on every split of an output: shapes are runtime values (S = 1, 97,
// 113, d = 40, ...); register tiles at an edge stay whole thanks to the algorithm's
// clamped reads, and what they compute past the edge is never stored.
//
// Reached (fused self_attention, attn_bench on the 2-core AMD EPYC (Zen, AVX2) dev
// machine, 2026-11-21, same run as the OpenBLAS sgemm roofline of the layer's GEMMs):
// BERT-base B=1 S=128 manual_avx2 4.56 ms = 1.04x the roofline (4.39 ms); S=2048
// 219 ms = 1.43x (153 ms). The full table is bench/results/comparison.md.
#pragma once

#include "../generators/attention_algorithm.h"

namespace attn_sched {

void schedule_qkv_projection_cpu(attn_gen::Linear q, attn_gen::Linear k,
                                 attn_gen::Linear v, const Halide::Target &target);
void schedule_attention_scores_cpu(attn_gen::Scores scores, const Halide::Target &target);
void schedule_masked_softmax_cpu(attn_gen::MaskedSoftmax softmax, const Halide::Target &target);
void schedule_weighted_sum_cpu(attn_gen::WeightedSum context, const Halide::Target &target);
void schedule_output_layernorm_cpu(attn_gen::OutputLayerNorm output, const Halide::Target &target);
void schedule_attention_layer_cpu(attn_gen::AttentionLayer layer, bool probs_are_output,
                                  const Halide::Target &target);

}  // namespace attn_sched
