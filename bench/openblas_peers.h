// The OpenBLAS peers of the comparison: what a user would otherwise write.
#pragma once

#include "cases.h"
#include "problems/problem.h"

#include <vector>

namespace attn::bench {

// Scratch for the peers, sized for one problem.
struct BlasWorkspace {
    std::vector<float> q, k, v, ctx, dense, scores;  // scores: one head's S_q × S_k
    explicit BlasWorkspace(const testing::Problem &p);
};

// Which of the layer's GEMMs a roofline run times.
enum class Gemms { qkv_projection, attention_scores, weighted_sum, output_projection, layer };

// The GEMMs of the layer (or of one stage) as OpenBLAS sgemm calls of the same
// shapes, without softmax, masking or LayerNorm: the time a GEMM library needs for
// the layer's FLOPs. Results are meaningless; only the time counts.
void openblas_roofline(Gemms which, const testing::LayerData &data, BlasWorkspace &ws);

// The whole layer from OpenBLAS sgemm calls and plain loops, one head at a time
// (the S_q × S_k scores of one head are materialized): the unfused baseline.
// Writes y [B, S_q, H].
void openblas_unfused(const testing::LayerData &data, BlasWorkspace &ws, float *y);

// The comparison's cases of these peers on one problem: the layer's roofline (`roofline`)
// or the unfused layer, checked against the reference; one stage's roofline.
Prepared openblas_layer(bool roofline, const testing::ListedProblem &lp);
Prepared openblas_stage(Gemms gemms, const testing::ListedProblem &lp);

}  // namespace attn::bench
