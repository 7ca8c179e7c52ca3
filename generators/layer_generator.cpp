// The fused layer: QKV projection, scores, masked softmax, weighted sum, output
// projection, residual and LayerNorm in one pipeline. Keys and values come from kv:
// self-attention passes x as kv too. output_probs=true adds the output probs, the
// attention probabilities; packed=true takes packed variable-length sequences instead
// of a padded batch (manifest.json: attention_layer, attention_layer_probs,
// attention_layer_packed, attention_layer_packed_probs); precision=bf16 takes bf16 weights
// and computes the projections and the core's products in bf16 (attention_layer_bf16);
// precision=int8 takes int8 weights with their scales and computes the projections in int8,
// the core's products in bf16 (attention_layer_int8).
#include "attention_generator.h"

namespace attn_gen {

using namespace Halide;

class AttentionLayerGenerator : public AttentionGenerator<AttentionLayerGenerator> {
public:
    GeneratorParam<bool> output_probs{"output_probs", false};
    // Packed variable-length sequences (DESIGN.md) instead of a padded batch.
    GeneratorParam<bool> packed{"packed", false};
    // The flash core's products (QKᵀ, P·V): fp32 or bf16 (manifest.json: the bf16 and int8 layers').
    GeneratorParam<Precision> core_precision{"core_precision", Precision::fp32, {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}}};

    // Dense: (hidden, seq_q, batch) = [B, S_q, H]. Packed: the token rows as a batch of one,
    // (hidden, token, 1) = [1, T, H].
    Input<Buffer<float, 3>> x{"x"};
    // Prepared once by the runtime (layer_weights below): in fp32 on a CPU in panels of a
    // vector of outputs, (out % panel + panel·in, out / panel), on a GPU nn.Linear's
    // transposed, (out, in) = [H_in, H_out]; in bf16 and int8 in pairs or quads of input
    // features, in the same panels, as rows of a panel's groups (attn_gen::WeightLayout::grouped,
    // grouped_rows rows a panel). float, bfloat16 in
    // bf16, int8 in int8, in [-63, 63]
    // (attn::kInt8WeightLimit: without VNNI the pairs' i16 sums would saturate beyond it)
    // (configure).
    Input<Buffer<void, 2>> w_q{"w_q"}, w_k{"w_k"}, w_v{"w_v"}, w_o{"w_o"};
    Input<Buffer<float, 1>> b_q{"b_q"}, b_k{"b_k"}, b_v{"b_v"}, b_o{"b_o"};  // [H]
    Input<Buffer<float, 1>> gamma{"gamma"}, beta{"beta"};                    // [H]
    // (key, query, head, batch) = [B, heads, S_q, S_k], zeros when absent; packed: one
    // [heads, S_max, S_max] bias for every sequence (batch stride 0), S_max = max_length.
    Input<Buffer<float, 4>> bias{"bias"};
    Input<bool> causal{"causal", false};
    Input<int> heads{"heads", 12, 1, 4096};
    Input<float> eps{"eps", 1e-12f};
    // Dense only:
    GeneratorInput<Buffer<float, 3>> *kv = nullptr;                  // (hidden, seq_k, batch); x for self-attention
    GeneratorInput<Buffer<uint8_t, 2>> *key_padding_mask = nullptr;  // (key, batch) = [B, S_k]; 1 = real token
    // Dense bf16 and int8 only: kv is x (self-attention), so that K and V read x's rounding or
    // quantization and kv's is skipped (attn_gen::LayerInputs::kv_is_x).
    GeneratorInput<bool> *kv_is_x = nullptr;
    // Packed only:
    GeneratorInput<Buffer<int32_t, 1>> *sequence_offsets = nullptr;  // [B + 1], as FlashAttention's cu_seqlens
    GeneratorInput<int> *max_length = nullptr;                       // the longest sequence, S_max
    Output<Buffer<float, 3>> y{"y"};                                 // as x
    // (key, query, head, batch); packed: [B, heads, S_max, S_max], each sequence's [L, L] at its top left.
    GeneratorOutput<Buffer<float, 4>> *probs = nullptr;
    // int8 only: (out, quantity, projection) = [4, 2, H], attn_gen::LayerInputs::weight_scales.
    GeneratorInput<Buffer<float, 3>> *weight_scales = nullptr;

    void configure() {
        const Type weight_type = precision == Precision::bf16   ? BFloat(16)
                                 : precision == Precision::int8 ? Int(8)
                                                                : Float(32);
        for (auto *w : {&w_q, &w_k, &w_v, &w_o}) w->set_type(weight_type);
        if (precision == Precision::int8) weight_scales = add_input<Buffer<float, 3>>("weight_scales");
        if (packed) {
            sequence_offsets = add_input<Buffer<int32_t, 1>>("sequence_offsets");
            max_length = add_input<int>("max_length");
        } else {
            kv = add_input<Buffer<float, 3>>("kv");
            key_padding_mask = add_input<Buffer<uint8_t, 2>>("key_padding_mask");
            if (precision != Precision::fp32) kv_is_x = add_input<bool>("kv_is_x");
        }
        if (output_probs) probs = add_output<Buffer<float, 4>>("probs");
    }

    void generate() {
        checked_precision("attention_layer", true, true);
        LayerInputs in;
        in.x = x;
        in.w_q = w_q, in.w_k = w_k, in.w_v = w_v, in.w_o = w_o;
        in.b_q = b_q, in.b_k = b_k, in.b_v = b_v, in.b_o = b_o;
        in.gamma = gamma, in.beta = beta;
        in.precision = precision;
        in.core_precision = core_precision;
        in.bf16_core = bf16_core(core_precision);
        if (core_precision != Precision::fp32 && (output_probs || get_target().has_gpu_feature()))
            _halide_user_error << "attention_layer: core_precision=bf16 is the flash core's on a CPU, not "
                               << (output_probs ? "with output_probs" : "for a GPU") << "\n";
        in.weight_layout = layer_weights(get_target(), precision);
        in.weight_panel = weight_panel();
        if (weight_scales) in.weight_scales = *weight_scales;
        if (precision == Precision::int8) in.int8_sum = int8_sum();
        in.amx_tiles = amx_projections(precision);
        in.bias = bias;
        in.bias_keys = bias.dim(0).extent();
        in.causal = causal, in.heads = heads, in.eps = eps;
        in.output_probs = output_probs;
        in.blocking = this->blocking(in.bf16_core.amx_tiles);
        in.hidden = x.dim(0).extent();
        if (packed) {
            in.kv = x;
            in.sequence_offsets = *sequence_offsets;
            in.sequences = sequence_offsets->dim(0).extent() - 1;
            in.tokens = x.dim(1).extent();
            in.s_q = in.s_k = *max_length;
        } else {
            in.kv = *kv;
            if (kv_is_x) in.kv_is_x = *kv_is_x;
            in.key_padding_mask = *key_padding_mask;
            in.s_q = x.dim(1).extent();
            in.s_k = kv->dim(1).extent();
        }
        layer_ = attention_layer(in);
        y = layer_.output.y;
        if (probs) *probs = layer_.softmax.probs;

        // Packed: a batch of 8 sequences of 128 tokens, on every device (packing is for batches).
        const int batch = packed ? kEstimateBatchGpu : estimate_batch();
        const Region activation{
            {0, kEstimateHidden}, {0, kEstimateSeq * (packed ? batch : 1)}, {0, packed ? 1 : batch}};
        const Region score{{0, kEstimateSeq}, {0, kEstimateSeq}, {0, kEstimateHeads}, {0, batch}};
        x.set_estimates(activation);
        // (fp32: (panel·H, H/panel); grouped: rows of group·panel elements, about H/group a panel)
        const int panel = std::max(1, weight_panel());
        const int group = features_a_group(precision);
        for (auto *w : {&w_q, &w_k, &w_v, &w_o})
            w->set_estimates(
                group == 1 ? Region{{0, kEstimateHidden * panel}, {0, kEstimateHidden / panel}}
                           : Region{{0, group * panel}, {0, kEstimateHidden / group * (kEstimateHidden / panel)}});
        if (weight_scales) weight_scales->set_estimates({{0, kEstimateHidden}, {0, 2}, {0, 4}});
        for (auto *p : {&b_q, &b_k, &b_v, &b_o, &gamma, &beta}) p->set_estimates({{0, kEstimateHidden}});
        bias.set_estimates(score);
        causal.set_estimate(false);
        heads.set_estimate(kEstimateHeads);
        eps.set_estimate(1e-12f);
        if (packed) {
            sequence_offsets->set_estimates({{0, batch + 1}});
            max_length->set_estimate(kEstimateSeq);
        } else {
            kv->set_estimates(activation);
            key_padding_mask->set_estimates({{0, kEstimateSeq}, {0, batch}});
            if (kv_is_x) kv_is_x->set_estimate(true);
        }
        y.set_estimates(activation);
        if (probs) probs->set_estimates(score);
    }

    // The fused layer's weights are prepared once by the runtime's Attention, so no call
    // rearranges them (PreparedWeights, runtime/src/pipeline_call.cpp): in fp32 for a GPU
    // transposed, [H_in, H_out], a vector of outputs per input feature, which its kernels read
    // in place; for a CPU in panels of a vector of outputs (WeightLayout::panels), which its
    // register tiles read in place, a sequential stream per vector (on the CPU that saves the
    // panels' packing, 14% of the call at B=1 S=128: tools/halide_profile.py); bf16 and int8,
    // which the Attention rounds or quantizes once anyway (ReducedWeights), in the groups
    // their products read, in the same panels. The stages, called with their weights each time, take nn.Linear's.
    static WeightLayout layer_weights(const Target &target, Precision precision) {
        if (precision != Precision::fp32) return WeightLayout::grouped;
        return target.has_gpu_feature() ? WeightLayout::transposed : WeightLayout::panels;
    }
    // The panels' width on a CPU (fp32's panels, bf16's and int8's groups): a vector of
    // floats, which the runtime reads from manifest.json's ISA (attn::manifest::Isa::f32_lanes;
    // the test Manifest.F32LanesAreHalides ties the two).
    int weight_panel() const {
        return get_target().has_gpu_feature() ? 0 : get_target().natural_vector_size<float>();
    }

    void schedule_manual_cpu() {
        attn_sched::schedule_attention_layer_cpu(layer_, output_probs, this->tiling(), get_target());
    }

    void schedule_manual_gpu() { attn_sched::schedule_attention_layer_gpu(layer_, output_probs, this->gpu_tiling()); }

private:
    AttentionLayer layer_;
};

}  // namespace attn_gen

HALIDE_REGISTER_GENERATOR(attn_gen::AttentionLayerGenerator, attention_layer)
