// Hand-written CPU schedules, one per generator. They are "sound" schedules:
// parallel over batch, heads and row blocks, vectorized along the contiguous
// dimension, register tiles for the GEMM-shaped reductions, and every
// intermediate O(S) in memory (no S×S buffer unless probabilities are an output).
// GuardWithIf everywhere: shapes are runtime values (S = 1, 97, 113, d = 40, ...),
// so no split may read or write past a buffer's edge.
//
// Reached (fused self_attention, BERT-base B=1 S=128 H=768, padded; tools/main.sh,
// median of 30): avx2 19.9 ms, sse41 28.4 ms on the 2-core AMD EPYC dev machine,
// 2026-11-21 (another run: avx2 14.9 ms). Time these against each other in one run.
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
