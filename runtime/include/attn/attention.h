// attn: BERT-style multi-head self-attention, compiled ahead of time with Halide.
//
// Tensors are views over the caller's memory in PyTorch's contiguous row-major
// order (shapes below are PyTorch shapes); nothing is copied. Every entry point
// validates its arguments first and reports a problem by throwing attn::Error,
// whose message names the argument, the expected and the actual value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace attn {

class Error : public std::runtime_error {
public:
    Error(std::string argument, const std::string &message)
        : std::runtime_error(argument + ": " + message), argument_(std::move(argument)) {}
    // The argument at fault ("x", "key_padding_mask", "variant", ...), or "halide"
    // for a failure reported from inside a pipeline.
    const std::string &argument() const { return argument_; }

private:
    std::string argument_;
};

using Shape = std::vector<int64_t>;

// `size` is the number of elements available at `data`: a view whose shape needs
// more is rejected rather than read or written out of bounds.
template <typename T>
struct TensorView {
    T *data = nullptr;
    std::size_t size = 0;
    Shape shape;

    TensorView() = default;
    TensorView(T *data_, std::size_t size_, Shape shape_) : data(data_), size(size_), shape(std::move(shape_)) {}
    // A mutable view converts to a read-only one.
    template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T> && !std::is_const_v<U>>>
    TensorView(const TensorView<U> &other) : data(other.data), size(other.size), shape(other.shape) {}

    bool empty() const { return data == nullptr && size == 0 && shape.empty(); }
};
using ConstTensor = TensorView<const float>;
using MutableTensor = TensorView<float>;
using MaskTensor = TensorView<const uint8_t>;  // 1 = real token, 0 = padding

// Views over a container's storage, e.g. attn::view(std::vector<float>&, {B, S, H}).
template <typename Container>
auto view(Container &c, Shape shape) -> TensorView<std::remove_reference_t<decltype(*c.data())>> {
    return {c.data(), c.size(), std::move(shape)};
}

struct Config {
    int64_t hidden_size = 768;
    int64_t num_heads = 12;
    float layer_norm_eps = 1e-12f;
    bool causal = false;  // decoder mask: key j excluded for query i when j > i + (S_k − S_q)

    int64_t head_dim() const { return num_heads > 0 ? hidden_size / num_heads : 0; }
};

// nn.Linear convention: weights [H_out, H_in], biases [H].
struct LayerWeights {
    ConstTensor w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o;
    ConstTensor gamma, beta;  // LayerNorm scale and shift, [H]
};

struct AttentionInputs {
    ConstTensor x;                 // [B, S_q, H]: queries and the residual
    ConstTensor kv;                // [B, S_k, H]: keys and values; empty for self-attention (kv = x)
    MaskTensor key_padding_mask;   // [B, S_k]; empty: every key is real
    ConstTensor bias;              // [B or 1, heads or 1, S_q, S_k] added to the scores; empty: none
};

struct VariantInfo {
    std::string name;      // "<schedule>_<isa>", e.g. "manual_avx2"
    std::string schedule;  // schedule source: manual, mullapudi2016, adams2019, li2018, autotuned
    std::string isa;       // sse41, avx2, avx512_zen4, ...
    std::string target;    // the Halide target it was compiled for
    std::string device;    // "cpu"
    bool runnable = false;   // this machine can run it
    std::string not_runnable_reason;  // why not, when it cannot
};

// Every compiled variant, in the order of schedules/variants.cmake.
const std::vector<VariantInfo> &variants();
// The variant to use on this machine: the widest ISA it can run (hand-written
// schedule first among equals). `name` empty selects it; otherwise the named one,
// which must exist and be runnable here.
const VariantInfo &select_variant(const std::string &name = "");

// One attention layer: validated weights bound to a variant.
class Attention {
public:
    Attention(Config config, LayerWeights weights, const std::string &variant = "");

    // y [B, S_q, H]. `probs`, if given, receives [B, heads, S_q, S_k].
    void forward(const AttentionInputs &inputs, MutableTensor y, MutableTensor probs = {}) const;

    const Config &config() const { return config_; }
    const VariantInfo &variant() const { return *variant_; }

private:
    Config config_;
    LayerWeights weights_;
    const VariantInfo *variant_;
};

// The stages of the layer, each its own AOT pipeline; shapes as in DESIGN.md.
namespace stages {
void qkv_projection(const VariantInfo &variant, const Config &config, ConstTensor x_q, ConstTensor x_kv,
                    const LayerWeights &weights, MutableTensor q, MutableTensor k, MutableTensor v);
void attention_scores(const VariantInfo &variant, const Config &config, ConstTensor q, ConstTensor k,
                      ConstTensor bias, MutableTensor scores);
void masked_softmax(const VariantInfo &variant, const Config &config, ConstTensor scores,
                    MaskTensor key_padding_mask, MutableTensor probs);
void weighted_sum(const VariantInfo &variant, const Config &config, ConstTensor probs, ConstTensor v,
                  MutableTensor ctx);
void output_layernorm(const VariantInfo &variant, const Config &config, ConstTensor ctx, ConstTensor x,
                      const LayerWeights &weights, MutableTensor y);
}  // namespace stages

}  // namespace attn
