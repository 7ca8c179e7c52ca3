// attn::Attention over a padded batch: validate, bind the weights (prepared once: in panels
// on a CPU, transposed and uploaded for a GPU variant; rounded or quantized in bf16 and int8),
// call the fused layer. Packed batches: packed.cpp; the stages: stages.cpp.
#include "attn/attention.h"
#include "attn/function_calls.h"
#include "attn/generated/manifest.h"
#include "attn/internal.h"

#include "pipeline_call.h"
#include "validation.h"

#include <algorithm>

namespace attn {

using namespace validation;

namespace detail {
std::size_t host_to_device_copies() { return pipeline::uploads.load(); }
}  // namespace detail

void synchronize(const VariantInfo &variant) {
    const halide_device_interface_t *gpu = detail::device_interface(variant.device);
    if (!gpu) return;
    detail::runnable_functions(variant);  // a variant that cannot run here has nothing queued
    pipeline::prepare_halide(variant);
    pipeline::check_halide(halide_device_sync_global(nullptr, gpu), "halide", "synchronizing " + variant.name);
}

namespace {

// The variant of a bf16 or int8 layer (attn::Attention's constructor says which).
const VariantInfo &reduced_variant(const Config &config, const std::string &name, const std::string &stage) {
    const ReducedPrecision &p = reduced_precision(config.precision);
    const std::string precision = p.name;
    const std::string allow = "set config.allow_storage_only to " + std::string(p.without_feature);
    if (!name.empty()) {
        const VariantInfo &v = select_variant(name);  // a registered candidate's too (attn_bench --candidate)
        if (!v.provides(p.layer))
            throw Error("variant", "'" + name + "' has no " + precision + " layer (precision " + precision +
                                       "): it does not provide " + p.layer + " and does not provide " + p.packed_layer +
                                       "; the variants that do: " + variants_providing(p.layer, p));
        check_computes_natively(v, config);
        return v;
    }
    const VariantInfo *native = nullptr, *without = nullptr;
    std::string missing;
    const std::string function = stage.empty() ? p.layer : stage + "_" + p.name;
    if (std::none_of(std::begin(manifest::kFunctions), std::end(manifest::kFunctions),
                     [&](const manifest::Function &f) { return function == f.name; }))
        throw Error("precision", stage + " has no " + precision + " twin (" + function + " is no function of "
                                     "manifest.json): " + precision + " is a precision of the whole layer there");
    for (const VariantInfo *v : precision_variants(p.precision)) {
        if (!v->provides(function)) continue;
        if (v->runnable) {
            (computes_natively(*v, p.precision) ? native : without) = v;  // the last: of the widest ISA
        } else if (computes_natively(*v, p.precision)) {
            missing = " (" + v->name + ": " + v->not_runnable_reason + ")";
        }
    }
    if (native) return *native;
    if (without && config.allow_storage_only) return *without;
    throw Error("precision", precision + " needs the CPU feature " + p.cpu_feature + " to compute in " + precision +
                                 ", and no " + precision + " variant that does can run here" + missing + "; " +
                                 (without ? allow + " (" + without->name + ")"
                                          : "the variants with " + precision + ": " + variants_providing(function, p)));
}

}  // namespace

const VariantInfo &select_variant(const Config &config, const std::string &name, const std::string &stage) {
    check_config(config, true);
    return config.precision == Precision::fp32 ? select_variant(name) : reduced_variant(config, name, stage);
}

Attention::Attention(Config config, LayerWeights weights, const std::string &variant)
    : config_(config), weights_(weights), variant_(nullptr) {
    check_config(config_, true);
    check_weights(config_, weights_, true, true);
    if (config_.precision != Precision::fp32) {
        variant_ = &select_variant(config_, variant);
        reduced_weights_ = std::make_shared<detail::ReducedWeights>(weights_, *variant_, config_.precision);
        return;
    }
    variant_ = &select_variant(variant);
    by_shape_class_ = variant.empty();  // the default and the class picks are CPU variants
    prepared_weights_ = std::make_shared<detail::PreparedWeights>(
        weights_, *variant_, by_shape_class_ ? detail::default_class_picks() : std::vector<const VariantInfo *>());
}

const VariantInfo &Attention::variant_for(int64_t s_q, int64_t s_k) const {
    return by_shape_class_ ? default_variant_for(std::max(s_q, s_k)) : *variant_;
}

void Attention::synchronize() const { attn::synchronize(*variant_); }

void Attention::forward(const AttentionInputs &in, MutableTensor y, MutableTensor probs) const {
    detail::runnable_functions(*variant_);  // a variant that cannot run here is refused first
    const int64_t hidden = config_.hidden_size, heads = config_.num_heads;
    const char *x_layout = "[B, S_q, H]";
    const Shape &x_shape = check_rank("x", in.x, 3, x_layout);
    const int64_t batch = x_shape[0], s_q = x_shape[1];
    check_tensor("x", in.x, {batch, s_q, hidden}, x_layout);
    const bool cross = !in.kv.empty();
    int64_t s_k = s_q;
    if (cross) {
        const char *kv_layout = "[B, S_k, H]";
        s_k = check_rank("kv", in.kv, 3, kv_layout)[1];
        check_tensor("kv", in.kv, {batch, s_k, hidden}, kv_layout);
    }
    check_tensor("y", y, {batch, s_q, hidden}, "[B, S_q, H]");
    const bool want_probs = !probs.empty();
    if (want_probs) {
        check_probs_precision(config_);
        check_tensor("probs", probs, {batch, heads, s_q, s_k}, "[B, heads, S_q, S_k]");
    }
    for (const ConstTensor *input : {&in.x, &in.kv, &in.bias}) {
        if (overlaps(y, *input)) throw Error("y", "must not overlap an input buffer");
        if (want_probs && overlaps(probs, *input)) throw Error("probs", "must not overlap an input buffer");
    }
    if (want_probs && overlaps(y, probs)) throw Error("probs", "must not overlap y");

    const VariantInfo &variant = variant_for(s_q, s_k);
    pipeline::prepare_halide(variant);
    const halide_device_interface_t *gpu = detail::device_interface(variant.device);
    detail::PreparedWeights *prepared = prepared_weights_.get();
    detail::PreparedWeights *uploaded = prepared && prepared->uploaded ? prepared : nullptr;
    pipeline::MaskInput mask =
        pipeline::mask_input(in.key_padding_mask, batch, s_k, gpu, uploaded ? &uploaded->ones : nullptr);
    pipeline::BiasInput bias =
        pipeline::bias_input(in.bias, batch, heads, s_q, s_k, gpu, uploaded ? &uploaded->zeros : nullptr);
    std::unique_ptr<pipeline::WeightBuffers> given;  // a bf16 or int8 layer's vectors
    pipeline::WeightBuffers &w =
        prepared ? prepared->weights_for(variant)
                 : *(given = std::make_unique<pipeline::WeightBuffers>(weights_, true, true));
    auto x = pipeline::halide_view(in.x);
    auto kv = cross ? pipeline::halide_view(in.kv) : x;
    auto y_buffer = pipeline::halide_view(y);
    Halide::Runtime::Buffer<float> probs_buffer;
    if (want_probs) probs_buffer = pipeline::halide_view(probs);
    pipeline::Call call(want_probs         ? "attention_layer_probs"
                        : reduced_weights_ ? reduced_precision(config_.precision).layer
                                           : "attention_layer",
                        variant, pipeline::extents(batch, s_q, s_k, heads, hidden));
    if (reduced_weights_) {
        call.weights(w, *reduced_weights_);
    } else {
        call.weights(w, uploaded != nullptr);
    }
    call.input("key_padding_mask", mask).input("bias", bias).input("x", x, in.x.memory);
    // Self-attention passes x as kv: the layer's one function takes both. The bf16 and int8
    // layers are told so (kv_is_x), and K and V read x's rounding or quantization, not kv's.
    if (cross) {
        call.input("kv", kv, in.kv.memory);
    } else {
        call.placed("kv", x.raw_buffer());
    }
    if (reduced_weights_ && !want_probs) call.scalar("kv_is_x", !cross);
    call.scalar("causal", config_.causal).scalar("heads", int32_t(heads)).scalar("eps", config_.layer_norm_eps);
    call.output("y", y_buffer, y.memory);
    if (want_probs) call.output("probs", probs_buffer, probs.memory);
    call.run();
}

detail::CallWork detail::layer_work(const CallShape &c) {
    const double B = double(c.batch), Sq = double(c.s_q), Sk = double(c.s_k), H = double(c.config.hidden_size);
    const double projections = 2 * B * (2 * Sq + 2 * Sk) * H * H, attend = 2 * 2 * B * Sq * Sk * H;
    return {projections + attend, 4 * (2 * B * Sq * H + 4 * H * H)};
}

// The fused layer's by-name call (attn/function_calls.h): through an Attention, made once
// (a GPU variant uploads its weights then).
detail::FunctionCall detail::layer_call(bool with_probs, Precision precision) {
    FunctionCall f;
    f.work = layer_work;
    f.outputs = [with_probs](const CallShape &c, const CallInputs &) {
        std::vector<CallOutput> out{{"y", {c.batch, c.s_q, c.config.hidden_size}}};
        if (with_probs) out.push_back({"probs", {c.batch, c.config.num_heads, c.s_q, c.s_k}});
        return out;
    };
    auto config_of = [precision](const CallShape &c) { return call_config(c, precision); };
    f.prepare = [with_probs, config_of](const VariantInfo &variant, const CallShape &c, const CallInputs &in,
                                        const std::vector<MutableTensor> &out) -> std::function<void()> {
        auto layer = std::make_shared<Attention>(config_of(c), in.weights, variant.name);
        const AttentionInputs inputs{in.x, in.kv, in.key_padding_mask, in.bias};
        return [layer, inputs, out, with_probs] {
            layer->forward(inputs, out[0], with_probs ? out[1] : MutableTensor{});
            layer->synchronize();
        };
    };
    f.reference = [with_probs, config_of](const CallShape &c, const CallInputs &in) {
        const AttentionInputs inputs{in.x, in.kv, in.key_padding_mask, in.bias};
        const Config config = config_of(c);
        auto exact = reference::attention_layer<double>(config, in.weights, inputs);
        auto float32 = reference::attention_layer<float>(config, in.weights, inputs);
        std::vector<double> allowance = reference::context_allowance(config, in.weights, inputs, exact, float32);
        CallReference r = layer_reference(std::move(exact), std::move(float32), with_probs);
        r.allowance[0] = std::move(allowance);
        return r;
    };
    return f;
}

}  // namespace attn
