#include "cpu_manual.h"

namespace attn_sched {

using namespace Halide;
using attn_gen::Dims;

namespace {

const Dims dims;
constexpr TailStrategy kGuard = TailStrategy::GuardWithIf;

int vector_width(const Target &target) { return target.natural_vector_size<float>(); }

// Computes the reduction `tile` (a pure init and one update over `reduction`) as a
// register tile of `columns` × t.tile_rows at `at`: `column` vectorized and unrolled,
// `row` unrolled, the reduction outside both.
void register_tile(Func tile, const Var &column, const Var &row, const std::vector<RVar> &reduction,
                   int columns, LoopLevel at, const CpuTiling &t, const Target &target) {
    const int vw = vector_width(target);
    Var vec{"vec"}, lane{"lane"};
    tile.compute_at(at)
        .bound_extent(column, columns)
        .bound_extent(row, t.tile_rows)
        .vectorize(column, vw)
        .unroll(column)
        .unroll(row);
    std::vector<VarOrRVar> order{lane, vec, row};
    order.insert(order.end(), reduction.begin(), reduction.end());
    tile.update().split(column, vec, lane, vw).reorder(order).vectorize(lane).unroll(vec).unroll(row);
}

// A reduction over one row (max, sum) computed at `at`, vectorized across the row:
// vectors of partial results, combined at the end (atomic() lets Halide reassociate).
void vectorized_row_reduction(Func reduction, RVar along, LoopLevel at, const Target &target) {
    RVar outer{"outer"}, lane{"lane"};
    reduction.compute_at(at);
    reduction.update().split(along, outer, lane, vector_width(target), kGuard).atomic().vectorize(lane);
}

// A projection's output (o, s, b), e.g. product + bias, computed with the GEMM
// `product` as a register tile per (panel of output features, block of rows). Panels
// run in parallel; each transposes its slice of the weight once (a packed panel: the
// tile's loads are contiguous) and reuses it for every row block of every batch.
void schedule_panel_gemm(Func out, Func weight_transposed, Func product, const std::vector<RVar> &reduction,
                         const CpuTiling &t, const Target &target) {
    const int vw = vector_width(target), panel = vw * t.tile_vectors;
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    Var oo{"oo"}, oi{"oi"}, so{"so"}, si{"si"}, in_feature{"in_feature"}, ko{"ko"}, ki{"ki"};
    out.compute_root()
        .split(o, oo, oi, panel, kGuard)
        .split(s, so, si, t.tile_rows, kGuard)
        .reorder(oi, si, so, b, oo)
        .vectorize(oi, vw, kGuard)
        .parallel(oo);
    weight_transposed.compute_at(out, oo)
        .bound_extent(o, panel)
        .split(in_feature, ko, ki, vw, kGuard)
        .reorder(o, ki, ko)
        .vectorize(o, vw)
        .unroll(ki);
    register_tile(product, o, s, reduction, panel, LoopLevel(out, so), t, target);
}

void schedule_projection(attn_gen::Linear l, const CpuTiling &t, const Target &target) {
    schedule_panel_gemm(l.out, l.weight_transposed, l.product, {l.k}, t, target);
}

// Q·Kᵀ for the rows of `block` (a block of queries, all keys): register tiles of
// t.tile_vectors vectors of keys (K is transposed per head so keys are contiguous) by
// t.tile_rows queries, the head dimension reduced; each tile of K is reused by every
// row tile of the block while it is in L1.
void schedule_dot_rows(attn_gen::Scores sc, LoopLevel block, const CpuTiling &t, const Target &target) {
    const int vw = vector_width(target), columns = vw * t.tile_vectors;
    const Var &j = dims.key, &i = dims.query;
    Var jo{"jo"}, ji{"ji"}, ir{"ir"}, ii{"ii"};
    Func dot_rows = sc.dot.in();
    dot_rows.compute_at(block)
        .split(j, jo, ji, columns, kGuard)
        .split(i, ir, ii, t.tile_rows, kGuard)
        .reorder(ji, ii, ir, jo)
        .vectorize(ji, vw, kGuard);
    register_tile(sc.dot, j, i, {sc.e}, columns, LoopLevel(dot_rows, ir), t, target);
}

// Row max, exponentials, row sum and probabilities for the rows computed at `at`;
// the two row reductions are vectorized across keys.
void schedule_softmax_rows(attn_gen::MaskedSoftmax m, LoopLevel at, bool probs_too, const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key;
    for (Func row : {m.row_max, m.row_sum}) vectorized_row_reduction(row, m.j.x, at, target);
    m.exp_scores.compute_at(at).vectorize(j, vw, kGuard);
    if (probs_too) m.probs.compute_at(at).vectorize(j, vw, kGuard);
}

// ctx(e, h, i, b) = Σ_j p · V per block of t.query_block queries: tiles of
// t.context_vectors vectors by t.tile_rows rows, each a register tile reducing over keys;
// a column slice of V is reused by every row tile of the block. Leaves the loops
// (ei, ii, ir, eo, io, h, b) for the caller, io being the block.
void schedule_context(attn_gen::WeightedSum w, const CpuTiling &t, const Target &target) {
    const int vw = vector_width(target), columns = vw * t.context_vectors;
    const Var &e = dims.head_dim, &i = dims.query, &h = dims.head, &b = dims.batch;
    Var eo{"eo"}, ei{"ei"}, io{"io"}, i_block{"i_block"}, ir{"ir"}, ii{"ii"};
    w.ctx.compute_root()
        .split(i, io, i_block, t.query_block, kGuard)
        .split(i_block, ir, ii, t.tile_rows, kGuard)
        .split(e, eo, ei, columns, kGuard)
        .reorder(ei, ii, ir, eo, io, h, b)
        .vectorize(ei, vw, kGuard);
    register_tile(w.ctx_sum, e, i, {w.j}, columns, LoopLevel(w.ctx, ir), t, target);
}

// dense = residual + bias + ctx·W_oᵀ as a projection (packed panels, register tiles),
// then LayerNorm per block of rows, reading dense back from cache: the statistics
// need whole rows, which a panel does not have.
void schedule_output(attn_gen::OutputLayerNorm n, const CpuTiling &t, const Target &target) {
    const int vw = vector_width(target);
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    Var so{"so"}, si{"si"};
    schedule_panel_gemm(n.dense, n.weight_transposed, n.projection, {n.in_feature.x, n.in_feature.y}, t,
                        target);
    n.y.compute_root()
        .split(s, so, si, t.tile_rows, kGuard)
        .reorder(o, si, so, b)
        .vectorize(o, vw, kGuard)
        .parallel(so)
        .parallel(b);
    for (Func stat : {n.sum, n.sum_sq_dev}) vectorized_row_reduction(stat, n.row.x, LoopLevel(n.y, so), target);
}

}  // namespace

void schedule_qkv_projection_cpu(attn_gen::Linear q, attn_gen::Linear k, attn_gen::Linear v,
                                 const CpuTiling &t, const Target &target) {
    for (attn_gen::Linear l : {q, k, v}) schedule_projection(l, t, target);
}

void schedule_attention_scores_cpu(attn_gen::Scores sc, const CpuTiling &t, const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch;
    Var io{"io"}, ii{"ii"};
    sc.scores.compute_root()
        .split(i, io, ii, t.query_block, kGuard)
        .reorder(j, ii, io, h, b)
        .vectorize(j, vw, kGuard)
        .parallel(h)
        .parallel(b);
    sc.key_transposed.compute_at(sc.scores, h).vectorize(j, vw, kGuard);
    schedule_dot_rows(sc, LoopLevel(sc.scores, io), t, target);
}

void schedule_masked_softmax_cpu(attn_gen::MaskedSoftmax m, const CpuTiling &, const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch;
    // Rows are too short to be tasks of their own: parallel over heads and batches.
    m.probs.compute_root().vectorize(j, vw, kGuard).parallel(h).parallel(b);
    schedule_softmax_rows(m, LoopLevel(m.probs, i), false, target);
}

void schedule_weighted_sum_cpu(attn_gen::WeightedSum w, const CpuTiling &t, const Target &target) {
    schedule_context(w, t, target);
    w.ctx.parallel(dims.head).parallel(dims.batch);
}

void schedule_output_layernorm_cpu(attn_gen::OutputLayerNorm n, const CpuTiling &t, const Target &target) {
    schedule_output(n, t, target);
}

void schedule_attention_layer_cpu(attn_gen::AttentionLayer l, bool probs_are_output, const CpuTiling &t,
                                  const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch;
    schedule_qkv_projection_cpu(l.q, l.k, l.v, t, target);

    // Attention core, flash-style on CPU: per (batch, head), a block of t.query_block query
    // rows at a time computes its scores, softmax and weighted sum, so memory stays O(S).
    Var io{"io"}, head_batch{"head_batch"};
    schedule_context(l.context, t, target);
    l.context.ctx.fuse(h, b, head_batch).parallel(head_batch);

    if (probs_are_output) {
        // The caller asked for the probabilities: they are an S×S output anyway.
        Var pio{"pio"}, pii{"pii"};
        l.softmax.probs.compute_root()
            .split(i, pio, pii, t.query_block, kGuard)
            .reorder(j, pii, pio, h, b)
            .vectorize(j, vw, kGuard)
            .parallel(h)
            .parallel(b);
        LoopLevel rows(l.softmax.probs, pio);
        l.scores.key_transposed.compute_at(l.softmax.probs, h).vectorize(j, vw, kGuard);
        schedule_dot_rows(l.scores, rows, t, target);
        schedule_softmax_rows(l.softmax, rows, false, target);
    } else {
        LoopLevel block(l.context.ctx, io);
        // The scaled, biased scores once per block: both softmax passes read them.
        l.scores.scores.compute_at(block).vectorize(j, vw, kGuard);
        l.scores.key_transposed.compute_at(l.context.ctx, head_batch).vectorize(j, vw, kGuard);
        schedule_dot_rows(l.scores, block, t, target);
        schedule_softmax_rows(l.softmax, block, true, target);
    }
    schedule_output(l.output, t, target);
}

}  // namespace attn_sched
