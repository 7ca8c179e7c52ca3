// One generator per stage of the layer, each the algorithm of algorithm/attention_algorithm.h
// applied to buffers. Comments give each buffer's Halide dimension order (innermost
// first) and the PyTorch shape it is a view of.
#include "attention_generator.h"

namespace attn_gen {

using namespace Halide;

namespace {
// A weight (in, out) as nn.Linear's, read rounded to bf16: the bf16 stages take their f32
// weights with each call and round them as their panels read them.
Func rounded_weight(const std::string &name, Func weight) {
    Var in{"in"}, out{"out"};
    Func rounded{name};
    rounded(in, out) = rounded_as(BFloat(16), weight(in, out));
    return rounded;
}
}  // namespace

// Q = x_q·W_qᵀ + b_q, K = x_kv·W_kᵀ + b_k, V = x_kv·W_vᵀ + b_v. Self-attention passes
// the same buffer as x_q and x_kv. precision=bf16: the activations and weights rounded to bf16,
// the products summed in f32 (qkv_projection_bf16).
class QkvProjection : public AttentionGenerator<QkvProjection> {
public:
    Input<Buffer<float, 3>> x_q{"x_q"};                          // (hidden, seq_q, batch) = [B, S_q, H]
    Input<Buffer<float, 3>> x_kv{"x_kv"};                        // (hidden, seq_k, batch) = [B, S_k, H]
    Input<Buffer<float, 2>> w_q{"w_q"}, w_k{"w_k"}, w_v{"w_v"};  // (in, out) = [H_out, H_in]
    Input<Buffer<float, 1>> b_q{"b_q"}, b_k{"b_k"}, b_v{"b_v"};  // [H]
    Output<Buffer<float, 3>> q{"q"};                             // (hidden, seq_q, batch)
    Output<Buffer<float, 3>> k{"k"}, v{"v"};                     // (hidden, seq_k, batch)

    void generate() {
        const Precision p = checked_precision("qkv_projection", true, false);
        Expr hidden = x_q.dim(0).extent(), s_q = x_q.dim(1).extent(), s_k = x_kv.dim(1).extent();
        Func in_q = x_q, in_kv = x_kv, wq = w_q, wk = w_k, wv = w_v;
        if (p == Precision::bf16) {
            in_q = rounded_to_bf16("x_q_rounded", x_q, hidden);
            in_kv = rounded_to_bf16("x_kv_rounded", x_kv, hidden);
            wq = rounded_weight("w_q_rounded", w_q), wk = rounded_weight("w_k_rounded", w_k);
            wv = rounded_weight("w_v_rounded", w_v);
        }
        q_ = linear("q", in_q, wq, b_q, hidden, s_q, Func(), WeightLayout::linear, p);
        k_ = linear("k", in_kv, wk, b_k, hidden, s_k, Func(), WeightLayout::linear, p);
        v_ = linear("v", in_kv, wv, b_v, hidden, s_k, Func(), WeightLayout::linear, p);
        q = q_.out;
        k = k_.out;
        v = v_.out;

        estimate_activation(x_q);
        estimate_activation(x_kv);
        for (auto *w : {&w_q, &w_k, &w_v}) w->set_estimates({{0, kEstimateHidden}, {0, kEstimateHidden}});
        for (auto *b : {&b_q, &b_k, &b_v}) b->set_estimates({{0, kEstimateHidden}});
        estimate_activation(q);
        estimate_activation(k);
        estimate_activation(v);
    }

    void schedule_manual_cpu() { attn_sched::schedule_qkv_projection_cpu(q_, k_, v_, this->tiling(), get_target()); }

    void schedule_manual_gpu() { attn_sched::schedule_qkv_projection_gpu(q_, k_, v_, this->gpu_tiling()); }

private:
    Linear q_, k_, v_;
};

// scores = Q·Kᵀ / √d + bias, per head. precision=bf16: Q and K rounded to bf16
// (attention_scores_bf16).
class AttentionScores : public AttentionGenerator<AttentionScores> {
public:
    Input<Buffer<float, 3>> q{"q"};        // (hidden, seq_q, batch) = [B, S_q, H]
    Input<Buffer<float, 3>> k{"k"};        // (hidden, seq_k, batch) = [B, S_k, H]
    Input<Buffer<float, 4>> bias{"bias"};  // (key, query, head, batch) = [B, heads, S_q, S_k]; zeros when absent
    Input<int> heads{"heads", 12, 1, 4096};
    Output<Buffer<float, 4>> scores{"scores"};  // (key, query, head, batch)

    void generate() {
        Expr head_dim = q.dim(0).extent() / heads;
        scores_ = scaled_scores(split_heads("q_heads", q, head_dim), split_heads("k_heads", k, head_dim), bias,
                                head_dim, q.dim(1).extent(), k.dim(1).extent(),
                                checked_precision("attention_scores", true, false));
        scores = scores_.scores;

        estimate_activation(q);
        estimate_activation(k);
        bias.set_estimates(score_estimate());
        heads.set_estimate(kEstimateHeads);
        scores.set_estimates(score_estimate());
    }

    void schedule_manual_cpu() { attn_sched::schedule_attention_scores_cpu(scores_, this->tiling(), get_target()); }

    void schedule_manual_gpu() { attn_sched::schedule_attention_scores_gpu(scores_); }

private:
    Scores scores_;
};

// probs = softmax over keys of the scores, with the key padding mask and causal mask. f32 in
// every precision (DESIGN.md): a bf16 caller runs this one.
class MaskedSoftmaxStage : public AttentionGenerator<MaskedSoftmaxStage> {
public:
    Input<Buffer<float, 4>> scores{"scores"};                        // (key, query, head, batch)
    Input<Buffer<uint8_t, 2>> key_padding_mask{"key_padding_mask"};  // (key, batch) = [B, S_k]; 1 = real token
    Input<bool> causal{"causal", false};
    Output<Buffer<float, 4>> probs{"probs"};  // (key, query, head, batch)

    void generate() {
        checked_precision("masked_softmax", false, false);
        softmax_ = masked_softmax(scores, key_padding_mask, causal, scores.dim(1).extent(), scores.dim(0).extent());
        probs = softmax_.probs;

        scores.set_estimates(score_estimate());
        key_padding_mask.set_estimates({{0, kEstimateSeq}, {0, estimate_batch()}});
        causal.set_estimate(false);
        probs.set_estimates(score_estimate());
    }

    void schedule_manual_cpu() { attn_sched::schedule_masked_softmax_cpu(softmax_, this->tiling(), get_target()); }

    void schedule_manual_gpu() { attn_sched::schedule_masked_softmax_gpu(softmax_); }

private:
    MaskedSoftmax softmax_;
};

// ctx = probs · V per head, heads concatenated. precision=bf16: the probabilities and V rounded
// to bf16 (weighted_sum_bf16).
class WeightedSumStage : public AttentionGenerator<WeightedSumStage> {
public:
    Input<Buffer<float, 4>> probs{"probs"};  // (key, query, head, batch) = [B, heads, S_q, S_k]
    Input<Buffer<float, 3>> v{"v"};          // (hidden, seq_k, batch) = [B, S_k, H]
    // (head_dim, head, query, batch): the head view of a [B, S_q, H] buffer, which the
    // runtime passes with strides (1, d, H, S_q·H).
    Output<Buffer<float, 4>> ctx{"ctx"};

    void generate() {
        Expr head_dim = v.dim(0).extent() / probs.dim(2).extent();
        context_ = weighted_sum(probs, split_heads("v_heads", v, head_dim), head_dim, probs.dim(1).extent(),
                                probs.dim(0).extent(), checked_precision("weighted_sum", true, false));
        ctx = context_.ctx;

        probs.set_estimates(score_estimate());
        estimate_activation(v);
        ctx.set_estimates(
            {{0, kEstimateHidden / kEstimateHeads}, {0, kEstimateHeads}, {0, kEstimateSeq}, {0, estimate_batch()}});
    }

    void schedule_manual_cpu() { attn_sched::schedule_weighted_sum_cpu(context_, this->tiling(), get_target()); }

    void schedule_manual_gpu() { attn_sched::schedule_weighted_sum_gpu(context_); }

private:
    WeightedSum context_;
};

// y = LayerNorm(x + ctx·W_oᵀ + b_o). precision=bf16: the context and W_o rounded to bf16
// (output_layernorm_bf16); residual and LayerNorm in f32.
class OutputLayerNormStage : public AttentionGenerator<OutputLayerNormStage> {
public:
    Input<Buffer<float, 3>> ctx{"ctx"};                                // (hidden, seq, batch) = [B, S, H]
    Input<Buffer<float, 3>> x{"x"};                                    // (hidden, seq, batch): the residual
    Input<Buffer<float, 2>> w_o{"w_o"};                                // (in, out) = [H_out, H_in]
    Input<Buffer<float, 1>> b_o{"b_o"}, gamma{"gamma"}, beta{"beta"};  // [H]
    Input<float> eps{"eps", 1e-12f};
    Output<Buffer<float, 3>> y{"y"};  // (hidden, seq, batch)

    void generate() {
        Expr hidden = x.dim(0).extent();
        // One "head" spanning all of H: the same algorithm the fused layer uses on its head view.
        const Precision p = checked_precision("output_layernorm", true, false);
        output_ = output_layernorm(split_heads("ctx_heads", ctx, hidden), x,
                                   p == Precision::bf16 ? rounded_weight("w_o_rounded", w_o) : Func(w_o), b_o, gamma,
                                   beta, eps, hidden, 1, hidden, x.dim(1).extent(), WeightLayout::linear, p);
        y = output_.y;

        estimate_activation(ctx);
        estimate_activation(x);
        w_o.set_estimates({{0, kEstimateHidden}, {0, kEstimateHidden}});
        for (auto *p : {&b_o, &gamma, &beta}) p->set_estimates({{0, kEstimateHidden}});
        eps.set_estimate(1e-12f);
        estimate_activation(y);
    }

    void schedule_manual_cpu() { attn_sched::schedule_output_layernorm_cpu(output_, this->tiling(), get_target()); }

    void schedule_manual_gpu() { attn_sched::schedule_output_layernorm_gpu(output_, this->gpu_tiling()); }

private:
    OutputLayerNorm output_;
};

}  // namespace attn_gen

HALIDE_REGISTER_GENERATOR(attn_gen::QkvProjection, qkv_projection)
HALIDE_REGISTER_GENERATOR(attn_gen::AttentionScores, attention_scores)
HALIDE_REGISTER_GENERATOR(attn_gen::MaskedSoftmaxStage, masked_softmax)
HALIDE_REGISTER_GENERATOR(attn_gen::WeightedSumStage, weighted_sum)
HALIDE_REGISTER_GENERATOR(attn_gen::OutputLayerNormStage, output_layernorm)
