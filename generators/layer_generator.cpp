// The fused layer: QKV projection, scores, masked softmax, weighted sum, output
// projection, residual and LayerNorm in one pipeline. Keys and values come from kv:
// self-attention passes x as kv too. output_probs=true adds the output probs, the
// attention probabilities (manifest.json: attention_layer and attention_layer_probs).
#include "attention_generator.h"

namespace attn_gen {

using namespace Halide;

class AttentionLayerGenerator : public AttentionGenerator<AttentionLayerGenerator> {
public:
    GeneratorParam<bool> output_probs{"output_probs", false};

    Input<Buffer<float, 3>> x{"x"};    // (hidden, seq_q, batch) = [B, S_q, H]
    Input<Buffer<float, 3>> kv{"kv"};  // (hidden, seq_k, batch) = [B, S_k, H]; x for self-attention
    Input<Buffer<float, 2>> w_q{"w_q"}, w_k{"w_k"}, w_v{"w_v"}, w_o{"w_o"};  // (in, out) = [H_out, H_in]
    Input<Buffer<float, 1>> b_q{"b_q"}, b_k{"b_k"}, b_v{"b_v"}, b_o{"b_o"};  // [H]
    Input<Buffer<float, 1>> gamma{"gamma"}, beta{"beta"};                    // [H]
    Input<Buffer<uint8_t, 2>> key_padding_mask{"key_padding_mask"};          // (key, batch) = [B, S_k]; 1 = real token
    Input<Buffer<float, 4>> bias{"bias"};  // (key, query, head, batch) = [B, heads, S_q, S_k]; zeros when absent
    Input<bool> causal{"causal", false};
    Input<int> heads{"heads", 12, 1, 4096};
    Input<float> eps{"eps", 1e-12f};
    Output<Buffer<float, 3>> y{"y"};  // (hidden, seq_q, batch)

    GeneratorOutput<Buffer<float, 4>> *probs = nullptr;  // (key, query, head, batch)

    void configure() {
        if (output_probs) probs = add_output<Buffer<float, 4>>("probs");
    }

    void generate() {
        LayerInputs in;
        in.x = x;
        in.kv = kv;
        in.w_q = w_q, in.w_k = w_k, in.w_v = w_v, in.w_o = w_o;
        in.b_q = b_q, in.b_k = b_k, in.b_v = b_v, in.b_o = b_o;
        in.gamma = gamma, in.beta = beta;
        in.key_padding_mask = key_padding_mask;
        in.bias = bias;
        in.causal = causal, in.heads = heads, in.eps = eps;
        in.output_probs = output_probs;
        in.blocking = this->blocking();
        in.hidden = x.dim(0).extent();
        in.s_q = x.dim(1).extent();
        in.s_k = kv.dim(1).extent();
        layer_ = attention_layer(in);
        y = layer_.output.y;
        if (probs) *probs = layer_.softmax.probs;

        const int batch = estimate_batch();
        const Region activation{{0, kEstimateHidden}, {0, kEstimateSeq}, {0, batch}};
        const Region score{{0, kEstimateSeq}, {0, kEstimateSeq}, {0, kEstimateHeads}, {0, batch}};
        x.set_estimates(activation);
        kv.set_estimates(activation);
        for (auto *w : {&w_q, &w_k, &w_v, &w_o}) w->set_estimates({{0, kEstimateHidden}, {0, kEstimateHidden}});
        for (auto *p : {&b_q, &b_k, &b_v, &b_o, &gamma, &beta}) p->set_estimates({{0, kEstimateHidden}});
        key_padding_mask.set_estimates({{0, kEstimateSeq}, {0, batch}});
        bias.set_estimates(score);
        causal.set_estimate(false);
        heads.set_estimate(kEstimateHeads);
        eps.set_estimate(1e-12f);
        y.set_estimates(activation);
        if (probs) probs->set_estimates(score);
    }

    void schedule_manual_cpu() {
        attn_sched::schedule_attention_layer_cpu(layer_, output_probs, this->tiling(), get_target());
    }

    void schedule_manual_gpu() { attn_sched::schedule_attention_layer_gpu(layer_, output_probs); }

private:
    AttentionLayer layer_;
};

}  // namespace attn_gen

HALIDE_REGISTER_GENERATOR(attn_gen::AttentionLayerGenerator, attention_layer)
