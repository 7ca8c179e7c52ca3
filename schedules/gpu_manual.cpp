#include "gpu_manual.h"

#include <algorithm>

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
    for (std::size_t n = 0; n < outer_k.size(); ++n)
        preserved.push_back({outer_k[n], Var("outer_k" + std::to_string(n))});
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

// A projection out(col, row, batch) = f(product(col, row, batch)), product reducing
// Σ_k A(k, row, batch) · W_t(col, k) over `k` (innermost first), the way Halide's
// apps/cuda_mat_mul multiplies on a GPU: no shared memory and no synchronization. Each
// thread accumulates a kVector (columns, one float4) × t.thread_rows (rows) tile in
// registers; per step of k it loads W_t's row as one float4 and thread_rows input values,
// which the threads of a warp on the same rows share (broadcast loads from L1). W_t is the
// weight with output features innermost: the fused layer's arrives so, prepared once by
// the runtime (attn_gen::WeightLayout); a stage's, nn.Linear's with input features
// innermost, is transposed per call. A block is t.col_threads threads along columns by
// t.row_threads along rows.
constexpr int kVector = 4;
constexpr int kUnrollK = 8;
void gpu_projection(Func out, Func product, Func weight_t, attn_gen::WeightLayout layout, const Var &col,
                    VarOrRVar row, const Var &batch, const std::vector<RVar> &k, const GpuTiling &t) {
    // A weight prepared transposed is read in place (inlined: no kernel). Else W_t(col, k) =
    // W(k, col) per call, lanes along k: the reads coalesce, and the strided writes meet in
    // L2 (a weight is 2.25 MiB at H = 768) before they reach memory.
    if (layout == attn_gen::WeightLayout::linear) {
        const std::vector<Var> a = weight_t.args();
        Var ko{"ko"}, to{"to"}, ki{"ki"}, ti{"ti"};
        weight_t.compute_root().gpu_tile(a[1], a[0], ko, to, ki, ti, kLanes, kRowThreads, kGuard);
    }
    Var co{"co"}, ci{"ci"}, ct{"ct"}, cv{"cv"};
    VarOrRVar ro("ro", row.is_rvar), ri("ri", row.is_rvar), rt("rt", row.is_rvar), ru("ru", row.is_rvar);
    out.compute_root();
    Stage stage = out.has_update_definition() ? Stage(out.update()) : Stage(out);
    stage.split(col, co, ci, kVector * t.col_threads, kGuard)
        .split(row, ro, ri, t.thread_rows * t.row_threads, kGuard)
        .split(ci, ct, cv, kVector)
        .split(ri, rt, ru, t.thread_rows)
        .reorder(cv, ru, ct, rt, co, ro, batch)
        .gpu_blocks(co, ro, batch)
        .gpu_threads(ct, rt)
        .unroll(cv)  // not vectorized: a guarded vector store has no OpenCL C form in Halide 21
        .unroll(ru);
    // The product's own row: `row`, or for an update's RVar the product's (its second argument).
    const Var product_row = row.is_rvar ? product.args()[1] : row.var;
    // Whole tiles at the edges too (the algorithm clamps the reads): the unrolled loops need
    // a constant extent, which bounds inference cannot always prove of a guarded tile
    // (packed sequences' K and V, read at data-dependent rows).
    product.compute_at(out, ct)
        .store_in(MemoryType::Register)
        .bound_extent(product_row, t.thread_rows)
        .unroll(col)
        .unroll(product_row);
    std::vector<VarOrRVar> order{col, product_row};
    RVar k_outer{"k_outer"}, k_inner{"k_inner"};
    Stage update = product.update();
    update.split(k.front(), k_outer, k_inner, kUnrollK);
    order.push_back(k_inner);
    order.push_back(k_outer);
    order.insert(order.end(), k.begin() + 1, k.end());
    update.reorder(order).unroll(col).unroll(product_row).unroll(k_inner);
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

}  // namespace

void schedule_qkv_projection_gpu(attn_gen::Linear q, attn_gen::Linear k, attn_gen::Linear v, const GpuTiling &t) {
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    // input(k, s, b) and weight_transposed(o, k) = weight(k, o): k is contiguous in both.
    for (attn_gen::Linear l : {q, k, v}) {
        const VarOrRVar rows = l.row.defined() ? VarOrRVar(l.row.x) : VarOrRVar(s);
        gpu_projection(l.out, l.product, l.weight_transposed, l.weight_layout, o, rows, b, {l.k.x}, t);
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
void schedule_output_layernorm_gpu(attn_gen::OutputLayerNorm n, const GpuTiling &t) {
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    gpu_projection(n.dense, n.projection, n.weight_transposed, n.weight_layout, o, s, b,
                   {n.in_feature.x, n.in_feature.y}, t);
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

// The flash core (attn_gen::FlashAttention), FlashAttention's loop with one query per
// thread: a GPU block per (query block, head, batch), query_block threads, walks the key
// blocks one after another. For each key block: Q·Kᵀ for its queries, a slice of
// kFeaturesPerBlock features at a time (the slice's K tile staged in shared memory by the
// whole block, each thread's partial dot products in registers, added to the block's
// scores in shared memory); then each thread, in registers, its query's scores, their max,
// exponentials and sum, and their weighted sum of V (the block's V tile staged in shared
// memory), folded into its query's running (context, max, sum). The running state stays in
// shared memory: a few loads and stores per key block against 2·key_block·d FMAs (in
// registers it would hold the max and sum once per feature, as the algorithm's Tuple
// does, and spill). Every thread reads the same K and V element at the same time: shared
// memory broadcasts, in vectors of 4. The shared memory is a constant whatever the head
// dimension (36 KiB at 32 queries by 32 keys); a head dimension over kFeaturesPerBlock
// takes several passes over the keys, each computing the scores again for its features.
// Nothing of size S_q × S_k, memory O(S). Registers: manifest.json's gpu_max_registers.
constexpr int kFeaturesPerBlock = 64;
void schedule_flash_core(attn_gen::FlashAttention f) {
    const Var &e = dims.head_dim, &h = dims.head, &b = dims.batch;
    const Var &qi = dims.query_in_block, &kl = dims.key_in_chunk, &kc = dims.key_chunk;
    const Var &qb = dims.query_block, &kb = dims.key_block;
    const RVar &lane = f.key_in_block.x, &chunk = f.key_in_block.y, &key_block = f.key_blocks.x;
    Var eb{"eb"}, ei{"ei"};
    // The kernel: block_result, the context by query block (ctx reads it by query, inlined
    // into whatever consumes the context), a thread per query of the block.
    f.block_result.compute_root()
        .split(e, eb, ei, kFeaturesPerBlock, kGuard)
        .reorder(ei, qi, eb, qb, h, b)
        .gpu_blocks(qb, h, b)
        .gpu_threads(qi)
        .unroll(ei);
    // The running state, whole tiles of features (the algorithm clamps reads past the head
    // dimension) unrolled so that every index is a constant; the key blocks outside the
    // threads, each thread updating its query's row.
    f.running.compute_at(f.block_result, eb)
        .store_in(MemoryType::GPUShared)
        .bound_extent(e, kFeaturesPerBlock)
        .gpu_threads(qi)
        .unroll(e);
    f.running.update().reorder(e, qi, key_block).gpu_threads(qi).unroll(e);
    LoopLevel step(f.running, qi);
    const int chunks = f.blocking.chunks(), chunk_keys = f.blocking.key_chunk;
    const Var &j = dims.key;
    LoopLevel block_step(f.running, key_block);
    Var lane_outer{"lane_outer"}, thread_lane{"thread_lane"}, vector_lane{"vector_lane"}, slice{"slice"};
    RVar e_outer{"e_outer"}, e_inner{"e_inner"};
    // Q·Kᵀ of the key block for the block's queries (in shared memory), a slice of
    // kFeaturesPerBlock features of the head dimension at a time: each slice's K tile is
    // staged in shared memory by the whole block, then each thread adds its query's partial
    // dot products over the slice (in registers: the slice's features outermost, the block's
    // keys inside, so that each loaded Q value serves every key) to its row. The tiles'
    // sizes are constants whatever the head dimension: kFeaturesPerBlock features of the
    // key block's keys.
    f.dot.compute_at(block_step)
        .store_in(MemoryType::GPUShared)
        .bound_extent(kl, chunk_keys)
        .bound_extent(kc, chunks)
        .bound_extent(kb, 1)
        .gpu_threads(qi)
        .unroll(kl)
        .unroll(kc);
    Func slice_dot = f.dot.update().split(f.e.x, e_outer, e_inner, kFeaturesPerBlock, kGuard).rfactor(e_outer, slice);
    f.dot.update().reorder(kl, kc, qi, e_outer).gpu_threads(qi).unroll(kl).unroll(kc);
    LoopLevel slice_step(f.dot, e_outer);
    slice_dot.compute_at(f.dot, qi)
        .store_in(MemoryType::Register)
        .bound_extent(kl, chunk_keys)
        .bound_extent(kc, chunks)
        .unroll(kl)
        .unroll(kc);
    // Vectors of 4 along the tiles' contiguous side (keys of K, features of V): shared
    // loads of 16 bytes, one per 4 FMAs.
    slice_dot.update()
        .reorder(kl, kc, e_inner)
        .split(kl, kl, vector_lane, 4)
        .vectorize(vector_lane)
        .unroll(kl)
        .unroll(kc);
    // The K slice and the V tile, staged by the whole block. V: lanes along the head
    // dimension, where global memory is contiguous (coalesced loads, conflict-free stores).
    // K: lanes along the keys, so that its tile keeps keys innermost and a thread's vector of
    // 4 keys is one shared load; its global reads are then a row per lane, each row's slice
    // (256 contiguous bytes) read over successive loads through L1. One-dimensional, as every
    // thread loop of this kernel: in a two-dimensional block, Halide 21 runs a
    // one-dimensional loop on every row of threads.
    Func keys = f.keys.in(slice_dot), values = f.values.in(f.block_context);
    keys.compute_at(slice_step).store_in(MemoryType::GPUShared).bound_extent(e, kFeaturesPerBlock);
    keys.split(j, lane_outer, thread_lane, kLanes, kGuard).reorder(thread_lane, e, lane_outer).gpu_threads(thread_lane);
    values.compute_at(block_step).store_in(MemoryType::GPUShared);
    values.split(e, lane_outer, thread_lane, kLanes, kGuard)
        .reorder(thread_lane, lane_outer, j)
        .gpu_threads(thread_lane);
    // Then one key block of one query, in registers: scores, max, exponentials, sum and the
    // weighted sum of V, whole tiles (their extents stated: the chunks visited depend on the
    // data), the chunks past the last key visited left uncomputed.
    for (Func tile : {f.scores, f.block_exp}) {
        tile.compute_at(step)
            .store_in(MemoryType::Register)
            .bound_extent(kl, chunk_keys)
            .bound_extent(kc, chunks)
            .bound_extent(kb, 1)
            .bound_extent(qi, 1)
            .unroll(kl)
            .unroll(kc);
    }
    for (Func tile : {f.scores, f.block_exp}) tile.update().unroll(lane).unroll(chunk);
    for (Func row : {f.block_max, f.block_sum}) {
        row.compute_at(step).store_in(MemoryType::Register).bound_extent(kb, 1).bound_extent(qi, 1);
        row.update().unroll(lane).unroll(chunk);
    }
    f.block_context.compute_at(step)
        .store_in(MemoryType::Register)
        .bound_extent(e, kFeaturesPerBlock)
        .bound_extent(kb, 1)
        .bound_extent(qi, 1)
        .unroll(e);
    f.block_context.update()
        .reorder(e, lane, chunk)
        .split(e, e, vector_lane, 4)
        .vectorize(vector_lane)
        .unroll(e)
        .unroll(lane)
        .unroll(chunk);
}

// Each batch's last real key: a block per batch, one thread scanning its mask.
void schedule_key_end(Func key_end) {
    key_end.compute_root().gpu_blocks(dims.batch);
    key_end.update().gpu_blocks(dims.batch);
}

}  // namespace

void schedule_attention_layer_gpu(attn_gen::AttentionLayer l, bool probs_are_output, const GpuTiling &t) {
    schedule_qkv_projection_gpu(l.q, l.k, l.v, t);
    if (probs_are_output) {
        // The probabilities are an S×S output anyway: the stages' kernels, in sequence.
        schedule_attention_scores_gpu(l.scores);
        schedule_masked_softmax_gpu(l.softmax);
        schedule_weighted_sum_gpu(l.context);
    } else {
        if (!l.packed.defined()) schedule_key_end(l.key_end);  // packed: each sequence's length, two loads inlined
        schedule_flash_core(l.flash);
    }
    if (l.packed.defined()) {
        // Each token row's sequence (a thread per row counting the starts before it), and the
        // core's context gathered back to token rows (lanes along the head dimension).
        const Var &s = dims.seq, &e = dims.head_dim, &h = dims.head;
        Var so{"so"}, si{"si"}, feature{"feature"}, fo{"fo"}, fi{"fi"};
        l.packed.sequence.compute_root().gpu_tile(s, so, si, kLanes, kGuard);
        l.packed.sequence.update().gpu_tile(s, so, si, kLanes, kGuard);
        l.packed.ctx.compute_root()
            .fuse(e, h, feature)
            .gpu_tile(feature, s, fo, so, fi, si, kLanes, kRowThreads, kGuard);
    }
    schedule_output_layernorm_gpu(l.output, t);
}

void schedule_attention_core_gpu(attn_gen::FlashAttention flash, Func key_end, Func out) {
    schedule_key_end(key_end);
    schedule_flash_core(flash);
    // The output copies the core's context: lanes along the features (head_dim, head).
    const Var &e = dims.head_dim, &h = dims.head, &i = dims.query;
    Var feature{"feature"}, fo{"fo"}, fi{"fi"}, io{"io"}, ii{"ii"};
    out.compute_root().fuse(e, h, feature).gpu_tile(feature, i, fo, io, fi, ii, kLanes, kRowThreads, kGuard);
}

}  // namespace attn_sched
