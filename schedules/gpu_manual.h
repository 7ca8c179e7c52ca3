// Hand-written GPU schedules, one per generator. Written against Halide's
// device-neutral GPU loops (gpu_blocks, gpu_threads, GPUShared memory), so the same
// schedule compiles for CUDA (the shipped variants) and for OpenCL (run on the CPU by
// PoCL in CI, where there is no GPU).
//
// - The stages' Q·Kᵀ and probs·V: a block computes a tile of the output, each thread a
//   register-sized sub-tile; the reduction runs in chunks whose operand tiles are
//   staged in shared memory by coalesced loads, then reused by every thread of the block.
// - Row reductions (softmax max and sum, LayerNorm mean and variance): one warp of 32
//   lanes per row, each lane reducing a strided slice (coalesced reads), the 32 partials
//   combined in shared memory.
// - The fused layer's attention core is the algorithm's flash core (one pass over the
//   keys with an online softmax, attn_gen::FlashAttention), 16 threads a query, one or
//   more queries a thread (GpuTiling::thread_queries): Q·Kᵀ,
//   the scores and the exponentials a few keys a thread, the running state a few features
//   a thread, K and V tiles and the block's scores in shared memory; no S×S buffer, memory O(S).
// - The projections: each thread a register tile of output features × rows (no shared
//   memory, Halide's apps/cuda_mat_mul), the reduction optionally split in parts whose
//   partial results one more kernel adds (GpuTiling::split_k).
//
// Checked against the reference in CI on OpenCL (PoCL), and on an NVIDIA GPU by
// tools/gpu_machine.sh test when one is lent (an H200 on 2026-11-27). Every kernel fits the shared
// memory of a block (manifest.json: gpu_shared_memory_per_block), checked at build time where Halide bounds it and by
// the tests' OpenCL device at run time (README, "Shared memory").
#pragma once

#include "../algorithm/attention_algorithm.h"

namespace attn_sched {

// The GPU schedule's own parameters: generator parameters whose defaults, ranges and searched
// values are manifest.json's manual_parameters (device "gpu"), tuned per function on a GPU
// by tools/gpu_autotune.py. (The flash core's query and key blocks are the algorithm's:
// attn_gen::Blocking.)
struct GpuTiling {
    // A projection's register tile: each thread computes 4 output features (adjacent in the
    // transposed weight) by thread_rows token rows; a block is col_threads × row_threads
    // threads.
    int thread_rows, col_threads, row_threads;
    // The reduction split into split_k strided parts (input features k ≡ part mod split_k),
    // each part's partial products computed by their own blocks, then added.
    int split_k = 1;
    // Input features a projection thread's loop takes a step, unrolled: the loads of that many
    // in flight, for as many more registers (8: 236-255 a thread, ptxas sm_90).
    int unroll_k = 8;
    // The flash core's threads a query (a power of 2, at most its key_chunk and slice).
    int query_lanes = 16;
    // The flash core's queries a thread (1, 2 or 4): each K and V value a thread loads from
    // shared memory serves that many queries' multiply-adds.
    int thread_queries = 1;
};

// outputs_inside: Q, K and V are Funcs inside the pipeline (the fused layer's), not its outputs.
void schedule_qkv_projection_gpu(attn_gen::Linear q, attn_gen::Linear k, attn_gen::Linear v, const GpuTiling &tiling,
                                 bool outputs_inside = false);
void schedule_attention_scores_gpu(attn_gen::Scores scores);
void schedule_masked_softmax_gpu(attn_gen::MaskedSoftmax softmax);
void schedule_weighted_sum_gpu(attn_gen::WeightedSum context);
void schedule_output_layernorm_gpu(attn_gen::OutputLayerNorm output, const GpuTiling &tiling);
void schedule_attention_layer_gpu(attn_gen::AttentionLayer layer, bool probs_are_output, const GpuTiling &tiling);
// The attention core alone: the flash core, key_end (each batch's last real key) and `out`,
// the generator's copy of its context.
void schedule_attention_core_gpu(attn_gen::FlashAttention flash, Halide::Func key_end, Halide::Func out,
                                 const GpuTiling &tiling);

}  // namespace attn_sched
