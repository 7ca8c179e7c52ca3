#include "cpu_manual.h"

namespace attn_sched {

using namespace Halide;
using attn_gen::Dims;

namespace {

const Dims dims;
constexpr TailStrategy kGuard = TailStrategy::GuardWithIf;

// Rows of a register tile: each row holds `vectors` accumulators, and
// rows × vectors stays within the 16 vector registers of AVX2 (AVX-512 has 32).
constexpr int kTileRows = 4;
constexpr int kTileVectors = 2;

int vector_width(const Target &target) { return target.natural_vector_size<float>(); }

// out(o, s, b) += in(k, s, b) · W_t(o, k): a tile of kTileVectors vectors of outputs by
// kTileRows rows stays in registers while k runs; row blocks run in parallel.
void schedule_projection(Func out, Func weight_transposed, const std::vector<RVar> &reduction,
                         const Target &target) {
    const int vw = vector_width(target);
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    Var in_feature{"in_feature"}, oo{"oo"}, oi{"oi"}, so{"so"}, si{"si"};
    weight_transposed.compute_root()
        .split(in_feature, oo, oi, 16, kGuard)
        .parallel(oo)
        .vectorize(o, vw, kGuard);
    out.compute_root().vectorize(o, vw, kGuard).parallel(s);
    std::vector<VarOrRVar> order{oi, si};
    order.insert(order.end(), reduction.begin(), reduction.end());
    order.insert(order.end(), {oo, so, b});
    out.update()
        .split(o, oo, oi, vw * kTileVectors, kGuard)
        .split(s, so, si, kTileRows, kGuard)
        .reorder(order)
        .vectorize(oi)
        .unroll(si)
        .parallel(so)
        .parallel(b);
}

// Q·Kᵀ for a block of queries: keys are vectorized (K transposed
// per head so they are contiguous), query rows unrolled, the head dimension reduced.
void schedule_dot(attn_gen::Scores sc, const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key, &i = dims.query;
    Var jo{"jo"}, ji{"ji"};
    sc.dot.vectorize(j, vw, kGuard);
    sc.dot.update()
        .split(j, jo, ji, vw * kTileVectors, kGuard)
        .reorder(ji, i, sc.e, jo)
        .vectorize(ji)
        .unroll(i);
}

// Row max, exponentials and row sum for the rows computed at `at`.
void schedule_softmax_rows(attn_gen::MaskedSoftmax m, LoopLevel at, const Target &target) {
    const int vw = vector_width(target);
    m.row_max.compute_at(at);
    m.exp_scores.compute_at(at).vectorize(dims.key, vw, kGuard);
    m.row_sum.compute_at(at);
}

// ctx(e, h, i, b) += p(j, i, h, b) · V(e, h, j, b): one vector of the head dimension by
// kTileRows query rows in registers while keys are reduced. Leaves the loops
// (ei, ii, j, eo, io, h, b) for the caller to parallelize.
void schedule_context_update(Func ctx, const RDom &j, const Target &target) {
    const int vw = vector_width(target);
    const Var &e = dims.head_dim, &i = dims.query, &h = dims.head, &b = dims.batch;
    Var eo{"eo"}, ei{"ei"}, io{"io"}, ii{"ii"};
    ctx.compute_root().vectorize(e, vw, kGuard).parallel(i);
    ctx.update()
        .split(i, io, ii, kTileRows, kGuard)
        .split(e, eo, ei, vw, kGuard)
        .reorder(ei, ii, j, eo, io, h, b)
        .vectorize(ei)
        .unroll(ii);
}

// Dense projection, residual and LayerNorm for a block of rows at a time: the
// statistics need whole rows, so dense is computed per row block inside y.
void schedule_output(attn_gen::OutputLayerNorm n, const Target &target) {
    const int vw = vector_width(target);
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    Var so{"so"}, si{"si"}, oo{"oo"}, oi{"oi"}, in_feature{"in_feature"};
    n.y.compute_root().split(s, so, si, kTileRows, kGuard).reorder(o, si, so, b)
        .vectorize(o, vw, kGuard).parallel(so).parallel(b);
    n.weight_transposed.compute_root()
        .split(in_feature, oo, oi, 16, kGuard)
        .parallel(oo)
        .vectorize(o, vw, kGuard);
    n.dense.compute_at(n.y, so).vectorize(o, vw, kGuard);
    n.dense.update()
        .split(o, oo, oi, vw * kTileVectors, kGuard)
        .reorder(oi, s, n.in_feature.x, n.in_feature.y, oo)
        .vectorize(oi)
        .unroll(s);
    n.sum.compute_at(n.y, so);
    n.sum_sq_dev.compute_at(n.y, so);
}

}  // namespace

void schedule_qkv_projection_cpu(attn_gen::Linear q, attn_gen::Linear k,
                                 attn_gen::Linear v, const Target &target) {
    for (attn_gen::Linear *l : {&q, &k, &v}) {
        schedule_projection(l->out, l->weight_transposed, {l->k}, target);
    }
}

void schedule_attention_scores_cpu(attn_gen::Scores sc, const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch;
    Var io{"io"}, ii{"ii"};
    sc.scores.compute_root()
        .split(i, io, ii, kTileRows, kGuard)
        .reorder(j, ii, io, h, b)
        .vectorize(j, vw, kGuard)
        .parallel(h)
        .parallel(b);
    sc.key_transposed.compute_at(sc.scores, h).vectorize(j, vw, kGuard);
    sc.dot.compute_at(sc.scores, io);
    schedule_dot(sc, target);
}

void schedule_masked_softmax_cpu(attn_gen::MaskedSoftmax m, const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch;
    m.probs.compute_root().vectorize(j, vw, kGuard).parallel(i).parallel(h).parallel(b);
    schedule_softmax_rows(m, LoopLevel(m.probs, i), target);
}

void schedule_weighted_sum_cpu(attn_gen::WeightedSum w, const Target &target) {
    schedule_context_update(w.ctx, w.j, target);
    w.ctx.update().parallel(Var{"io"}).parallel(dims.head).parallel(dims.batch);
}

void schedule_output_layernorm_cpu(attn_gen::OutputLayerNorm n, const Target &target) {
    schedule_output(n, target);
}

void schedule_attention_layer_cpu(attn_gen::AttentionLayer l, bool probs_are_output,
                                  const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch;
    schedule_qkv_projection_cpu(l.q, l.k, l.v, target);

    // Attention core, flash-style on CPU: per (batch, head), a block of query rows at a
    // time computes its scores, softmax and weighted sum, so memory stays O(S).
    Func ctx = l.context.ctx;
    Var io{"io"}, head_batch{"head_batch"};
    schedule_context_update(ctx, l.context.j, target);
    ctx.update().fuse(h, b, head_batch).parallel(head_batch);

    if (probs_are_output) {
        // The caller asked for the probabilities: they are an S×S output anyway.
        l.softmax.probs.compute_root().vectorize(j, vw, kGuard).parallel(i).parallel(h).parallel(b);
        LoopLevel rows(l.softmax.probs, i);
        l.scores.key_transposed.compute_root().vectorize(j, vw, kGuard).parallel(h).parallel(b);
        l.scores.dot.compute_at(rows);
        schedule_softmax_rows(l.softmax, rows, target);
    } else {
        LoopLevel block(ctx, io);
        l.scores.key_transposed.compute_at(ctx, head_batch).vectorize(j, vw, kGuard);
        l.scores.dot.compute_at(block);
        schedule_softmax_rows(l.softmax, block, target);
    }
    schedule_dot(l.scores, target);
    schedule_output(l.output, target);
}

}  // namespace attn_sched
