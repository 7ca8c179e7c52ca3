#include "cases.h"

#include "attn/generated/manifest.h"
#include "attn/internal.h"
#include "openblas_peers.h"

#include <HalideBuffer.h>
#include <HalideRuntimeCuda.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <random>

namespace attn::bench {

using testing::LayerData;
using testing::ListedProblem;
using testing::Problem;

namespace {
detail::CallShape call_shape(const Problem &p) { return {p.config(), p.batch, p.s_q, p.s_k}; }

// At long contexts the S×S stages are not timed alone: each S×S stage buffer would be
// B·heads·S² floats (768 MiB at S=4096). The projections and the attention core ([B, S, H]
// in and out) are, so the fused layer's time splits into its projections and its core.
constexpr int64_t kLongestStageSeq = 384;
bool timed_at_every_length(const std::string &function) {
    return function == "qkv_projection" || function == "output_layernorm" || function == "attention_core";
}

}  // namespace

const std::vector<int64_t> &lengths_of(const Problem &p) {
    static std::mutex mutex;
    static std::map<std::string, std::vector<int64_t>> cache;
    std::lock_guard<std::mutex> lock(mutex);
    auto found = cache.find(p.name());
    if (found == cache.end()) found = cache.emplace(p.name(), LayerData(p).lengths()).first;
    return found->second;
}

Work work(const std::string &function, const Problem &p) {
    const detail::FunctionCall &call = detail::function_call(function);
    if (!p.packed) return call.work(call_shape(p));
    Work total;  // the real work: each sequence's, as a batch of one of its length
    for (int64_t length : lengths_of(p)) {
        const Work w = call.work({p.config(), 1, length, length});
        total.flops += w.flops, total.bytes += w.bytes;
    }
    return total;
}

Fixture::Fixture(const ListedProblem &lp) : data(lp.problem), reference_checked(lp.reference_checked) {
    const Problem &p = lp.problem;
    auto view = [](const std::vector<float> &v, Shape shape) { return ConstTensor{v.data(), v.size(), shape}; };
    const AttentionInputs layer = data.inputs();
    inputs.x = layer.x, inputs.key_padding_mask = layer.key_padding_mask, inputs.weights = data.weights();
    // The stages' [B, S, H] inputs are all x: only the time counts (the reference takes the same).
    inputs.q = inputs.k = inputs.v = inputs.ctx = layer.x;
    if (p.packed) {
        packed = data.packed();
        inputs.packed = packed.inputs();
    } else if (p.s_q <= kLongestStageSeq) {
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> score(-4.0f, 4.0f), prob(0.0f, 2.0f / float(p.s_k));
        scores.resize(std::size_t(p.batch * p.heads * p.s_q * p.s_k));
        for (float &s : scores) s = score(rng);
        probs.resize(scores.size());
        for (float &s : probs) s = prob(rng);
        const Shape sc{p.batch, p.heads, p.s_q, p.s_k};
        inputs.scores = view(scores, sc), inputs.probs = view(probs, sc);
    }
}

const detail::CallReference *Fixture::reference(const std::string &function) {
    if (!reference_checked) return nullptr;
    auto &slot = references[function];  // a Fixture is shared; cases are prepared one at a time
    if (!slot)
        slot = std::make_unique<detail::CallReference>(
            detail::function_call(function).reference(call_shape(data.problem), inputs));
    return slot.get();
}

namespace {
std::mutex fixtures_mutex;
std::map<std::string, std::unique_ptr<Fixture>> fixtures;
}  // namespace

Fixture &fixture(const ListedProblem &lp) {
    std::lock_guard<std::mutex> lock(fixtures_mutex);
    auto &slot = fixtures[lp.problem.name()];
    if (!slot) slot = std::make_unique<Fixture>(lp);
    return *slot;
}

void release_fixtures() {
    std::lock_guard<std::mutex> lock(fixtures_mutex);
    fixtures.clear();
}

std::string accuracy_error(Prepared &prepared, const float *actual, const std::vector<double> &exact,
                           const std::vector<float> &plain, const std::string &who,
                           const std::vector<double> &allowance) {
    if (exact.empty()) return "";
    const testing::Accuracy a = testing::check_accuracy(actual, exact, plain, allowance);
    prepared.max_error = std::max(prepared.max_error, a.max_error);
    return a.ok ? "" : a.report(who);
}

namespace {

// Where a case's tensors live. A CUDA variant is timed as a GPU user runs it: inputs
// copied to the device once, outputs left there, the device synchronized inside the
// timed call. Everything else reads and writes host memory.
class Placement {
public:
    explicit Placement(const VariantInfo &variant) : on_device_(variant.device == "cuda") {}

    // A read-only view of `host`, or of its copy on the device (one copy per host tensor).
    template <typename T>
    TensorView<const T> in(const TensorView<const T> &host) {
        if (!on_device_ || host.empty()) return host;
        return {reinterpret_cast<const T *>(upload(host.data, host.size)), host.size, host.shape, Memory::device};
    }
    // A view of `host` for an output, or of a device buffer that copy_outputs_to_host() copies into it.
    MutableTensor out(std::vector<float> &host, Shape shape) {
        if (!on_device_) return {host.data(), host.size(), std::move(shape)};
        auto *device = reinterpret_cast<float *>(upload(host.data(), host.size()));
        outputs_.push_back(placed_.back().second);
        return {device, host.size(), std::move(shape), Memory::device};
    }
    // Every input of a call placed so (the packed offsets stay on the host, as the API takes them).
    detail::CallInputs in(const detail::CallInputs &host) {
        detail::CallInputs d = host;
        for (ConstTensor detail::CallInputs::*t :
             {&detail::CallInputs::x, &detail::CallInputs::kv, &detail::CallInputs::q, &detail::CallInputs::k,
              &detail::CallInputs::v, &detail::CallInputs::scores, &detail::CallInputs::probs, &detail::CallInputs::ctx,
              &detail::CallInputs::bias}) {
            d.*t = in(host.*t);
        }
        d.key_padding_mask = in(host.key_padding_mask);
        for (ConstTensor LayerWeights::*w :
             {&LayerWeights::w_q, &LayerWeights::b_q, &LayerWeights::w_k, &LayerWeights::b_k, &LayerWeights::w_v,
              &LayerWeights::b_v, &LayerWeights::w_o, &LayerWeights::b_o, &LayerWeights::gamma, &LayerWeights::beta}) {
            d.weights.*w = in(host.weights.*w);
        }
        d.packed.x = in(host.packed.x);
        return d;
    }
    void copy_outputs_to_host() {
        for (halide_buffer_t *raw : outputs_) {
            raw->set_device_dirty(true);
            if (halide_copy_to_host(nullptr, raw) != 0) throw Error("bench", "copy to the host failed");
        }
    }

private:
    // Copies `size` elements at `host` to a new device buffer, kept until the Placement goes
    // (once per host address); its device address.
    template <typename T>
    uintptr_t upload(const T *host, std::size_t size) {
        const auto known = uploaded_.find(host);
        if (known != uploaded_.end()) return known->second;
        auto buffer = std::make_shared<Halide::Runtime::Buffer<const T>>(host, int(size));
        buffer->set_host_dirty();
        if (buffer->copy_to_device(halide_cuda_device_interface()) != 0)
            throw Error("bench", "copy to the device failed");
        placed_.push_back({buffer, buffer->raw_buffer()});
        return uploaded_[host] = static_cast<uintptr_t>(buffer->raw_buffer()->device);
    }

    bool on_device_;
    std::vector<std::pair<std::shared_ptr<void>, halide_buffer_t *>> placed_;  // each buffer, kept alive
    std::map<const void *, uintptr_t> uploaded_;
    std::vector<halide_buffer_t *> outputs_;
};

// Runs `prepared.run` once, turning a refusal into its error.
bool first_run(Prepared &prepared) {
    try {
        prepared.run();
        return true;
    } catch (const std::exception &e) {
        prepared.error = e.what();
        return false;
    }
}

// Why a variant's own kernels do not run `function` on the problem, or empty. Below its
// min_shapes it runs its fallback's kernels: timing those under its name would mislead.
std::string below_min_shapes(const VariantInfo &variant, const std::string &function, const Problem &p) {
    if (p.packed || variant.runs_own_kernels(function, p.extents())) return "";
    return "below " + variant.name + "'s min_shapes for " + function + " (manifest.json), where it runs " +
           variant.fallback + "'s kernels";
}

// The case of a manifest function (its by-name call, attn/function_calls.h) of a variant on a problem:
// made ready, run once and checked against the reference before it is timed.
Prepared function_case(const std::string &function, const VariantInfo &variant, const ListedProblem &lp) {
    Prepared prepared;
    if (!variant.runnable) return {{}, "cannot run here: " + variant.not_runnable_reason};
    if (std::string below = below_min_shapes(variant, function, lp.problem); !below.empty()) return {{}, below};
    Fixture &f = fixture(lp);
    const Problem &p = lp.problem;
    const detail::FunctionCall &call = detail::function_call(function);
    struct State {
        Placement place;
        std::vector<std::vector<float>> outputs;
    };
    auto s = std::make_shared<State>(State{Placement(variant), {}});
    const std::vector<detail::CallOutput> shapes = call.outputs(call_shape(p), f.inputs);
    std::vector<MutableTensor> views;
    s->outputs.reserve(shapes.size());
    for (const detail::CallOutput &o : shapes) {
        std::size_t elements = 1;
        for (int64_t d : o.shape) elements *= std::size_t(d);
        s->outputs.emplace_back(elements);
        views.push_back(s->place.out(s->outputs.back(), o.shape));
    }
    try {
        prepared.run = [s, run = call.prepare(variant, call_shape(p), s->place.in(f.inputs), views)] { run(); };
    } catch (const std::exception &e) {
        return {{}, e.what()};
    }
    if (!first_run(prepared)) return prepared;
    s->place.copy_outputs_to_host();
    if (const detail::CallReference *ref = f.reference(function)) {
        for (std::size_t i = 0; i < shapes.size() && prepared.error.empty(); ++i) {
            prepared.error = accuracy_error(prepared, s->outputs[i].data(), ref->exact[i], ref->float32[i],
                                            function + " " + shapes[i].name + " " + variant.name,
                                            i < ref->allowance.size() ? ref->allowance[i] : std::vector<double>());
        }
    }
    return prepared;
}

// Each sequence of a packed problem through forward as a batch of one of its length, one
// after another: what the packing is measured against.
Prepared per_sequence_layer(const VariantInfo &variant, const ListedProblem &lp) {
    Prepared prepared;
    if (!variant.runnable) return {{}, "cannot run here: " + variant.not_runnable_reason};
    Fixture &f = fixture(lp);
    const Problem &p = lp.problem;
    const int64_t tokens = f.packed.tokens(), H = p.hidden;
    struct State {
        Attention layer;
        Placement place;
        std::vector<float> y;
        ConstTensor x;
        MutableTensor y_view;
    };
    auto s = std::make_shared<State>(State{Attention(p.config(), f.data.weights(), variant.name),
                                           Placement(variant),
                                           std::vector<float>(f.packed.x.size()),
                                           {},
                                           {}});
    s->x = s->place.in(f.inputs.packed.x);
    s->y_view = s->place.out(s->y, {tokens, H});
    const std::vector<int32_t> &offsets = f.packed.sequence_offsets;
    prepared.run = [s, H, offsets] {
        for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
            const int64_t start = offsets[b], length = offsets[b + 1] - start;
            if (length == 0) continue;
            AttentionInputs one;
            one.x = {s->x.data + start * H, std::size_t(length * H), {1, length, H}, s->x.memory};
            s->layer.forward(one,
                             {s->y_view.data + start * H, std::size_t(length * H), {1, length, H}, s->y_view.memory});
        }
        s->layer.synchronize();
    };
    if (!first_run(prepared)) return prepared;
    s->place.copy_outputs_to_host();
    if (const detail::CallReference *ref = f.reference("attention_layer_packed")) {
        prepared.error = accuracy_error(prepared, s->y.data(), ref->exact[0], ref->float32[0], variant.name);
    }
    return prepared;
}

// The stages' functions (the manifest's functions of the other generators) are timed at
// short contexts, the projections at every one; the fused layer's (kLayerFunction) on every
// problem. Each fp32 stage, with its functions in a reduced precision (`<stage>_<precision>`),
// which are timed as `<variant>_<precision>` beside it, as the layer's are.
struct StageFunction {
    std::string name;
    std::vector<std::pair<std::string, std::string>> reduced;  // (function, precision)
};
std::vector<StageFunction> stage_functions() {
    std::vector<StageFunction> stages;
    for (const manifest::Function &f : manifest::kFunctions) {
        if (!f.fused_layer && std::string(f.precision) == "fp32") stages.push_back({f.name, {}});
    }
    for (const manifest::Function &f : manifest::kFunctions) {
        if (f.fused_layer || std::string(f.precision) == "fp32") continue;
        const std::string name = f.name, suffix = std::string("_") + f.precision;
        for (StageFunction &s : stages)
            if (s.name + suffix == name) s.reduced.emplace_back(name, f.precision);
    }
    return stages;
}

}  // namespace

std::vector<Case> all_cases(const std::vector<VariantInfo> &variant_list) {
    const std::pair<const char *, Gemms> stage_peers[] = {{"qkv_projection", Gemms::qkv_projection},
                                                          {"attention_scores", Gemms::attention_scores},
                                                          {"weighted_sum", Gemms::weighted_sum},
                                                          {"output_layernorm", Gemms::output_projection}};
    // OpenCL runs on the CPU here (PoCL): its variants are tested, not timed, but for the GPU
    // autotuner's candidates, which rehearse on it what a GPU machine will time.
    std::vector<const VariantInfo *> timed;
    for (const VariantInfo &v : variant_list) {
        if (v.device != "opencl" || v.schedule == "candidate") timed.push_back(&v);
    }
    std::vector<Case> cases;
    auto add = [&](const std::string &function, const std::string &impl, const ListedProblem &lp,
                   std::function<Prepared()> prepare) {
        cases.push_back({function + "/" + impl + "/" + lp.problem.name(), function, &lp, std::move(prepare)});
    };
    for (const ListedProblem &lp : testing::problem_list()) {
        if (lp.problem.packed) {
            // Packed (the peers run the padded batch), and each variant's dense B=1 calls, one
            // sequence at a time: per_sequence_<variant>.
            for (const VariantInfo *v : timed) {
                if (!v->provides(kLayerFunction)) continue;  // (an ISA built for reduced precisions only)
                add(kLayerFunction, v->name, lp, [v, &lp] { return function_case("attention_layer_packed", *v, lp); });
                add(kLayerFunction, "per_sequence_" + v->name, lp, [v, &lp] { return per_sequence_layer(*v, lp); });
            }
        } else {
            for (const VariantInfo *v : timed) {
                if (!v->provides(kLayerFunction)) continue;
                add(kLayerFunction, v->name, lp, [v, &lp] { return function_case(kLayerFunction, *v, lp); });
            }
        }
        // The layer in bf16 and int8 (attn::Precision), beside the fp32 variants and peers:
        // <variant>_bf16, <variant>_int8, a candidate's too (attn_bench --candidate).
        for (const ReducedPrecision &p : kReducedPrecisions) {
            const char *function = lp.problem.packed ? p.packed_layer : p.layer;
            for (const VariantInfo *v : timed) {
                if (!v->provides(function)) continue;
                add(kLayerFunction, v->name + "_" + p.name, lp,
                    [v, &lp, function] { return function_case(function, *v, lp); });
            }
        }
        if (lp.problem.packed) continue;
        add(kLayerFunction, "openblas_roofline", lp, [&lp] { return openblas_layer(true, lp); });
        add(kLayerFunction, "openblas_unfused", lp, [&lp] { return openblas_layer(false, lp); });
        const bool short_context = lp.problem.s_q <= kLongestStageSeq;
        for (const StageFunction &stage : stage_functions()) {
            const std::string &name = stage.name;
            if (!short_context && !timed_at_every_length(name)) continue;
            for (const VariantInfo *v : timed) {
                if (!v->provides(name)) continue;
                add(name, v->name, lp, [name, v, &lp] { return function_case(name, *v, lp); });
            }
            for (const auto &[function, precision] : stage.reduced) {
                for (const VariantInfo *v : timed) {
                    if (!v->provides(function)) continue;
                    add(name, v->name + "_" + precision, lp,
                        [function = function, v, &lp] { return function_case(function, *v, lp); });
                }
            }
        }
        for (const auto &[name, gemms] : stage_peers) {
            if (!short_context && !timed_at_every_length(name)) continue;
            add(name, "openblas_roofline", lp, [gemms = gemms, &lp] { return openblas_stage(gemms, lp); });
        }
    }
    return cases;
}

}  // namespace attn::bench
