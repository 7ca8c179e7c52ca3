// The attention core alone, as scaled dot-product attention takes it: Q, K and V in (the
// projections done elsewhere), the context out. Scores, masked softmax and weighted sum
// fused, the fused layer's flash core (attn_gen::FlashAttention): no S_q × S_k buffer,
// memory O(S). manifest.json: attention_core; precision=bf16, the flash core in bf16
// (attention_core_bf16): Q, K, V and the exponentials rounded to bf16, f32 sums.
#include "attention_generator.h"

namespace attn_gen {

using namespace Halide;

class AttentionCore : public AttentionGenerator<AttentionCore> {
public:
    Input<Buffer<float, 3>> q{"q"};                                  // (hidden, seq_q, batch) = [B, S_q, H]
    Input<Buffer<float, 3>> k{"k"}, v{"v"};                          // (hidden, seq_k, batch) = [B, S_k, H]
    Input<Buffer<float, 4>> bias{"bias"};                            // (key, query, head, batch); zeros when absent
    Input<Buffer<uint8_t, 2>> key_padding_mask{"key_padding_mask"};  // (key, batch) = [B, S_k]; 1 = real token
    Input<bool> causal{"causal", false};
    Input<int> heads{"heads", 12, 1, 4096};
    // (head_dim, head, query, batch): the head view of a [B, S_q, H] buffer, which the
    // runtime passes with strides (1, d, H, S_q·H).
    Output<Buffer<float, 4>> ctx{"ctx"};

    void generate() {
        Expr head_dim = q.dim(0).extent() / heads, s_q = q.dim(1).extent(), s_k = k.dim(1).extent();
        key_end_ = last_real_key(key_padding_mask, s_k);
        const Precision precision = checked_precision("attention_core", true, false);
        const Bf16Core core = bf16_core(precision);
        flash_ =
            flash_attention(split_heads("q_heads", q, head_dim), split_heads("k_heads", k, head_dim),
                            split_heads("v_heads", v, head_dim), key_padding_mask, key_end_, bias, bias.dim(0).extent(),
                            causal, head_dim, s_q, s_k, blocking(core.amx_tiles), Func(), precision, core);
        const Dims d;
        out_ = Func{"context"};
        out_(d.head_dim, d.head, d.query, d.batch) = flash_.ctx(d.head_dim, d.head, d.query, d.batch);
        ctx = out_;

        estimate_activation(q);
        estimate_activation(k);
        estimate_activation(v);
        bias.set_estimates(score_estimate());
        key_padding_mask.set_estimates({{0, kEstimateSeq}, {0, estimate_batch()}});
        causal.set_estimate(false);
        heads.set_estimate(kEstimateHeads);
        ctx.set_estimates(
            {{0, kEstimateHidden / kEstimateHeads}, {0, kEstimateHeads}, {0, kEstimateSeq}, {0, estimate_batch()}});
    }

    void schedule_manual_cpu() {
        attn_sched::schedule_attention_core_cpu(flash_, key_end_, out_, this->tiling(), get_target());
    }

    void schedule_manual_gpu() { attn_sched::schedule_attention_core_gpu(flash_, key_end_, out_, this->gpu_tiling()); }

private:
    Func key_end_, out_;
    FlashAttention flash_;
};

}  // namespace attn_gen

HALIDE_REGISTER_GENERATOR(attn_gen::AttentionCore, attention_core)
