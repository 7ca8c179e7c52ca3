// The naive reference: plain loops that follow DESIGN.md step by step, no Halide.
// Instantiated for double (the reference every variant is checked against) and for
// float (the plain float32 implementation whose error sets the accuracy bound).
// Tensors are flat row-major vectors in the PyTorch shapes of attn/attention.h.
#pragma once

#include "attn/attention.h"

#include <vector>

namespace attn::reference {

struct Sizes {
    int64_t batch = 1, s_q = 1, s_k = 1;
};

int64_t element_count_of(const ConstTensor &t);
template <typename T>
std::vector<T> widen(const ConstTensor &t) {
    return std::vector<T>(t.data, t.data + element_count_of(t));
}

// [rows, H] · Wᵀ + b for nn.Linear weight [H_out, H_in].
template <typename T>
std::vector<T> linear(const std::vector<T> &in, int64_t rows, const ConstTensor &weight, const ConstTensor &bias);

// [B, heads, S_q, S_k] = Q·Kᵀ/√d + bias (bias broadcast over batch and heads of extent 1).
template <typename T>
std::vector<T> attention_scores(const Config &config, Sizes sizes, const std::vector<T> &q, const std::vector<T> &k,
                                const ConstTensor &bias);

// Softmax over keys; excluded keys (padding, causal) get 0; a row with none kept is all 0.
// With a bf16 core (config.precision's ReducedPrecision::bf16_core()), each weight
// exp(score − offset) is rounded to bf16 before the weights are summed, offset being the row
// max rounded up to a multiple of ln 2, as the flash core does (attn_gen::FlashAttention).
template <typename T>
std::vector<T> masked_softmax(const Config &config, Sizes sizes, const std::vector<T> &scores,
                              const MaskTensor &key_padding_mask);

// [B, S_q, H]: per head, probs · V, heads concatenated.
template <typename T>
std::vector<T> weighted_sum(const Config &config, Sizes sizes, const std::vector<T> &probs, const std::vector<T> &v);

// [B, S_q, H]: the three above in sequence, what stages::attention_core computes in one; with a
// bf16 core (config.precision's ReducedPrecision::bf16_core()), on Q, K and V rounded to bf16, as
// the bf16 layer's core takes them.
template <typename T>
std::vector<T> attention_core(const Config &config, Sizes sizes, const std::vector<T> &q, const std::vector<T> &k,
                              const std::vector<T> &v, const MaskTensor &key_padding_mask, const ConstTensor &bias);

// LayerNorm(x + ctx·W_oᵀ + b_o) over [B, S, H] (S = sizes.s_q).
template <typename T>
std::vector<T> output_layernorm(const Config &config, Sizes sizes, const std::vector<T> &ctx, const std::vector<T> &x,
                                const LayerWeights &weights);

// A GEMM's input in config.precision, rows of `features` values, as an implementation takes it:
// itself in fp32; each value rounded to bf16 (attn::round_to_bf16) in bf16; each row quantized
// to u8 (attn::quantize_row_u8, from its f32 values) and dequantized in int8.
template <typename T>
std::vector<T> gemm_input(const Config &config, std::vector<T> values, int64_t features);
// The layer's weights in config.precision: the caller's in fp32, else the four matrices rounded
// to bf16, or quantized to int8 and dequantized (scale · value, in f32), held in `storage`.
LayerWeights gemm_weights(const Config &config, const LayerWeights &weights, std::vector<std::vector<float>> &storage);

// bf16 (a bf16 core): how far stages::attention_core's context may move beyond the f32
// evaluation error, per element of ctx [B, S_q, H], because one of the core's own roundings
// to bf16 (of Q, K, V or a weight) goes the other way near a midpoint (context_allowance's
// core share, below); empty for fp32.
std::vector<double> core_allowance(const Config &config, Sizes sizes, const ConstTensor &q, const ConstTensor &k,
                                   const ConstTensor &v, const MaskTensor &key_padding_mask, const ConstTensor &bias);

template <typename T>
struct LayerOutputs {
    std::vector<T> q, k, v, scores, probs, ctx, y;
};
// In config.precision: bf16 computes its four projections from the weights rounded to
// bf16 (attn::round_to_bf16) and from their inputs rounded so (x and kv as they enter
// Q, K and V; the context as it enters the output projection), then in T like fp32; int8
// likewise from the weights quantized (attn::quantize_int8) and the inputs quantized per
// row (attn::quantize_row_u8, from their values in f32), each dequantized; the residual is
// the unrounded x. A bf16 core (ReducedPrecision::bf16_core()) also rounds Q, K and V as the
// core reads them (LayerOutputs holds them unrounded), and its weights (masked_softmax).
template <typename T>
LayerOutputs<T> attention_layer(const Config &config, const LayerWeights &weights, const AttentionInputs &inputs);

// bf16 and int8: how far y may move, beyond the f32 evaluation error of the same formula,
// because an implementation's context differs from the exact one and so may round to the
// other bf16 neighbour, or quantize to the other u8 value, where it lies near a midpoint.
// bf16: an element of the context is such a candidate when the exact value is within η of a
// midpoint, η = 2·|float32 − exact| (the accuracy rule's f32 error) + 1e-6·max|V| (the
// exponentials err by 5e-7 relatively at most, in the weights and in their sum: the flash
// core's, attn_gen's exp_nonpositive, by 4.3e-7 on the FMA targets bf16 and int8 are built
// for, the exact stages', Halide's exp, by 3.5e-7), plus, with a bf16 core, how far the context may move where one of the
// core's own roundings (of Q, K, V or a weight) goes the other way near a midpoint; each
// candidate moves the output projection z by one bf16 ulp times |W_o|. int8: the same η, measured in steps of the row's quantization and widened by
// the change of the row's range (low and high each move by at most the row's largest η),
// each candidate moving z by one step times |W_o|, and the step's own relative change
// moving z by as much. LayerNorm passes a row's Δz on to y as at most
// |γ|·(|Δz_o| + 2·max|Δz|)/σ (the mean's shift, and σ's to first order). Returns it per
// element of y; empty for fp32.
std::vector<double> context_allowance(const Config &config, const LayerWeights &weights, const AttentionInputs &inputs,
                                      const LayerOutputs<double> &exact, const LayerOutputs<float> &float32);

// Packed sequences (DESIGN.md): each sequence through attention_layer as a batch of one
// of its length, with its top-left corner of the bias. y [T, H]; probs each sequence's
// [heads, L_b, L_b], one after another.
template <typename T>
struct PackedOutputs {
    std::vector<T> y, probs;
    std::vector<double> allowance;  // bf16 and int8, double: context_allowance per element of y
};
template <typename T>
PackedOutputs<T> attention_layer_packed(const Config &config, const LayerWeights &weights, const PackedInputs &inputs);

}  // namespace attn::reference
