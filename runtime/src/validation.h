// Argument checks shared by every entry point: each failure is an attn::Error naming the
// argument, what was expected and what was given, raised before anything is computed.
#pragma once

#include "attn/attention.h"

#include <string>
#include <vector>

namespace attn::validation {

std::string str(const Shape &shape);
int64_t element_count(const Shape &shape);

// Null data, rank and positive extents; returns the shape for deducing sizes.
template <typename T>
const Shape &check_rank(const char *name, const TensorView<T> &t, std::size_t rank, const char *layout) {
    if (t.data == nullptr) throw Error(name, std::string("data is null (expected a ") + layout + " tensor)");
    if (t.shape.size() != rank) {
        throw Error(name, "expected rank " + std::to_string(rank) + " " + layout + ", got shape " + str(t.shape));
    }
    for (int64_t d : t.shape) {
        if (d <= 0)
            throw Error(name, std::string("expected positive extents ") + layout + ", got shape " + str(t.shape));
    }
    return t.shape;
}

// Data, exact shape, enough elements, and no more than a Halide buffer can index.
void check_elements(const char *name, const void *data, std::size_t size, const Shape &shape, const Shape &expected,
                    const char *layout);
template <typename T>
void check_tensor(const char *name, const TensorView<T> &t, const Shape &expected, const char *layout) {
    check_elements(name, t.data, t.size, t.shape, expected, layout);
}

// A given (non-empty) tensor in host memory; `why` says why it must be.
template <typename T>
void check_host(const char *name, const TensorView<T> &t, const std::string &why) {
    if (!t.empty() && t.memory != Memory::host)
        throw Error(name, "expected host memory (" + why + "), got device memory");
}

template <typename T, typename U>
bool overlaps(const TensorView<T> &a, const TensorView<U> &b) {
    if (a.empty() || b.empty() || !a.data || !b.data) return false;
    auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
    auto a1 = a0 + element_count(a.shape) * sizeof(T), b1 = b0 + element_count(b.shape) * sizeof(U);
    return a0 < b1 && b0 < a1;
}

// `layer`: the config of an Attention, which may ask for bf16 or int8 (the stages fp32 or bf16).
void check_config(const Config &config, bool layer = false);
// A layer asked for its probabilities: refused in bf16 and int8, which have no such output.
void check_probs_precision(const Config &config);
// A reduced precision (config.precision) on `variant`, whose ISA may lack its instructions:
// refused (attn::Error("precision"), saying how to allow it) unless config.allow_storage_only.
void check_computes_natively(const VariantInfo &variant, const Config &config);
// For a refusal: the variants that provide `function` (in precision p), each marked when it
// lacks p's instructions, or "none in this build".
std::string variants_providing(const std::string &function, const ReducedPrecision &p);

// The layer's weights, each with its argument name (manifest.json's): the projections'
// (w_q, w_k, w_v, b_q, b_k, b_v) and the output's (w_o, b_o, gamma, beta).
struct WeightArgument {
    const char *name;
    ConstTensor LayerWeights::*tensor;
    bool matrix;  // [H_out, H_in]; else a vector [H]
    bool output;  // the output projection and LayerNorm's; else the QKV projection's
};
inline constexpr WeightArgument kWeightArguments[] = {
    {"w_q", &LayerWeights::w_q, true, false},     {"w_k", &LayerWeights::w_k, true, false},
    {"w_v", &LayerWeights::w_v, true, false},     {"b_q", &LayerWeights::b_q, false, false},
    {"b_k", &LayerWeights::b_k, false, false},    {"b_v", &LayerWeights::b_v, false, false},
    {"w_o", &LayerWeights::w_o, true, true},      {"b_o", &LayerWeights::b_o, false, true},
    {"gamma", &LayerWeights::gamma, false, true}, {"beta", &LayerWeights::beta, false, true}};
// The projection weights and/or the output ones.
void check_weights(const Config &config, const LayerWeights &weights, bool projections, bool output);

// key_padding_mask [B, S_k], when given: the one check of a mask, for the dense calls
// and for packing a padded batch (which also needs right padding: `right_padded`).
void check_key_padding_mask(const MaskTensor &mask, int64_t batch, int64_t s_k, bool right_padded = false);

// Packed sequences' offsets against T = `tokens` token rows (any T where `tokens` < 0):
// each sequence's length, or the error naming sequence_offsets (o_0 = 0, no decrease, o_B = T).
std::vector<int64_t> sequence_lengths(const OffsetTensor &offsets, int64_t tokens, const char *tokens_from);

}  // namespace attn::validation
