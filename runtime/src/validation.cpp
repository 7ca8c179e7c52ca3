#include "validation.h"

#include "attn/internal.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attn::validation {

std::string str(const Shape &shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

int64_t element_count(const Shape &shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

void check_elements(const char *name, const void *data, std::size_t size, const Shape &shape, const Shape &expected,
                    const char *layout) {
    if (data == nullptr) throw Error(name, "data is null (expected shape " + str(expected) + " " + layout + ")");
    if (shape != expected) throw Error(name, "expected shape " + str(expected) + " " + layout + ", got " + str(shape));
    const int64_t needed = element_count(expected);
    if (size < std::size_t(needed)) {
        throw Error(name, "shape " + str(expected) + " needs " + std::to_string(needed) +
                              " elements, but the buffer holds " + std::to_string(size));
    }
    // Halide indexes with 32-bit integers.
    if (needed > std::numeric_limits<int32_t>::max()) {
        throw Error(name, "shape " + str(expected) + " has " + std::to_string(needed) +
                              " elements, more than the 2^31 - 1 a Halide buffer can index");
    }
}

void check_probs_precision(const Config &config) {
    if (config.precision != Precision::fp32)
        throw Error("probs", std::string("a ") + precision_name(config.precision) +
                                 " layer (config.precision) has no probabilities output; pass none, or use fp32");
}

void check_computes_natively(const VariantInfo &variant, const Config &config) {
    if (config.precision == Precision::fp32 || config.allow_storage_only || computes_natively(variant, config.precision))
        return;
    const ReducedPrecision &p = reduced_precision(config.precision);
    throw Error("precision", std::string(p.name) + " on '" + variant.name + "' would " + p.without_feature +
                                 " (its ISA, " + variant.isa + ", has no " + p.cpu_feature +
                                 "); set config.allow_storage_only to " + p.without_feature);
}

std::string variants_providing(const std::string &function, const ReducedPrecision &p) {
    std::string names;
    for (const VariantInfo *v : detail::compiled_and_registered_variants()) {  // a registered candidate's too
        if (!v->provides(function)) continue;
        names += (names.empty() ? "" : ", ") + v->name +
                 (computes_natively(*v, p.precision) ? "" : " (without " + std::string(p.cpu_feature) + ")");
    }
    return names.empty() ? "none in this build" : names;
}

void check_config(const Config &c, bool layer) {
    if (c.precision != Precision::fp32 && c.precision != Precision::bf16 && c.precision != Precision::int8)
        throw Error("precision", "expected " + precision_names() + ", got " + std::to_string(int(c.precision)));
    if (c.precision == Precision::int8 && !layer)
        throw Error("precision", "the stages run in fp32 or bf16; int8 is a precision of the whole layer (attn::Attention)");
    // int8: |Σ q·w − zero·Σ w| <= 2 · 255 · kInt8WeightLimit · H must fit the i32 sums.
    constexpr int64_t kLargestInt8Hidden = (int64_t(1) << 31) / (2 * 255 * kInt8WeightLimit) - 4;
    if (c.precision == Precision::int8 && c.hidden_size > kLargestInt8Hidden)
        throw Error("hidden_size", "expected at most " + std::to_string(kLargestInt8Hidden) +
                                       " with int8 (its i32 sums), got " + std::to_string(c.hidden_size));
    if (c.hidden_size <= 0) throw Error("hidden_size", "expected > 0, got " + std::to_string(c.hidden_size));
    if (c.num_heads <= 0) throw Error("num_heads", "expected > 0, got " + std::to_string(c.num_heads));
    if (c.hidden_size % c.num_heads != 0) {
        throw Error("num_heads", "expected a divisor of hidden_size " + std::to_string(c.hidden_size) + ", got " +
                                     std::to_string(c.num_heads));
    }
    if (!std::isfinite(c.layer_norm_eps) || c.layer_norm_eps < 0) {
        throw Error("layer_norm_eps", "expected a finite value >= 0, got " + std::to_string(c.layer_norm_eps));
    }
}

void check_weights(const Config &c, const LayerWeights &w, bool projections, bool output) {
    for (const WeightArgument &a : kWeightArguments) {
        if (a.output ? !output : !projections) continue;
        if (a.matrix) {
            check_tensor(a.name, w.*a.tensor, {c.hidden_size, c.hidden_size}, "[H_out, H_in]");
        } else {
            check_tensor(a.name, w.*a.tensor, {c.hidden_size}, "[H]");
        }
    }
}

void check_key_padding_mask(const MaskTensor &mask, int64_t batch, int64_t s_k, bool right_padded) {
    if (mask.empty()) return;
    const char *name = "key_padding_mask";
    check_tensor(name, mask, {batch, s_k}, right_padded ? "[B, S]" : "[B, S_k]");
    if (!right_padded) return;
    check_host(name, mask, "packing reads it on the host");
    for (int64_t b = 0; b < batch; ++b) {
        const uint8_t *row = mask.data + b * s_k;
        const int64_t length = std::find(row, row + s_k, uint8_t(0)) - row;
        const uint8_t *late = std::find_if(row + length, row + s_k, [](uint8_t m) { return m != 0; });
        if (late != row + s_k) {
            throw Error(name, "expected right padding (each row: ones, then zeros); row " + std::to_string(b) +
                                  " has a real token at position " + std::to_string(late - row) +
                                  " after padding at position " + std::to_string(length));
        }
    }
}

std::vector<int64_t> sequence_lengths(const OffsetTensor &offsets, int64_t tokens, const char *tokens_from) {
    const char *name = "sequence_offsets";
    if (offsets.data == nullptr) throw Error(name, "data is null (expected [B + 1] int32 offsets)");
    if (offsets.shape.size() != 1 || offsets.shape[0] < 1) {
        throw Error(name, "expected shape [B + 1] with B >= 0, got " + str(offsets.shape));
    }
    check_host(name, offsets, "the offsets are validated on the host");
    const int64_t count = offsets.shape[0];
    if (offsets.size < std::size_t(count)) {
        throw Error(name, "shape " + str(offsets.shape) + " needs " + std::to_string(count) +
                              " elements, but the buffer holds " + std::to_string(offsets.size));
    }
    if (offsets.data[0] != 0) throw Error(name, "expected o_0 = 0, got " + std::to_string(offsets.data[0]));
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b + 1 < count; ++b) {
        const int32_t from = offsets.data[b], to = offsets.data[b + 1];
        if (to < from) {
            throw Error(name, "expected non-decreasing offsets, got o_" + std::to_string(b + 1) + " = " +
                                  std::to_string(to) + " < o_" + std::to_string(b) + " = " + std::to_string(from));
        }
        lengths.push_back(to - from);
    }
    if (tokens >= 0 && offsets.data[count - 1] != tokens) {
        throw Error(name, "expected the last offset o_" + std::to_string(count - 1) +
                              " = T = " + std::to_string(tokens) + " (" + tokens_from + "), got " +
                              std::to_string(offsets.data[count - 1]));
    }
    return lengths;
}

}  // namespace attn::validation
