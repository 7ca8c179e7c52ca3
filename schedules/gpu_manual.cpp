#include "gpu_manual.h"

namespace attn_sched {

using namespace Halide;
using attn_gen::Dims;

namespace {

const Dims dims;
constexpr TailStrategy kGuard = TailStrategy::GuardWithIf;

// Every kernel runs blocks of kLanes × kRowThreads threads: one warp across the
// fastest-varying index (coalesced loads and stores), eight warps across rows.
constexpr int kLanes = 32;
constexpr int kRowThreads = 8;

// A GEMM-shaped reduction's tiling: a block computes kLanes · cols_per_thread columns
// by kRowThreads · rows_per_thread rows of the output; each thread accumulates its
// contiguous cols_per_thread × rows_per_thread sub-tile in registers over a chunk of
// k_chunk reduction steps, whose operand tiles the block has staged in shared memory,
// then adds it to the block's accumulator.
struct GemmTile {
    int cols_per_thread = 2;
    int rows_per_thread = 4;
    int k_chunk = 32;
    int cols() const { return kLanes * cols_per_thread; }
    int rows() const { return kRowThreads * rows_per_thread; }
};
constexpr GemmTile kGemm{};

// The fused attention core: query rows per block, and keys per staged chunk.
constexpr int kQueryBlock = 32;
constexpr int kKeyChunk = 32;

// An operand tile of a reduction to stage in shared memory: the Func its consumer
// calls, and which of its arguments is contiguous in memory (read along lanes, so
// loads coalesce) and which spans the tile's other side.
struct Operand {
    Func func;
    int contiguous_arg;
    int other_arg;
};

// Computes `tile` at `at` in shared memory, the block's threads loading it with lanes
// along its contiguous argument.
void stage_in_shared(Func tile, int contiguous_arg, int other_arg, LoopLevel at) {
    const std::vector<Var> args = tile.args();
    Var lane_outer{"lane_outer"}, lane{"lane"}, row_outer{"row_outer"}, row_thread{"row_thread"};
    tile.compute_at(at)
        .store_in(MemoryType::GPUShared)
        .split(args[contiguous_arg], lane_outer, lane, kLanes, kGuard)
        .split(args[other_arg], row_outer, row_thread, kRowThreads, kGuard)
        .reorder(lane_outer, row_outer, lane, row_thread)
        .gpu_threads(lane, row_thread);
}

struct Gemm {
    LoopLevel block;  // inside the block loops of the output's kernel
    LoopLevel chunk;  // once per chunk of the reduction, where its operands are staged
};

// `out` (col, row, ...) reads `product` (col, row, ...) = Σ_k a(k, row) · b(col, k),
// whose update reduces over `k` and then `outer_k` (e.g. the heads of a head-view
// input). `blocks` are the out's remaining dimensions, fused into the third block
// index. An operand with an undefined Func is left to the caller to schedule.
Gemm gpu_gemm(Func out, Func product, const Var &col, const Var &row, const std::vector<Var> &blocks, RVar k,
              const std::vector<RVar> &outer_k, Operand a, Operand b, const GemmTile &t = kGemm) {
    Var co{"co"}, ci{"ci"}, ro{"ro"}, ri{"ri"}, lane{"lane"}, cu{"cu"}, rt{"rt"}, ru{"ru"};
    out.compute_root()
        .tile(col, row, co, ro, ci, ri, t.cols(), t.rows(), kGuard)
        .split(ci, lane, cu, t.cols_per_thread)
        .split(ri, rt, ru, t.rows_per_thread);
    std::vector<VarOrRVar> out_order{cu, ru, lane, rt, co, ro};
    if (!blocks.empty()) {
        Var block_z = blocks[0];
        for (std::size_t n = 1; n < blocks.size(); ++n) {
            Var fused{"blocks_" + std::to_string(n)};
            out.fuse(block_z, blocks[n], fused);
            block_z = fused;
        }
        out_order.push_back(block_z);
        out.reorder(out_order).gpu_blocks(co, ro, block_z);
    } else {
        out.reorder(out_order).gpu_blocks(co, ro);
    }
    out.gpu_threads(lane, rt).unroll(cu).unroll(ru);

    // The block's accumulator, in shared memory; whole tiles (the algorithm clamps
    // reads past the edge), so its size is a constant.
    RVar ko{"ko"}, ki{"ki"};
    std::vector<std::pair<RVar, Var>> preserved{{ko, Var("k_chunk")}};
    for (std::size_t n = 0; n < outer_k.size(); ++n) preserved.push_back({outer_k[n], Var("outer_k" + std::to_string(n))});
    Func thread_tile = product.update().split(k, ko, ki, t.k_chunk, kGuard).rfactor(preserved);

    product.compute_at(out, co)
        .bound_extent(col, t.cols())
        .bound_extent(row, t.rows())
        .split(col, lane, cu, t.cols_per_thread)
        .split(row, rt, ru, t.rows_per_thread)
        .reorder(cu, ru, lane, rt)
        .gpu_threads(lane, rt)
        .unroll(cu)
        .unroll(ru);
    std::vector<VarOrRVar> order{cu, ru, lane, rt, ko};
    order.insert(order.end(), outer_k.begin(), outer_k.end());
    product.update()
        .split(col, lane, cu, t.cols_per_thread)
        .split(row, rt, ru, t.rows_per_thread)
        .reorder(order)
        .gpu_threads(lane, rt)
        .unroll(cu)
        .unroll(ru);

    // Each thread's chunk: a register tile reducing over the chunk's k.
    thread_tile.compute_at(product, lane).store_in(MemoryType::Register).unroll(col).unroll(row);
    thread_tile.update().reorder(col, row, ki).unroll(col).unroll(row);

    LoopLevel chunk(product, ko);
    if (a.func.defined()) stage_in_shared(a.func.in(thread_tile), a.contiguous_arg, a.other_arg, chunk);
    if (b.func.defined()) stage_in_shared(b.func.in(thread_tile), b.contiguous_arg, b.other_arg, chunk);
    return {LoopLevel(out, co), chunk};
}

// A reduction over one row (`row` is its first argument), computed at `block` for the
// block's rows: a warp per row, lane l reducing elements l, l + 32, ... (rfactor), the
// 32 partials then combined by one thread per row. With `chunk_outside_threads`, the
// loop over chunks of 32 elements encloses the thread loops, so the caller can stage
// per chunk what the elements need (returned as the chunk loop level).
struct RowReduction {
    Func partials;
    LoopLevel chunk;
    Var row_inner;  // the partials' innermost per-thread loop (a row)
};
RowReduction warp_row_reduction(Func reduction, RVar along, const Var &row, LoopLevel block,
                                bool chunk_outside_threads) {
    Var lane{"lane"}, rs{"rs"}, rt{"rt"};
    RVar chunk{"chunk"}, within{"within"};
    Func partials = reduction.update().split(along, chunk, within, kLanes, kGuard).rfactor(within, lane);
    partials.compute_at(block)
        .store_in(MemoryType::GPUShared)
        .split(row, rs, rt, kRowThreads, kGuard)
        .reorder(rs, lane, rt)
        .gpu_threads(lane, rt);
    partials.update().split(row, rs, rt, kRowThreads, kGuard).gpu_threads(lane, rt);
    if (chunk_outside_threads) {
        partials.update().reorder(rs, lane, rt, chunk);
    } else {
        partials.update().reorder(chunk, rs, lane, rt);
    }
    reduction.compute_at(block).split(row, rs, rt, kRowThreads, kGuard).reorder(rs, rt).gpu_threads(rt);
    reduction.update().split(row, rs, rt, kRowThreads, kGuard).reorder(within, rs, rt).gpu_threads(rt);
    return {partials, LoopLevel(partials, chunk), rs};
}

// A (key, query, ...) Func of the rows at `at`: lanes along keys, warps along rows.
void rows_along_lanes(Func f, LoopLevel at) {
    const Var &j = dims.key, &i = dims.query;
    Var jo{"jo"}, lane{"lane"}, rs{"rs"}, rt{"rt"};
    f.compute_at(at)
        .store_in(MemoryType::GPUShared)
        .split(j, jo, lane, kLanes, kGuard)
        .split(i, rs, rt, kRowThreads, kGuard)
        .reorder(jo, rs, lane, rt)
        .gpu_threads(lane, rt);
}

}  // namespace

void schedule_qkv_projection_gpu(attn_gen::Linear q, attn_gen::Linear k, attn_gen::Linear v) {
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    // input(k, s, b) and weight_transposed(o, k) = weight(k, o): k is contiguous in both.
    for (attn_gen::Linear l : {q, k, v}) {
        gpu_gemm(l.out, l.product, o, s, {b}, l.k, {}, {l.input, 0, 1}, {l.weight_transposed, 1, 0});
    }
}

// probs(j, i, h, b) from scores in memory: a block per kRowThreads rows.
void schedule_masked_softmax_gpu(attn_gen::MaskedSoftmax m) {
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch;
    Var io{"io"}, rt{"rt"}, jo{"jo"}, lane{"lane"};
    m.probs.compute_root()
        .split(i, io, rt, kRowThreads, kGuard)
        .split(j, jo, lane, kLanes, kGuard)
        .reorder(jo, lane, rt, io, h, b)
        .gpu_blocks(io, h, b)
        .gpu_threads(lane, rt);
    LoopLevel block(m.probs, io);
    warp_row_reduction(m.row_max, m.j.x, i, block, false);
    warp_row_reduction(m.row_sum, m.j.x, i, block, false);
}

void schedule_attention_scores_gpu(attn_gen::Scores sc) {
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch;
    // query_heads(e, h, i, b) and key_transposed(j, e, h, b) = K(e, h, j, b): e is contiguous.
    gpu_gemm(sc.scores, sc.dot, j, i, {h, b}, sc.e, {}, {sc.query_heads, 0, 2}, {sc.key_transposed, 1, 0});
}

void schedule_weighted_sum_gpu(attn_gen::WeightedSum w) {
    const Var &e = dims.head_dim, &i = dims.query, &h = dims.head, &b = dims.batch;
    // probs(j, i, h, b): j contiguous; values(e, h, j, b): e contiguous.
    gpu_gemm(w.ctx, w.ctx_sum, e, i, {h, b}, w.j, {}, {w.probs, 0, 1}, {w.values, 0, 2});
}

// dense = residual + bias + ctx·W_oᵀ as a GEMM, then LayerNorm a block of rows at a time.
void schedule_output_layernorm_gpu(attn_gen::OutputLayerNorm n) {
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    gpu_gemm(n.dense, n.projection, o, s, {b}, n.in_feature.x, {n.in_feature.y}, {n.context_heads, 0, 2},
             {n.weight_transposed, 1, 0});
    Var so{"so"}, rt{"rt"}, oo{"oo"}, lane{"lane"};
    n.y.compute_root()
        .split(s, so, rt, kRowThreads, kGuard)
        .split(o, oo, lane, kLanes, kGuard)
        .reorder(oo, lane, rt, so, b)
        .gpu_blocks(so, b)
        .gpu_threads(lane, rt);
    LoopLevel block(n.y, so);
    warp_row_reduction(n.sum, n.row.x, s, block, false);
    warp_row_reduction(n.sum_sq_dev, n.row.x, s, block, false);
}

namespace {

// The attention core without an S×S buffer: a block per (kQueryBlock query rows, 64
// features of a head, head, batch). Three passes over the keys, each recomputing the
// scores of a chunk of keys from Q (staged once per block) and the chunk of K (staged
// per chunk): the row max, the row sum, and probs·V (probs of the chunk in shared
// memory, V's chunk staged).
void schedule_flash_core(attn_gen::AttentionLayer l) {
    const Var &i = dims.query, &e = dims.head_dim, &h = dims.head, &b = dims.batch;
    attn_gen::MaskedSoftmax &m = l.softmax;
    attn_gen::Scores &sc = l.scores;
    GemmTile tile;
    tile.k_chunk = kKeyChunk;
    static_assert(kQueryBlock == kRowThreads * GemmTile{}.rows_per_thread, "a block's rows are one GEMM tile");
    Gemm core = gpu_gemm(l.context.ctx, l.context.ctx_sum, e, i, {h, b}, l.context.j, {}, {}, {l.v_heads, 0, 2},
                         tile);

    // Pass 3: the chunk's probabilities, each score recomputed by the thread that needs it.
    rows_along_lanes(m.probs, core.chunk);
    sc.dot.compute_at(m.probs, Var("jo")).store_in(MemoryType::Register);

    // Passes 1 and 2: the row max and the row sum over chunks of 32 keys, each with its
    // own copy of the scores and their dot products, computed where they are used.
    // (Halide 21 lets a Func be cloned once, so the second copy is a clone of the first.)
    RowReduction max_pass = warp_row_reduction(m.row_max, m.j.x, i, core.block, true);
    RowReduction sum_pass = warp_row_reduction(m.row_sum, m.j.x, i, core.block, true);
    Func exp_sum = m.exp_scores.clone_in(sum_pass.partials);
    Func scores_max = sc.scores.clone_in({max_pass.partials, exp_sum});
    Func scores_sum = scores_max.clone_in(exp_sum);
    Func dot_max = sc.dot.clone_in({scores_max, scores_sum});
    Func dot_sum = dot_max.clone_in(scores_sum);
    dot_max.compute_at(max_pass.partials, max_pass.row_inner).store_in(MemoryType::Register);
    dot_sum.compute_at(sum_pass.partials, sum_pass.row_inner).store_in(MemoryType::Register);

    // Q once per block, K once per chunk of each pass.
    stage_in_shared(sc.query_heads.in({sc.dot, dot_max, dot_sum}), 0, 2, core.block);
    stage_in_shared(sc.key_transposed.in(sc.dot), 1, 0, core.chunk);
    stage_in_shared(sc.key_transposed.in(dot_max), 1, 0, max_pass.chunk);
    stage_in_shared(sc.key_transposed.in(dot_sum), 1, 0, sum_pass.chunk);
}

}  // namespace

void schedule_attention_layer_gpu(attn_gen::AttentionLayer l, bool probs_are_output) {
    schedule_qkv_projection_gpu(l.q, l.k, l.v);
    if (probs_are_output) {
        // The probabilities are an S×S output anyway: the stages' kernels, in sequence.
        schedule_attention_scores_gpu(l.scores);
        schedule_masked_softmax_gpu(l.softmax);
        schedule_weighted_sum_gpu(l.context);
    } else {
        schedule_flash_core(l);
    }
    schedule_output_layernorm_gpu(l.output);
}

}  // namespace attn_sched
