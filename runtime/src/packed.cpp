// Packed variable-length sequences (DESIGN.md): packing a padded batch's real tokens,
// unpacking results, and the layer over packed sequences (Attention::forward_packed, and
// forward_unpadded, which packs, runs it and unpacks).
#include "attn/attention.h"
#include "attn/function_calls.h"

#include "pipeline_call.h"
#include "validation.h"

#include <algorithm>

namespace attn {

using namespace validation;

namespace {
// The sum of heads·L² over validated lengths.
int64_t probs_elements(const std::vector<int64_t> &lengths, int64_t heads) {
    int64_t total = 0;
    for (int64_t length : lengths) total += heads * length * length;
    return total;
}
}  // namespace

int64_t packed_probs_size(OffsetTensor sequence_offsets, int64_t heads) {
    if (heads < 1) throw Error("heads", "expected at least 1, got " + std::to_string(heads));
    return probs_elements(sequence_lengths(sequence_offsets, -1, nullptr), heads);
}

PackedBatch pack(ConstTensor x, MaskTensor key_padding_mask) {
    const char *layout = "[B, S, H]";
    const Shape &shape = check_rank("x", x, 3, layout);
    check_tensor("x", x, shape, layout);
    check_host("x", x, "packing copies on the host");
    const int64_t batch = shape[0], seq = shape[1], hidden = shape[2];
    check_key_padding_mask(key_padding_mask, batch, seq, true);
    PackedBatch packed;
    packed.hidden = hidden;
    packed.sequence_offsets.push_back(0);
    for (int64_t b = 0; b < batch; ++b) {
        const uint8_t *row = key_padding_mask.empty() ? nullptr : key_padding_mask.data + b * seq;
        const int64_t length = row ? std::find(row, row + seq, uint8_t(0)) - row : seq;  // right padded
        const float *rows = x.data + b * seq * hidden;
        packed.x.insert(packed.x.end(), rows, rows + length * hidden);
        packed.sequence_offsets.push_back(int32_t(packed.sequence_offsets.back() + length));
    }
    return packed;
}

void unpack(ConstTensor packed, OffsetTensor sequence_offsets, MutableTensor padded) {
    const Shape &ps = packed.shape;
    if (ps.size() != 2 || ps[0] < 0 || ps[1] <= 0) throw Error("packed", "expected shape [T, H], got " + str(ps));
    if (ps[0] > 0) check_tensor("packed", packed, ps, "[T, H]");
    check_host("packed", packed, "unpacking copies on the host");
    const std::vector<int64_t> lengths = sequence_lengths(sequence_offsets, ps[0], "packed's rows");
    const int64_t batch = int64_t(lengths.size()), hidden = ps[1];
    const int64_t longest = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
    const Shape &out = padded.shape;
    if (out.size() != 3 || out[0] != batch || out[1] < longest || out[2] != hidden) {
        throw Error("padded", "expected shape [B, S, H] = [" + std::to_string(batch) + ", S >= " +
                                  std::to_string(longest) + ", " + std::to_string(hidden) + "], got " + str(out));
    }
    if (element_count(out) > 0) check_tensor("padded", padded, out, "[B, S, H]");
    check_host("padded", padded, "unpacking copies on the host");
    if (overlaps(padded, packed)) throw Error("padded", "must not overlap packed");
    std::fill(padded.data, padded.data + element_count(out), 0.0f);
    for (int64_t b = 0; b < batch; ++b) {
        const float *from = packed.data + int64_t(sequence_offsets.data[b]) * hidden;
        std::copy(from, from + lengths[std::size_t(b)] * hidden, padded.data + b * out[1] * hidden);
    }
}

void Attention::forward_packed(const PackedInputs &in, MutableTensor y, MutableTensor probs) const {
    detail::runnable_functions(*variant_);  // a variant that cannot run here is refused first
    const int64_t hidden = config_.hidden_size, heads = config_.num_heads;
    const Shape &xs = in.x.shape;
    if (xs.size() != 2 || xs[0] < 0 || xs[1] != hidden) {
        throw Error("x", "expected shape [T, H] with H = " + std::to_string(hidden) + ", got " + str(xs));
    }
    const int64_t tokens = xs[0];
    if (tokens > 0) check_tensor("x", in.x, xs, "[T, H]");
    const std::vector<int64_t> lengths = sequence_lengths(in.sequence_offsets, tokens, "x's rows");
    const int64_t batch = int64_t(lengths.size());
    const int64_t longest = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
    if (y.shape != xs) throw Error("y", "expected shape [T, H] = " + str(xs) + ", got " + str(y.shape));
    if (tokens > 0) check_tensor("y", y, xs, "[T, H]");
    const bool want_probs = !probs.empty();
    if (want_probs) {
        check_probs_precision(config_);
        check_tensor("probs", probs, {probs_elements(lengths, heads)}, "[sum over sequences of heads * L_b^2]");
        check_host("probs", probs, "each sequence's probabilities are gathered on the host");
    }
    const char *bias_layout = "[heads or 1, S_max, S_max]";
    if (!in.bias.empty()) {
        const Shape &bs = check_rank("bias", in.bias, 3, bias_layout);
        if ((bs[0] != heads && bs[0] != 1) || bs[1] != bs[2] || bs[1] < longest) {
            throw Error("bias", std::string("expected shape ") + bias_layout + " = [" + std::to_string(heads) +
                                    " or 1, S_max, S_max] with S_max >= the longest sequence, " +
                                    std::to_string(longest) + ", got " + str(bs));
        }
        check_tensor("bias", in.bias, bs, bias_layout);
    }
    for (const ConstTensor *input : {&in.x, &in.bias}) {
        if (overlaps(y, *input)) throw Error("y", "must not overlap an input buffer");
        if (want_probs && overlaps(probs, *input)) throw Error("probs", "must not overlap an input buffer");
    }
    if (want_probs && overlaps(y, probs)) throw Error("probs", "must not overlap y");
    if (tokens == 0) return;  // no token, nothing to compute

    const VariantInfo &variant = variant_for(longest, longest);
    pipeline::prepare_halide(variant);
    const halide_device_interface_t *gpu = detail::device_interface(variant.device);
    detail::PreparedWeights *prepared = prepared_weights_.get();
    detail::PreparedWeights *uploaded = prepared && prepared->uploaded ? prepared : nullptr;
    pipeline::BiasInput bias =
        pipeline::packed_bias_input(in.bias, batch, heads, longest, gpu, uploaded ? &uploaded->zeros : nullptr);
    const int32_t t = int32_t(tokens), h = int32_t(hidden), s_max = int32_t(longest), b = int32_t(batch);
    // The token rows as a batch of one: (hidden, token, 1).
    const halide_dimension_t rows[3] = {{0, h, 1}, {0, t, h}, {0, 1, t * h}};
    Halide::Runtime::Buffer<const float> x(in.x.data, 3, rows);
    Halide::Runtime::Buffer<float> y_buffer(y.data, 3, rows);
    Halide::Runtime::Buffer<const int32_t> offsets(in.sequence_offsets.data, b + 1);
    // The probabilities come as [B, heads, S_max, S_max], each sequence's at its top left.
    Halide::Runtime::Buffer<float> padded_probs;
    if (want_probs) padded_probs = Halide::Runtime::Buffer<float>(s_max, s_max, int32_t(heads), b);
    std::unique_ptr<pipeline::WeightBuffers> given;  // a bf16 or int8 layer's vectors
    pipeline::WeightBuffers &w =
        prepared ? prepared->weights_for(variant)
                 : *(given = std::make_unique<pipeline::WeightBuffers>(weights_, true, true));
    pipeline::Call call(want_probs         ? "attention_layer_packed_probs"
                        : reduced_weights_ ? reduced_precision(config_.precision).packed_layer
                                           : "attention_layer_packed",
                        variant, pipeline::extents(batch, longest, longest, heads, hidden));
    if (reduced_weights_) {
        call.weights(w, *reduced_weights_);
    } else {
        call.weights(w, uploaded != nullptr);
    }
    call.input("x", x, in.x.memory);
    call.input("sequence_offsets", offsets, Memory::host).input("bias", bias);
    call.scalar("max_length", s_max).scalar("causal", config_.causal).scalar("heads", int32_t(heads));
    call.scalar("eps", config_.layer_norm_eps).output("y", y_buffer, y.memory);
    if (want_probs) call.output("probs", padded_probs, Memory::host);
    call.run();
    if (!want_probs) return;
    float *out = probs.data;
    for (int32_t sequence = 0; sequence < b; ++sequence) {
        const int32_t length = int32_t(lengths[std::size_t(sequence)]);
        for (int32_t head = 0; head < int32_t(heads); ++head) {
            for (int32_t i = 0; i < length; ++i) {
                for (int32_t j = 0; j < length; ++j) *out++ = padded_probs(j, i, head, sequence);
            }
        }
    }
}

void Attention::forward_unpadded(const AttentionInputs &in, MutableTensor y) const {
    if (!in.kv.empty())
        throw Error("kv", "forward_unpadded computes self-attention: expected no kv, got shape " + str(in.kv.shape));
    const char *layout = "[B, S, H]";
    const Shape &xs = check_rank("x", in.x, 3, layout);
    check_tensor("x", in.x, {xs[0], xs[1], config_.hidden_size}, layout);
    check_tensor("y", y, xs, layout);
    check_host("y", y, "unpacking copies on the host");
    check_host("bias", in.bias, "the bias is passed on to forward_packed as a host view");
    PackedBatch packed = pack(in.x, in.key_padding_mask);
    PackedInputs inputs = packed.inputs();
    if (!in.bias.empty()) {
        const char *bias_layout = "[1, heads or 1, S, S]";
        const Shape &bs = check_rank("bias", in.bias, 4, bias_layout);
        if (bs[0] != 1 || (bs[1] != config_.num_heads && bs[1] != 1) || bs[2] != xs[1] || bs[3] != xs[1]) {
            throw Error("bias", std::string("expected shape ") + bias_layout + " = [1, " +
                                    std::to_string(config_.num_heads) + " or 1, " + std::to_string(xs[1]) + ", " +
                                    std::to_string(xs[1]) + "] (one bias for every sequence), got " + str(bs));
        }
        check_tensor("bias", in.bias, bs, bias_layout);
        inputs.bias = {in.bias.data, in.bias.size, {bs[1], bs[2], bs[3]}};
    }
    if (overlaps(y, in.x) || overlaps(y, in.bias)) throw Error("y", "must not overlap an input buffer");
    std::vector<float> y_packed(packed.x.size());
    forward_packed(inputs, view(y_packed, {packed.tokens(), config_.hidden_size}));
    unpack(view(y_packed, {packed.tokens(), config_.hidden_size}), inputs.sequence_offsets, y);
}

namespace {
// The packed sequences' inputs, with the bias [1, heads, S, S] viewed as one bias for every sequence.
PackedInputs packed_inputs(const detail::CallShape &c, const detail::CallInputs &in) {
    PackedInputs packed = in.packed;
    if (!in.bias.empty()) {
        packed.bias = {in.bias.data, in.bias.size, {c.config.num_heads, c.s_q, c.s_k}, in.bias.memory};
    }
    return packed;
}
}  // namespace

// The packed layer's by-name call (attn/function_calls.h).
detail::FunctionCall detail::packed_layer_call(bool with_probs, Precision precision) {
    FunctionCall f;
    f.work = layer_work;  // per sequence: the caller sums it over them
    f.outputs = [with_probs](const CallShape &c, const CallInputs &in) {
        std::vector<CallOutput> out{{"y", {in.packed.x.shape[0], c.config.hidden_size}}};
        if (with_probs) out.push_back({"probs", {packed_probs_size(in.packed.sequence_offsets, c.config.num_heads)}});
        return out;
    };
    auto config_of = [precision](const CallShape &c) { return call_config(c, precision); };
    f.prepare = [with_probs, config_of](const VariantInfo &variant, const CallShape &c, const CallInputs &in,
                                        const std::vector<MutableTensor> &out) -> std::function<void()> {
        auto layer = std::make_shared<Attention>(config_of(c), in.weights, variant.name);
        return [layer, inputs = packed_inputs(c, in), out, with_probs] {
            layer->forward_packed(inputs, out[0], with_probs ? out[1] : MutableTensor{});
            layer->synchronize();
        };
    };
    f.reference = [with_probs, config_of](const CallShape &c, const CallInputs &in) {
        const PackedInputs inputs = packed_inputs(c, in);
        const Config config = config_of(c);
        auto exact = reference::attention_layer_packed<double>(config, in.weights, inputs);
        std::vector<double> allowance = std::move(exact.allowance);
        CallReference r = layer_reference(
            std::move(exact), reference::attention_layer_packed<float>(config, in.weights, inputs), with_probs);
        r.allowance[0] = std::move(allowance);
        return r;
    };
    return f;
}

}  // namespace attn
