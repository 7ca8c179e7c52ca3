// The stages of the layer, each its own AOT pipeline (attn::stages): validate, bind by
// name, call; and every manifest function's entry in the by-name call table
// (attn/function_calls.h), each stage's beside it.
#include "attn/attention.h"
#include "attn/function_calls.h"

#include "pipeline_call.h"
#include "validation.h"

#include <algorithm>
#include <map>
#include <memory>

namespace attn::stages {

using namespace validation;
using pipeline::halide_view;

namespace {
// The config, q [B, S_q, H] and k [B, S_k, H] of a stage that attends: q's shape, and S_k.
std::pair<Shape, int64_t> check_queries_and_keys(const Config &config, const ConstTensor &q, const ConstTensor &k) {
    check_config(config);
    const Shape &qs = check_rank("q", q, 3, "[B, S_q, H]");
    check_tensor("q", q, {qs[0], qs[1], config.hidden_size}, "[B, S_q, H]");
    const int64_t s_k = check_rank("k", k, 3, "[B, S_k, H]")[1];
    check_tensor("k", k, {qs[0], s_k, config.hidden_size}, "[B, S_k, H]");
    return {qs, s_k};
}

// The manifest function that runs `stage` in config.precision on `variant`: the stage itself
// in fp32, `<stage>_bf16` in bf16 (manifest.json), which the variant must have, and compute
// natively unless config.allow_storage_only. (The softmax, which has no products, is f32 in
// every precision: masked_softmax does not ask.)
std::string stage_function(const VariantInfo &variant, const Config &config, const std::string &stage) {
    if (config.precision == Precision::fp32) return stage;
    const ReducedPrecision &p = reduced_precision(config.precision);
    const std::string function = stage + "_" + p.name;
    if (!variant.provides(function))
        throw Error("variant", "'" + variant.name + "' has no " + p.name + " " + stage + " (precision " + p.name +
                                   "): it does not provide " + function + "; the variants that do: " +
                                   variants_providing(function, p));
    check_computes_natively(variant, config);
    return function;
}

// ---- the by-name call table (attn/function_calls.h) ----

using detail::CallInputs;
using detail::CallOutput;
using detail::CallReference;
using detail::CallShape;
using detail::CallWork;
using detail::FunctionCall;

Shape q_shape(const CallShape &c) { return {c.batch, c.s_q, c.config.hidden_size}; }
Shape kv_shape(const CallShape &c) { return {c.batch, c.s_k, c.config.hidden_size}; }
Shape score_shape(const CallShape &c) { return {c.batch, c.config.num_heads, c.s_q, c.s_k}; }
reference::Sizes sizes(const CallShape &c) { return {c.batch, c.s_q, c.s_k}; }
template <typename T>
std::vector<T> widen(const ConstTensor &t) {
    return reference::widen<T>(t);
}

// The extents of a call as doubles, for its work: B, S_q, S_k, H, heads, and 4 bytes per float.
struct Extents {
    double B, Sq, Sk, H, heads, f = 4;
    explicit Extents(const CallShape &c)
        : B(double(c.batch)),
          Sq(double(c.s_q)),
          Sk(double(c.s_k)),
          H(double(c.config.hidden_size)),
          heads(double(c.config.num_heads)) {}
    double scores() const { return B * heads * Sq * Sk; }
    double attend() const { return 2 * B * Sq * Sk * H; }  // Q·Kᵀ or P·V over all heads
};

// A call's extents with its config in `precision` (call_config).
CallShape in_precision(CallShape c, Precision precision) {
    c.config = call_config(c, precision);
    return c;
}
// A GEMM's input as a stage in c.config.precision takes it (reference::gemm_input), rows of
// `features` values.
template <typename T>
std::vector<T> operand(const CallShape &c, const ConstTensor &t, int64_t features) {
    return reference::gemm_input(c.config, widen<T>(t), features);
}

// A stage after the projections (one output, the layer's intermediates in), in `precision`:
// `call(variant, config, inputs, output)`, `reference(shape, inputs, T())` in T, both given the
// config in that precision; `allowance(shape, inputs)`, if given, the output's
// (CallReference::allowance).
template <typename Call, typename Reference>
FunctionCall one_output_stage(Precision precision, const char *output, Shape (*shape)(const CallShape &),
                              CallWork (*work)(const CallShape &), Call call, Reference reference,
                              std::vector<double> (*allowance)(const CallShape &, const CallInputs &) = nullptr) {
    FunctionCall f;
    f.work = work;
    f.outputs = [output, shape](const CallShape &c, const CallInputs &) {
        return std::vector<CallOutput>{{output, shape(c)}};
    };
    f.prepare = [call, precision](const VariantInfo &variant, const CallShape &c, const CallInputs &in,
                                  const std::vector<MutableTensor> &out) -> std::function<void()> {
        return [&variant, config = call_config(c, precision), in, out, call] {
            call(variant, config, in, out[0]);
            synchronize(variant);
        };
    };
    f.reference = [reference, precision, allowance](const CallShape &shape, const CallInputs &in) {
        const CallShape c = in_precision(shape, precision);
        return CallReference{{reference(c, in, double())},
                             {reference(c, in, float())},
                             {allowance ? allowance(c, in) : std::vector<double>()}};
    };
    f.reads_intermediates = true;
    return f;
}

}  // namespace

void qkv_projection(const VariantInfo &variant, const Config &config, ConstTensor x_q, ConstTensor x_kv,
                    const LayerWeights &weights, MutableTensor q, MutableTensor k, MutableTensor v) {
    detail::runnable_functions(variant);
    check_config(config);
    check_weights(config, weights, true, false);
    const int64_t hidden = config.hidden_size;
    const Shape &xq = check_rank("x_q", x_q, 3, "[B, S_q, H]");
    check_tensor("x_q", x_q, {xq[0], xq[1], hidden}, "[B, S_q, H]");
    const int64_t s_k = check_rank("x_kv", x_kv, 3, "[B, S_k, H]")[1];
    check_tensor("x_kv", x_kv, {xq[0], s_k, hidden}, "[B, S_k, H]");
    check_tensor("q", q, {xq[0], xq[1], hidden}, "[B, S_q, H]");
    check_tensor("k", k, {xq[0], s_k, hidden}, "[B, S_k, H]");
    check_tensor("v", v, {xq[0], s_k, hidden}, "[B, S_k, H]");
    auto xq_buffer = halide_view(x_q), xkv_buffer = halide_view(x_kv);
    pipeline::WeightBuffers w(weights, true, false);
    auto q_buffer = halide_view(q), k_buffer = halide_view(k), v_buffer = halide_view(v);
    pipeline::Call call(stage_function(variant, config, "qkv_projection"), variant, pipeline::extents(xq[0], xq[1], s_k, config.num_heads, hidden));
    call.input("x_q", xq_buffer, x_q.memory).input("x_kv", xkv_buffer, x_kv.memory).weights(w, false);
    call.output("q", q_buffer, q.memory).output("k", k_buffer, k.memory).output("v", v_buffer, v.memory).run();
}

namespace {
FunctionCall qkv_projection_call(Precision precision) {
    FunctionCall f;
    f.work = [](const CallShape &c) {
        const Extents e(c);
        return CallWork{2 * e.B * (e.Sq + 2 * e.Sk) * e.H * e.H,
                        e.f * (e.B * e.Sq * e.H + e.B * e.Sk * e.H + 3 * e.H * e.H + e.B * (e.Sq + 2 * e.Sk) * e.H)};
    };
    f.outputs = [](const CallShape &c, const CallInputs &) {
        return std::vector<CallOutput>{{"q", q_shape(c)}, {"k", kv_shape(c)}, {"v", kv_shape(c)}};
    };
    f.prepare = [precision](const VariantInfo &variant, const CallShape &c, const CallInputs &in,
                            const std::vector<MutableTensor> &out) -> std::function<void()> {
        const ConstTensor kv = in.kv.empty() ? in.x : in.kv;
        return [&variant, config = call_config(c, precision), in, kv, out] {
            qkv_projection(variant, config, in.x, kv, in.weights, out[0], out[1], out[2]);
            synchronize(variant);
        };
    };
    f.reference = [precision](const CallShape &shape, const CallInputs &in) {
        const CallShape c = in_precision(shape, precision);
        const ConstTensor kv = in.kv.empty() ? in.x : in.kv;
        std::vector<std::vector<float>> rounded;
        const LayerWeights w = reference::gemm_weights(c.config, in.weights, rounded);
        const int64_t rows_q = c.batch * c.s_q, rows_k = c.batch * c.s_k, H = c.config.hidden_size;
        const std::vector<double> xd = operand<double>(c, in.x, H), kvd = operand<double>(c, kv, H);
        const std::vector<float> xf = operand<float>(c, in.x, H), kvf = operand<float>(c, kv, H);
        CallReference r;
        r.exact = {reference::linear(xd, rows_q, w.w_q, w.b_q), reference::linear(kvd, rows_k, w.w_k, w.b_k),
                   reference::linear(kvd, rows_k, w.w_v, w.b_v)};
        r.float32 = {reference::linear(xf, rows_q, w.w_q, w.b_q), reference::linear(kvf, rows_k, w.w_k, w.b_k),
                     reference::linear(kvf, rows_k, w.w_v, w.b_v)};
        return r;
    };
    return f;
}
}  // namespace

void attention_scores(const VariantInfo &variant, const Config &config, ConstTensor q, ConstTensor k, ConstTensor bias,
                      MutableTensor scores) {
    detail::runnable_functions(variant);
    const int64_t hidden = config.hidden_size, heads = config.num_heads;
    const auto [qs, s_k] = check_queries_and_keys(config, q, k);
    check_tensor("scores", scores, {qs[0], heads, qs[1], s_k}, "[B, heads, S_q, S_k]");
    pipeline::prepare_halide(variant);
    pipeline::BiasInput b =
        pipeline::bias_input(bias, qs[0], heads, qs[1], s_k, detail::device_interface(variant.device));
    auto q_buffer = halide_view(q), k_buffer = halide_view(k);
    auto s_buffer = halide_view(scores);
    pipeline::Call call(stage_function(variant, config, "attention_scores"), variant, pipeline::extents(qs[0], qs[1], s_k, heads, hidden));
    call.input("q", q_buffer, q.memory).input("k", k_buffer, k.memory).input("bias", b);
    call.scalar("heads", int32_t(heads)).output("scores", s_buffer, scores.memory).run();
}

namespace {
FunctionCall attention_scores_call(Precision precision) {
    return one_output_stage(
        precision, "scores", score_shape,
        [](const CallShape &c) {
            const Extents e(c);
            return CallWork{e.attend(), e.f * (e.B * e.Sq * e.H + e.B * e.Sk * e.H + e.scores())};
        },
        [](const VariantInfo &v, const Config &c, const CallInputs &in, MutableTensor out) {
            attention_scores(v, c, in.q, in.k, in.bias, out);
        },
        [](const CallShape &c, const CallInputs &in, auto t) {
            using T = decltype(t);
            const int64_t H = c.config.hidden_size;
            return reference::attention_scores(c.config, sizes(c), operand<T>(c, in.q, H), operand<T>(c, in.k, H),
                                               in.bias);
        });
}
}  // namespace

void masked_softmax(const VariantInfo &variant, const Config &config, ConstTensor scores, MaskTensor key_padding_mask,
                    MutableTensor probs) {
    detail::runnable_functions(variant);
    check_config(config);
    const char *layout = "[B, heads, S_q, S_k]";
    const Shape &s = check_rank("scores", scores, 4, layout);
    check_tensor("scores", scores, {s[0], config.num_heads, s[2], s[3]}, layout);
    check_tensor("probs", probs, s, layout);
    pipeline::prepare_halide(variant);
    pipeline::MaskInput mask =
        pipeline::mask_input(key_padding_mask, s[0], s[3], detail::device_interface(variant.device));
    auto s_buffer = halide_view(scores);
    auto p_buffer = halide_view(probs);
    pipeline::Call call("masked_softmax", variant, pipeline::extents(s[0], s[2], s[3], s[1], config.hidden_size));
    call.input("scores", s_buffer, scores.memory).input("key_padding_mask", mask).scalar("causal", config.causal);
    call.output("probs", p_buffer, probs.memory).run();
}

namespace {
FunctionCall masked_softmax_call() {
    return one_output_stage(
        Precision::fp32, "probs", score_shape,
        [](const CallShape &c) {
            const Extents e(c);
            return CallWork{5 * e.scores(), e.f * 2 * e.scores()};
        },
        [](const VariantInfo &v, const Config &c, const CallInputs &in, MutableTensor out) {
            masked_softmax(v, c, in.scores, in.key_padding_mask, out);
        },
        [](const CallShape &c, const CallInputs &in, auto t) {
            using T = decltype(t);
            return reference::masked_softmax(c.config, sizes(c), widen<T>(in.scores), in.key_padding_mask);
        });
}
}  // namespace

void weighted_sum(const VariantInfo &variant, const Config &config, ConstTensor probs, ConstTensor v,
                  MutableTensor ctx) {
    detail::runnable_functions(variant);
    check_config(config);
    const int64_t hidden = config.hidden_size, heads = config.num_heads;
    const char *layout = "[B, heads, S_q, S_k]";
    const Shape &p = check_rank("probs", probs, 4, layout);
    check_tensor("probs", probs, {p[0], heads, p[2], p[3]}, layout);
    check_tensor("v", v, {p[0], p[3], hidden}, "[B, S_k, H]");
    check_tensor("ctx", ctx, {p[0], p[2], hidden}, "[B, S_q, H]");
    auto p_buffer = halide_view(probs), v_buffer = halide_view(v);
    auto ctx_buffer = pipeline::head_view(ctx, heads);
    pipeline::Call call(stage_function(variant, config, "weighted_sum"), variant, pipeline::extents(p[0], p[2], p[3], heads, hidden));
    call.input("probs", p_buffer, probs.memory).input("v", v_buffer, v.memory);
    call.output("ctx", ctx_buffer, ctx.memory).run();
}

namespace {
FunctionCall weighted_sum_call(Precision precision) {
    return one_output_stage(
        precision, "ctx", q_shape,
        [](const CallShape &c) {
            const Extents e(c);
            return CallWork{e.attend(), e.f * (e.scores() + e.B * e.Sk * e.H + e.B * e.Sq * e.H)};
        },
        [](const VariantInfo &v, const Config &c, const CallInputs &in, MutableTensor out) {
            weighted_sum(v, c, in.probs, in.v, out);
        },
        [](const CallShape &c, const CallInputs &in, auto t) {
            using T = decltype(t);
            return reference::weighted_sum(c.config, sizes(c), operand<T>(c, in.probs, c.s_k),
                                           operand<T>(c, in.v, c.config.hidden_size));
        });
}
}  // namespace

void attention_core(const VariantInfo &variant, const Config &config, ConstTensor q, ConstTensor k, ConstTensor v,
                    MaskTensor key_padding_mask, ConstTensor bias, MutableTensor ctx) {
    detail::runnable_functions(variant);
    const int64_t hidden = config.hidden_size, heads = config.num_heads;
    const auto [qs, s_k] = check_queries_and_keys(config, q, k);
    check_tensor("v", v, {qs[0], s_k, hidden}, "[B, S_k, H]");
    check_tensor("ctx", ctx, {qs[0], qs[1], hidden}, "[B, S_q, H]");
    if (overlaps(ctx, q) || overlaps(ctx, k) || overlaps(ctx, v) || overlaps(ctx, bias) ||
        overlaps(ctx, key_padding_mask)) {
        throw Error("ctx", "must not overlap an input buffer");
    }
    pipeline::prepare_halide(variant);
    const halide_device_interface_t *gpu = detail::device_interface(variant.device);
    pipeline::MaskInput mask = pipeline::mask_input(key_padding_mask, qs[0], s_k, gpu);
    pipeline::BiasInput b = pipeline::bias_input(bias, qs[0], heads, qs[1], s_k, gpu);
    auto q_buffer = halide_view(q), k_buffer = halide_view(k), v_buffer = halide_view(v);
    auto ctx_buffer = pipeline::head_view(ctx, heads);
    pipeline::Call call(stage_function(variant, config, "attention_core"), variant, pipeline::extents(qs[0], qs[1], s_k, heads, hidden));
    call.input("q", q_buffer, q.memory).input("k", k_buffer, k.memory).input("v", v_buffer, v.memory);
    call.input("bias", b).input("key_padding_mask", mask);
    call.scalar("causal", config.causal).scalar("heads", int32_t(heads)).output("ctx", ctx_buffer, ctx.memory).run();
}

namespace {
FunctionCall attention_core_call(Precision precision) {
    return one_output_stage(
        precision, "ctx", q_shape,
        [](const CallShape &c) {
            const Extents e(c);
            return CallWork{2 * e.attend(), e.f * (2 * e.B * e.Sq * e.H + 2 * e.B * e.Sk * e.H)};
        },
        [](const VariantInfo &v, const Config &c, const CallInputs &in, MutableTensor out) {
            attention_core(v, c, in.q, in.k, in.v, in.key_padding_mask, in.bias, out);
        },
        [](const CallShape &c, const CallInputs &in, auto t) {
            using T = decltype(t);
            return reference::attention_core(c.config, sizes(c), widen<T>(in.q), widen<T>(in.k), widen<T>(in.v),
                                             in.key_padding_mask, in.bias);
        },
        [](const CallShape &c, const CallInputs &in) {
            return reference::core_allowance(c.config, sizes(c), in.q, in.k, in.v, in.key_padding_mask, in.bias);
        });
}
}  // namespace

void output_layernorm(const VariantInfo &variant, const Config &config, ConstTensor ctx, ConstTensor x,
                      const LayerWeights &weights, MutableTensor y) {
    detail::runnable_functions(variant);
    check_config(config);
    check_weights(config, weights, false, true);
    const int64_t hidden = config.hidden_size;
    const Shape &xs = check_rank("x", x, 3, "[B, S, H]");
    const Shape shape{xs[0], xs[1], hidden};
    check_tensor("x", x, shape, "[B, S, H]");
    check_tensor("ctx", ctx, shape, "[B, S, H]");
    check_tensor("y", y, shape, "[B, S, H]");
    auto ctx_buffer = halide_view(ctx), x_buffer = halide_view(x);
    auto y_buffer = halide_view(y);
    pipeline::WeightBuffers w(weights, false, true);
    pipeline::Call call(stage_function(variant, config, "output_layernorm"), variant, pipeline::extents(xs[0], xs[1], xs[1], config.num_heads, hidden));
    call.input("ctx", ctx_buffer, ctx.memory).input("x", x_buffer, x.memory).weights(w, false);
    call.scalar("eps", config.layer_norm_eps).output("y", y_buffer, y.memory).run();
}

namespace {
FunctionCall output_layernorm_call(Precision precision) {
    return one_output_stage(
        precision, "y", q_shape,
        [](const CallShape &c) {
            const Extents e(c);
            return CallWork{2 * e.B * e.Sq * e.H * e.H, e.f * (3 * e.B * e.Sq * e.H + e.H * e.H)};
        },
        [](const VariantInfo &v, const Config &c, const CallInputs &in, MutableTensor out) {
            output_layernorm(v, c, in.ctx, in.x, in.weights, out);
        },
        [](const CallShape &c, const CallInputs &in, auto t) {
            using T = decltype(t);
            std::vector<std::vector<float>> rounded;
            return reference::output_layernorm(c.config, sizes(c), operand<T>(c, in.ctx, c.config.hidden_size),
                                               widen<T>(in.x), reference::gemm_weights(c.config, in.weights, rounded));
        });
}
}  // namespace

}  // namespace attn::stages

namespace attn::detail {

const FunctionCall &function_call(const std::string &function) {
    // Every manifest function: the stages' entries above, the fused layer's in attention.cpp and packed.cpp.
    static const std::map<std::string, FunctionCall> table{
        {"qkv_projection", stages::qkv_projection_call(Precision::fp32)},
        {"qkv_projection_bf16", stages::qkv_projection_call(Precision::bf16)},
        {"attention_scores", stages::attention_scores_call(Precision::fp32)},
        {"attention_scores_bf16", stages::attention_scores_call(Precision::bf16)},
        {"masked_softmax", stages::masked_softmax_call()},
        {"weighted_sum", stages::weighted_sum_call(Precision::fp32)},
        {"weighted_sum_bf16", stages::weighted_sum_call(Precision::bf16)},
        {"attention_core", stages::attention_core_call(Precision::fp32)},
        {"attention_core_bf16", stages::attention_core_call(Precision::bf16)},
        {"output_layernorm", stages::output_layernorm_call(Precision::fp32)},
        {"output_layernorm_bf16", stages::output_layernorm_call(Precision::bf16)},
        {"attention_layer", layer_call(false)},
        {"attention_layer_bf16", layer_call(false, Precision::bf16)},
        {"attention_layer_int8", layer_call(false, Precision::int8)},
        {"attention_layer_probs", layer_call(true)},
        {"attention_layer_packed", packed_layer_call(false)},
        {"attention_layer_packed_bf16", packed_layer_call(false, Precision::bf16)},
        {"attention_layer_packed_int8", packed_layer_call(false, Precision::int8)},
        {"attention_layer_packed_probs", packed_layer_call(true)},
    };
    const auto found = table.find(function);
    if (found == table.end()) throw Error("function", "no by-name call of '" + function + "' (runtime/src/stages.cpp)");
    return found->second;
}

bool has_function_call(const std::string &function) {
    try {
        function_call(function);
        return true;
    } catch (const Error &) {
        return false;
    }
}

}  // namespace attn::detail
