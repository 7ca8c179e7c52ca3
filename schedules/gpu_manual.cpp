#include "gpu_manual.h"

#include <algorithm>
#include <string>

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
// registers; per step of k it loads 4 adjacent values of W_t's row (scalar loads: the tile
// is unrolled, not vectorized) and thread_rows input values, which the threads of a warp on
// the same rows share (broadcast loads from L1). W_t is the
// weight with output features innermost: the fused layer's arrives so, prepared once by
// the runtime (attn_gen::WeightLayout); a stage's, nn.Linear's with input features
// innermost, is transposed per call. A block is t.col_threads threads along columns by
// t.row_threads along rows.
constexpr int kVector = 4;

// How a projection's rows are split into blocks. `whole` (a Func inside the pipeline, whose
// reads of its rows the algorithm clamps): every block a whole tile, the Func's buffer rounded
// up (TailStrategy::RoundUp). Otherwise (a pipeline's output, or rows that are an RVar) the
// last block is guarded, and Halide compiles that block apart, one multiply-add at a time
// behind its bounds checks: on an H100 it held a packed batch's projection (683 token rows)
// to 556 us, where a padded batch's 1024 rows took 102 us (Nsight Compute, 2026-11-28).
enum class Rows { guarded, whole };

// `stage` (of a compute_root Func) tiled over (col, row, batch): a block of t.col_threads ×
// t.row_threads threads, each kVector columns by t.thread_rows rows, unrolled. Returns the
// innermost thread loop's variable, where a thread's tile is computed.
Var tile_stage(Stage stage, const Var &col, VarOrRVar row, const Var &batch, const GpuTiling &t, Rows rows) {
    Var co{"co"}, ci{"ci"}, ct{"ct"}, cv{"cv"};
    VarOrRVar ro("ro", row.is_rvar), ri("ri", row.is_rvar), rt("rt", row.is_rvar), ru("ru", row.is_rvar);
    const TailStrategy row_tail = rows == Rows::whole && !row.is_rvar ? TailStrategy::RoundUp : kGuard;
    stage.split(col, co, ci, kVector * t.col_threads, kGuard)
        .split(row, ro, ri, t.thread_rows * t.row_threads, row_tail)
        .split(ci, ct, cv, kVector)
        .split(ri, rt, ru, t.thread_rows)
        .reorder(cv, ru, ct, rt, co, ro, batch)
        .gpu_blocks(co, ro, batch)
        .gpu_threads(ct, rt)
        .unroll(cv)  // not vectorized: a guarded vector store has no OpenCL C form in Halide 21
        .unroll(ru);
    return ct;
}

// `product`, the thread's tile of `owner`'s tiled stage, computed at the thread (`thread`, from
// tile_stage) in registers. Whole tiles at the edges too (the algorithm clamps the reads): the
// unrolled loops need a constant extent, which bounds inference cannot always prove of a
// guarded tile (packed sequences' K and V, read at data-dependent rows).
void tile_in_registers(Func product, Func owner, const Var &thread, const Var &col, const Var &product_row,
                       const GpuTiling &t) {
    product.compute_at(owner, thread)
        .store_in(MemoryType::Register)
        .bound_extent(product_row, t.thread_rows)
        .unroll(col)
        .unroll(product_row);
}

Stage last_stage(Func f) { return f.has_update_definition() ? Stage(f.update()) : Stage(f); }

// `stage` tiled as tile_stage does, each thread's tile of `product` (reducing over k, innermost
// first) accumulated in registers: k's first RVar unrolled by t.unroll_k. `product_row` is
// product's own row (its second argument where the stage's row is an RVar).
void register_tile(Func owner, Func product, const Var &col, VarOrRVar row, const Var &batch,
                   const Var &product_row, const std::vector<RVar> &k, const GpuTiling &t, Rows rows) {
    tile_in_registers(product, owner, tile_stage(last_stage(owner), col, row, batch, t, rows), col, product_row, t);
    std::vector<VarOrRVar> order{col, product_row};
    RVar k_outer{"k_outer"}, k_inner{"k_inner"};
    Stage update = product.update();
    update.split(k.front(), k_outer, k_inner, t.unroll_k);
    order.push_back(k_inner);
    order.push_back(k_outer);
    order.insert(order.end(), k.begin() + 1, k.end());
    update.reorder(order).unroll(col).unroll(product_row).unroll(k_inner);
}

// `rows`: how `out`'s rows are tiled (whole where it is inside the pipeline); a split
// reduction's partial products are always inside it.
void gpu_projection(Func out, Func product, Func weight_t, attn_gen::WeightLayout layout, const Var &col,
                    VarOrRVar row, const Var &batch, const std::vector<RVar> &k, const GpuTiling &t, Rows rows) {
    // A weight prepared transposed is read in place (inlined: no kernel). Else W_t(col, k) =
    // W(k, col) per call, lanes along k: the reads coalesce, and the strided writes meet in
    // L2 (a weight is 2.25 MiB at H = 768) before they reach memory.
    if (layout == attn_gen::WeightLayout::linear) {
        const std::vector<Var> a = weight_t.args();
        Var ko{"ko"}, to{"to"}, ki{"ki"}, ti{"ti"};
        weight_t.compute_root().gpu_tile(a[1], a[0], ko, to, ki, ti, kLanes, kRowThreads, kGuard);
    }
    // The product's own row: `row`, or for an update's RVar the product's (its second argument).
    const Var product_row = row.is_rvar ? product.args()[1] : row.var;
    // With a split reduction, `product` adds split_k partial products, each a register tile
    // reducing a strided part of k (the outermost RVar's values ≡ part mod split_k) in blocks of
    // its own: `partial`, computed by a kernel tiled as `out` (its parts a block dimension,
    // fused with the batch), then read back from memory as `product` reduces over the parts.
    std::vector<RVar> tile_k = k;
    if (t.split_k > 1) {
        RVar k_part{"k_part"}, k_rest{"k_rest"};
        Var part{"part"}, part_batch{"part_batch"};
        Func partial_product =
            product.update().split(k.back(), k_rest, k_part, t.split_k, kGuard).rfactor(k_part, part);
        tile_k.back() = k_rest;
        Func partial = partial_product.in();
        const std::vector<Var> a = partial.args();  // (col, row, batch, part)
        partial.compute_root().fuse(a[2], a[3], part_batch);
        register_tile(partial, partial_product, a[0], a[1], part_batch, partial_product.args()[1], tile_k, t,
                      Rows::whole);
        // One batch and part a thread (fused into one block index, which bounds them loosely).
        partial_product.bound_extent(partial_product.args()[2], 1).bound_extent(part, 1);
        // The parts added in registers, within out's tile.
        out.compute_root();
        tile_in_registers(product, out, tile_stage(last_stage(out), col, row, batch, t, rows), col, product_row, t);
        product.update().reorder(col, product_row, k_part).unroll(col).unroll(product_row).unroll(k_part);
        return;
    }
    out.compute_root();
    register_tile(out, product, col, row, batch, product_row, tile_k, t, rows);
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

void schedule_qkv_projection_gpu(attn_gen::Linear q, attn_gen::Linear k, attn_gen::Linear v, const GpuTiling &t,
                                 bool outputs_inside) {
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    // input(k, s, b) and weight_transposed(o, k) = weight(k, o): k is contiguous in both.
    for (attn_gen::Linear l : {q, k, v}) {
        const VarOrRVar rows = l.row.defined() ? VarOrRVar(l.row.x) : VarOrRVar(s);
        gpu_projection(l.out, l.product, l.weight_transposed, l.weight_layout, o, rows, b, {l.k.x}, t,
                       outputs_inside ? Rows::whole : Rows::guarded);
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
                   {n.in_feature.x, n.in_feature.y}, t, Rows::whole);
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

// The flash core (attn_gen::FlashAttention): a GPU block per (query block, head, batch)
// walks the key blocks one after another, with `lanes` × query_block / thread_queries
// threads: each query has `lanes` threads (GpuTiling::query_lanes, 16 by default; one query
// per thread left an H200 with about 6 warps an SM at S = 2048: 0.14x PyTorch SDPA's speed),
// and each thread works for thread_queries queries at once (GpuTiling::thread_queries, 1 by
// default). Fewer lanes give each thread more keys and features, and more queries a thread
// reuse each value of K and V it loads: either way more multiply-adds per load from shared
// memory and L1, which bound the core on an H100 (Nsight Compute, 2026-11-28), in fewer threads.
// For each key block, barrier-separated phases over the block's threads:
// 1. Q·Kᵀ for its queries, a slice of the head dimension's features at a time: the slice's
//    K tile staged in shared memory by the whole block, each thread the dot products of
//    key_chunk / lanes adjacent keys of its thread_queries queries in registers (one vector
//    load of K per feature, conflict-free across the lanes, for all its queries; Q's values
//    broadcasts), added to the block's `dot`;
// 2. the scores (scale and bias), a thread per key_chunk / lanes keys of its queries;
// 3. the exponentials, likewise, each thread taking its queries' max over the block itself
//    from the scores in shared memory (broadcast reads: no barrier and no idle threads for it);
// 4. the running (context, max, sum) updated by each thread for slice / lanes features
//    of its queries, the block's sums and its weighted sums of V (the V tile staged in shared
//    memory, lanes along the features; each vector of V serving all its queries) computed in
//    registers beside it.
// The running state stays in shared memory, 12 bytes per feature of the slice and query:
// the slice is 64 features up to 16 queries a block, halved while it times the queries is over 1024,
// so that a block's shared memory, a constant whatever the head dimension, stays within the
// 48 KiB (32 KiB at 16 queries by 32 keys, 28 KiB at 32 queries: Halide's launch). A head dimension over the
// slice takes several passes over the keys, each computing the scores again for its
// features. Nothing of size S_q × S_k, memory O(S). Registers: manifest.json's
// gpu_max_registers.
constexpr int kMaxFeaturesPerSlice = 64;
void schedule_flash_core(attn_gen::FlashAttention f, int lanes, int thread_queries) {
    // A block must fit an SM's 65536 registers: at most 512 threads at one query a thread
    // (about 110 registers each, ptxas sm_90), 256 with more (150-216; a thread may take 255).
    const int queries = f.blocking.query_block, tq = thread_queries;
    const int max_threads = tq == 1 ? 512 : 256;
    if (lanes < 4 || lanes > 32 || (lanes & (lanes - 1)) != 0)
        throw CompileError("gpu_query_lanes=" + std::to_string(lanes) +
                           ": the flash core's threads a query split its 32-key chunks and its features evenly: "
                           "expected 4, 8, 16 or 32");
    if (tq != 1 && tq != 2 && tq != 4)
        throw CompileError("gpu_thread_queries=" + std::to_string(tq) +
                           ": the flash core's queries a thread, unrolled in its registers: expected 1, 2 or 4");
    if (queries % tq != 0)
        throw CompileError("query_block=" + std::to_string(queries) + ": the flash core's threads take " +
                           std::to_string(tq) + " queries each (gpu_thread_queries): expected a multiple of " +
                           std::to_string(tq));
    if (queries / tq * lanes > max_threads)
        throw CompileError("query_block=" + std::to_string(queries) + ": a GPU block of the flash core runs query_block / " +
                           "gpu_thread_queries × gpu_query_lanes threads (" + std::to_string(queries) + " / " +
                           std::to_string(tq) + " × " + std::to_string(lanes) + "), at most " +
                           std::to_string(max_threads) + " at " + std::to_string(tq) +
                           (tq == 1 ? " query" : " queries") + " a thread: expected 1 to " +
                           std::to_string(max_threads / lanes * tq));
    // The queries' threads: query_in_block split in query_thread (a thread index) and
    // thread_query (unrolled in each thread's registers).
    const int query_threads = queries / tq;
    int slice_features = kMaxFeaturesPerSlice;
    while (slice_features > lanes && slice_features * queries > 1024) slice_features /= 2;
    const int features_per_lane = slice_features / lanes;
    const Var &e = dims.head_dim, &h = dims.head, &b = dims.batch;
    const Var &qi = dims.query_in_block, &kl = dims.key_in_chunk, &kc = dims.key_chunk;
    const Var &qb = dims.query_block, &kb = dims.key_block, &j = dims.key;
    const RVar &lane = f.key_in_block.x, &chunk = f.key_in_block.y, &key_block = f.key_blocks.x;
    const int chunks = f.blocking.chunks(), chunk_keys = f.blocking.key_chunk;
    const int keys_per_lane = std::max(1, chunk_keys / lanes);
    Var eb{"eb"}, ei{"ei"}, et{"feature_lane"}, ev{"feature_vector"}, qt{"query_thread"}, qv{"thread_query"};
    Var kt{"key_lane"}, kv{"key_vector"};
    RVar lane_thread{"lane_thread"}, lane_vector{"lane_vector"};
    // The kernel: block_result, the context by query block (ctx reads it by query, inlined
    // into whatever consumes the context), a thread per features_per_lane features of a query.
    f.block_result.compute_root()
        .split(e, eb, ei, slice_features, kGuard)
        .split(ei, et, ev, features_per_lane)
        .split(qi, qt, qv, tq)
        .reorder(ev, qv, et, qt, eb, qb, h, b)
        .gpu_blocks(qb, h, b)
        .gpu_threads(et, qt)
        .unroll(ev)
        .unroll(qv);
    // The running state, whole tiles of features (the algorithm clamps reads past the head
    // dimension), the key blocks outside the threads, each thread updating its features.
    f.running.compute_at(f.block_result, eb)
        .store_in(MemoryType::GPUShared)
        .bound_extent(e, slice_features)
        .split(e, et, ev, features_per_lane)
        .split(qi, qt, qv, tq)
        .reorder(ev, qv, et, qt)
        .gpu_threads(et, qt)
        .unroll(ev)
        .unroll(qv);
    f.running.update()
        .split(e, et, ev, features_per_lane)
        .split(qi, qt, qv, tq)
        .reorder(ev, qv, et, qt, key_block)
        .gpu_threads(et, qt)
        .unroll(ev)
        .unroll(qv);
    LoopLevel block_step(f.running, key_block), thread_step(f.running, et);
    // 1. Q·Kᵀ of the key block into shared memory, a slice of slice_features features at a
    // time (the slice's partial dot products in registers, `slice_dot`).
    RVar e_outer{"e_outer"}, e_inner{"e_inner"};
    Var slice{"slice"};
    f.dot.compute_at(block_step)
        .store_in(MemoryType::GPUShared)
        .bound_extent(kl, chunk_keys)
        .bound_extent(kc, chunks)
        .bound_extent(kb, 1)
        .split(kl, kt, kv, keys_per_lane)
        .split(qi, qt, qv, tq)
        .reorder(kv, kc, qv, kt, qt)
        .gpu_threads(kt, qt)
        .unroll(kv)
        .unroll(kc)
        .unroll(qv);
    Func slice_dot = f.dot.update().split(f.e.x, e_outer, e_inner, slice_features, kGuard).rfactor(e_outer, slice);
    f.dot.update()
        .split(kl, kt, kv, keys_per_lane)
        .split(qi, qt, qv, tq)
        .reorder(kv, kc, qv, kt, qt, e_outer)
        .gpu_threads(kt, qt)
        .unroll(kv)
        .unroll(kc)
        .unroll(qv);
    LoopLevel slice_step(f.dot, e_outer);
    slice_dot.compute_at(f.dot, kt)
        .store_in(MemoryType::Register)
        .bound_extent(kl, keys_per_lane)
        .bound_extent(kc, chunks)
        .bound_extent(qi, tq)
        .vectorize(kl)
        .unroll(kc)
        .unroll(qi);
    slice_dot.update().reorder(kl, kc, qi, e_inner).vectorize(kl).unroll(kc).unroll(qi);
    // The K slice, staged by the whole block: lanes along the keys, so that the tile keeps
    // keys innermost and a thread's adjacent keys are one shared load (its global reads are
    // then a row per lane, each row's slice read over successive loads through L1); the
    // block's rows of threads take the features.
    Func keys = f.keys.in(slice_dot), values = f.values.in(f.block_context);
    Var jo{"key_outer"}, jt{"key_thread"}, eo{"feature_outer"}, er{"feature_row"};
    keys.compute_at(slice_step)
        .store_in(MemoryType::GPUShared)
        .bound_extent(e, slice_features)
        .split(j, jo, jt, lanes, kGuard)
        .split(e, eo, er, query_threads, kGuard)
        .reorder(jo, eo, jt, er)
        .gpu_threads(jt, er);
    // 2 and 3. The scores, then the exponentials (each thread's query's block max in registers,
    // read from the scores), a thread per keys_per_lane keys of a query; whole tiles (their
    // extents stated: the chunks visited depend on the data).
    for (Func tile : {f.scores, f.block_exp}) {
        tile.compute_at(block_step)
            .store_in(MemoryType::GPUShared)
            .bound_extent(kl, chunk_keys)
            .bound_extent(kc, chunks)
            .bound_extent(kb, 1);
        tile.update()
            .split(lane, lane_thread, lane_vector, keys_per_lane)
            .split(qi, qt, qv, tq)
            .reorder(lane_vector, chunk, qv, lane_thread, qt)
            .gpu_threads(lane_thread, qt)
            .unroll(lane_vector)
            .unroll(chunk)
            .unroll(qv);
    }
    Func exp_max = f.block_max.clone_in(f.block_exp);
    for (auto [row, at] : {std::pair{exp_max, LoopLevel(f.block_exp, lane_thread)}, std::pair{f.block_max, thread_step}}) {
        row.compute_at(at).store_in(MemoryType::Register).bound_extent(kb, 1).bound_extent(qi, tq).unroll(qi);
        row.update().reorder(qi, lane, chunk).unroll(qi).unroll(lane).unroll(chunk);
    }
    // 4. The block's sum and weighted sum of V for the thread's features, in registers (V's
    // tile staged with lanes along the features, where global memory is contiguous: coalesced
    // loads, conflict-free stores and float4 reads).
    f.block_sum.compute_at(thread_step).store_in(MemoryType::Register).bound_extent(kb, 1).bound_extent(qi, tq).unroll(qi);
    f.block_sum.update().reorder(qi, lane, chunk).unroll(qi).unroll(lane).unroll(chunk);
    f.block_context.compute_at(thread_step)
        .store_in(MemoryType::Register)
        .bound_extent(e, features_per_lane)
        .bound_extent(kb, 1)
        .bound_extent(qi, tq)
        .vectorize(e)
        .unroll(qi);
    f.block_context.update().reorder(e, qi, lane, chunk).vectorize(e).unroll(qi).unroll(lane).unroll(chunk);
    values.compute_at(block_step)
        .store_in(MemoryType::GPUShared)
        .split(e, eo, et, lanes, kGuard)
        .split(j, jo, jt, query_threads, kGuard)
        .reorder(eo, jo, et, jt)
        .gpu_threads(et, jt);
}

// Each batch's last real key: a block per batch, one thread scanning its mask.
void schedule_key_end(Func key_end) {
    key_end.compute_root().gpu_blocks(dims.batch);
    key_end.update().gpu_blocks(dims.batch);
}

}  // namespace

void schedule_attention_layer_gpu(attn_gen::AttentionLayer l, bool probs_are_output, const GpuTiling &t) {
    schedule_qkv_projection_gpu(l.q, l.k, l.v, t, true);
    if (probs_are_output) {
        // The probabilities are an S×S output anyway: the stages' kernels, in sequence.
        schedule_attention_scores_gpu(l.scores);
        schedule_masked_softmax_gpu(l.softmax);
        schedule_weighted_sum_gpu(l.context);
    } else {
        if (!l.packed.defined()) schedule_key_end(l.key_end);  // packed: each sequence's length, two loads inlined
        schedule_flash_core(l.flash, t.query_lanes, t.thread_queries);
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

void schedule_attention_core_gpu(attn_gen::FlashAttention flash, Func key_end, Func out, const GpuTiling &t) {
    schedule_key_end(key_end);
    schedule_flash_core(flash, t.query_lanes, t.thread_queries);
    // The output copies the core's context: lanes along the features (head_dim, head).
    const Var &e = dims.head_dim, &h = dims.head, &i = dims.query;
    Var feature{"feature"}, fo{"fo"}, fi{"fi"}, io{"io"}, ii{"ii"};
    out.compute_root().fuse(e, h, feature).gpu_tile(feature, i, fo, io, fi, ii, kLanes, kRowThreads, kGuard);
}

}  // namespace attn_sched
