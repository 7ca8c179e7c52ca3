#include "function_check.h"

#include <functional>
#include <map>
#include <memory>
#include <mutex>

namespace attn::testing {
namespace {

using detail::CallInputs;
using detail::CallOutput;
using detail::CallReference;
using detail::FunctionCall;

detail::CallShape call_shape(const Problem &p) { return {p.config(), p.batch, p.s_q, p.s_k}; }

// A problem's inputs for every function: its data, its real tokens packed, and (for the
// stages after the projections, computed once when first needed) the plain float32
// layer's intermediates as their inputs.
struct ProblemInputs {
    LayerData data;
    PackedBatch packed;
    CallInputs in;
    bool intermediates = false;

    // (The packed functions are self-attention only: a cross-attention problem packs nothing.)
    explicit ProblemInputs(const Problem &p) : data(p), packed(p.cross ? PackedBatch{} : data.packed()) {
        const AttentionInputs layer = data.inputs();
        in.x = layer.x, in.kv = layer.kv, in.key_padding_mask = layer.key_padding_mask, in.bias = layer.bias;
        in.weights = data.weights();
        in.packed = packed.inputs();
    }
    void add_intermediates() {
        if (intermediates) return;
        const Problem &p = data.problem;
        const ReferenceRun &ref = reference_run(data);
        auto view = [](const std::vector<float> &v, Shape shape) { return ConstTensor{v.data(), v.size(), shape}; };
        const Shape q{p.batch, p.s_q, p.hidden}, kv{p.batch, p.s_k, p.hidden}, s{p.batch, p.heads, p.s_q, p.s_k};
        in.q = view(ref.float32.q, q), in.k = view(ref.float32.k, kv), in.v = view(ref.float32.v, kv);
        in.scores = view(ref.float32.scores, s), in.probs = view(ref.float32.probs, s);
        in.ctx = view(ref.float32.ctx, q);
        intermediates = true;
    }
};

// Each problem's inputs and each (function, problem)'s reference, computed once per process.
const CallInputs &inputs_of(const Problem &p, bool with_intermediates) {
    static std::mutex mutex;
    static std::map<std::string, std::unique_ptr<ProblemInputs>> cache;
    std::lock_guard<std::mutex> lock(mutex);
    auto &slot = cache[p.name()];
    if (!slot) slot = std::make_unique<ProblemInputs>(p);
    if (with_intermediates) slot->add_intermediates();
    return slot->in;
}

const CallReference &reference_of(const std::string &function, const Problem &p, const CallInputs &in) {
    static std::mutex mutex;
    static std::map<std::string, std::unique_ptr<CallReference>> cache;
    std::lock_guard<std::mutex> lock(mutex);
    auto &slot = cache[function + " " + p.name()];
    if (!slot) slot = std::make_unique<CallReference>(detail::function_call(function).reference(call_shape(p), in));
    return *slot;
}

}  // namespace

bool function_applies(const std::string &function, const Problem &problem) {
    const bool packed = function.rfind("attention_layer_packed", 0) == 0;
    return !(packed && problem.cross);
}

namespace {
// Runs the call on `in` and checks its outputs against `reference` (called only if it ran).
void run_and_check(const VariantInfo &variant, const std::string &function, const detail::CallShape &shape,
                   const CallInputs &in, const std::function<const CallReference &()> &reference) {
    const FunctionCall &call = detail::function_call(function);
    std::vector<GuardedOutput> outputs;
    std::vector<MutableTensor> views;
    const std::vector<CallOutput> shapes = call.outputs(shape, in);
    outputs.reserve(shapes.size());
    for (const CallOutput &o : shapes) outputs.emplace_back(o.shape);
    for (GuardedOutput &o : outputs) views.push_back(o.view());
    auto run = [&] { call.prepare(variant, shape, in, views)(); };
    if (!ran_or_refused(variant, function, run)) {
        for (const GuardedOutput &o : outputs)
            EXPECT_TRUE(o.guards_intact()) << "a refused call wrote outside its outputs";
        return;
    }
    const CallReference &ref = reference();
    for (std::size_t i = 0; i < outputs.size(); ++i) {
        expect_matches_reference(shapes[i].name.c_str(), outputs[i], ref.exact[i], ref.float32[i],
                                 i < ref.allowance.size() ? ref.allowance[i] : std::vector<double>());
    }
}
}  // namespace

void check_function(const VariantInfo &variant, const std::string &function, const Problem &problem) {
    if (!detail::has_function_call(function)) {
        ADD_FAILURE() << "no by-name call of manifest function " << function << " (attn/function_calls.h)";
        return;
    }
    const CallInputs &in = inputs_of(problem, detail::function_call(function).reads_intermediates);
    run_and_check(variant, function, call_shape(problem), in,
                  [&]() -> const CallReference & { return reference_of(function, problem, in); });
}

void check_function_on(const VariantInfo &variant, const std::string &function, const detail::CallShape &shape,
                       const CallInputs &inputs) {
    CallReference ref;
    run_and_check(variant, function, shape, inputs, [&]() -> const CallReference & {
        return ref = detail::function_call(function).reference(shape, inputs);
    });
}

}  // namespace attn::testing
