#include "function_check.h"

#include <functional>
#include <map>

namespace attn::testing {
namespace {

// What a check needs of its problem: the seeded data, its reference, and views.
struct Call {
    const VariantInfo &variant;
    const Problem &problem;
    const LayerData data;
    const ReferenceRun &ref;
    reference::Sizes sizes;

    Call(const VariantInfo &v, const Problem &p)
        : variant(v), problem(p), data(p), ref(reference_run(data)), sizes{p.batch, p.s_q, p.s_k} {}
    Config config() const { return problem.config(); }
    Shape q_shape() const { return {problem.batch, problem.s_q, problem.hidden}; }
    Shape kv_shape() const { return {problem.batch, problem.s_k, problem.hidden}; }
    Shape score_shape() const { return {problem.batch, problem.heads, problem.s_q, problem.s_k}; }
    static ConstTensor view_of(const std::vector<float> &v, Shape shape) {
        return {v.data(), v.size(), std::move(shape)};
    }
    static std::vector<double> to_double(const std::vector<float> &v) { return {v.begin(), v.end()}; }
};

void qkv_projection(const Call &c) {
    const AttentionInputs in = c.data.inputs();
    const ConstTensor x_kv = c.problem.cross ? in.kv : in.x;
    const LayerWeights w = c.data.weights();
    GuardedOutput q(c.q_shape()), k(c.kv_shape()), v(c.kv_shape());
    ATTN_RUN_OR_REFUSE(c.variant, "qkv_projection",
                       stages::qkv_projection(c.variant, c.config(), in.x, x_kv, w, q.view(), k.view(), v.view()));
    const int64_t rows_q = c.sizes.batch * c.sizes.s_q, rows_k = c.sizes.batch * c.sizes.s_k;
    const std::vector<double> x = reference::widen<double>(in.x), kv = reference::widen<double>(x_kv);
    const std::vector<float> xf = reference::widen<float>(in.x), kvf = reference::widen<float>(x_kv);
    expect_matches_reference("q", q, reference::linear(x, rows_q, w.w_q, w.b_q),
                             reference::linear(xf, rows_q, w.w_q, w.b_q));
    expect_matches_reference("k", k, reference::linear(kv, rows_k, w.w_k, w.b_k),
                             reference::linear(kvf, rows_k, w.w_k, w.b_k));
    expect_matches_reference("v", v, reference::linear(kv, rows_k, w.w_v, w.b_v),
                             reference::linear(kvf, rows_k, w.w_v, w.b_v));
}

void attention_scores(const Call &c) {
    const std::vector<float> &q = c.ref.float32.q, &k = c.ref.float32.k;
    const ConstTensor bias = c.data.inputs().bias;
    GuardedOutput scores(c.score_shape());
    ATTN_RUN_OR_REFUSE(c.variant, "attention_scores",
                       stages::attention_scores(c.variant, c.config(), c.view_of(q, c.q_shape()),
                                                c.view_of(k, c.kv_shape()), bias, scores.view()));
    expect_matches_reference("scores", scores,
                             reference::attention_scores(c.config(), c.sizes, c.to_double(q), c.to_double(k), bias),
                             reference::attention_scores(c.config(), c.sizes, q, k, bias));
}

void masked_softmax(const Call &c) {
    const std::vector<float> &scores = c.ref.float32.scores;
    const MaskTensor mask = c.data.inputs().key_padding_mask;
    GuardedOutput probs(c.score_shape());
    ATTN_RUN_OR_REFUSE(
        c.variant, "masked_softmax",
        stages::masked_softmax(c.variant, c.config(), c.view_of(scores, c.score_shape()), mask, probs.view()));
    expect_matches_reference("probs", probs,
                             reference::masked_softmax(c.config(), c.sizes, c.to_double(scores), mask),
                             reference::masked_softmax(c.config(), c.sizes, scores, mask));
}

void weighted_sum(const Call &c) {
    const std::vector<float> &probs = c.ref.float32.probs, &v = c.ref.float32.v;
    GuardedOutput ctx(c.q_shape());
    ATTN_RUN_OR_REFUSE(c.variant, "weighted_sum",
                       stages::weighted_sum(c.variant, c.config(), c.view_of(probs, c.score_shape()),
                                            c.view_of(v, c.kv_shape()), ctx.view()));
    expect_matches_reference("ctx", ctx,
                             reference::weighted_sum(c.config(), c.sizes, c.to_double(probs), c.to_double(v)),
                             reference::weighted_sum(c.config(), c.sizes, probs, v));
}

// The three stages above in one pass (the flash core), from the same q, k and v, with the
// problem's mask, bias and causality.
void attention_core(const Call &c) {
    const std::vector<float> &q = c.ref.float32.q, &k = c.ref.float32.k, &v = c.ref.float32.v;
    const AttentionInputs in = c.data.inputs();
    GuardedOutput ctx(c.q_shape());
    ATTN_RUN_OR_REFUSE(c.variant, "attention_core",
                       stages::attention_core(c.variant, c.config(), c.view_of(q, c.q_shape()),
                                              c.view_of(k, c.kv_shape()), c.view_of(v, c.kv_shape()),
                                              in.key_padding_mask, in.bias, ctx.view()));
    expect_matches_reference("ctx", ctx,
                             reference::attention_core(c.config(), c.sizes, c.to_double(q), c.to_double(k),
                                                       c.to_double(v), in.key_padding_mask, in.bias),
                             reference::attention_core(c.config(), c.sizes, q, k, v, in.key_padding_mask, in.bias));
}

void output_layernorm(const Call &c) {
    const std::vector<float> &ctx = c.ref.float32.ctx;
    const AttentionInputs in = c.data.inputs();
    GuardedOutput y(c.q_shape());
    ATTN_RUN_OR_REFUSE(c.variant, "output_layernorm",
                       stages::output_layernorm(c.variant, c.config(), c.view_of(ctx, c.q_shape()), in.x,
                                                c.data.weights(), y.view()));
    expect_matches_reference("y", y,
                             reference::output_layernorm(c.config(), c.sizes, c.to_double(ctx),
                                                         reference::widen<double>(in.x), c.data.weights()),
                             reference::output_layernorm(c.config(), c.sizes, ctx, reference::widen<float>(in.x),
                                                         c.data.weights()));
}

void attention_layer(const Call &c, bool with_probs) {
    Attention layer(c.config(), c.data.weights(), c.variant.name);
    GuardedOutput y(c.q_shape()), probs(c.score_shape());
    auto run = [&] { layer.forward(c.data.inputs(), y.view(), with_probs ? probs.view() : MutableTensor{}); };
    if (!ran_or_refused(c.variant, layer_function(with_probs), run)) {
        EXPECT_TRUE(y.guards_intact() && probs.guards_intact()) << "a refused call wrote outside its outputs";
        return;
    }
    expect_matches_reference("y", y, c.ref.exact.y, c.ref.float32.y);
    if (with_probs) expect_matches_reference("probs", probs, c.ref.exact.probs, c.ref.float32.probs);
}

void attention_layer_packed(const Call &c, bool with_probs) {
    const PackedBatch packed = c.data.packed();
    PackedInputs in = packed.inputs();
    const Problem &p = c.problem;
    if (p.bias) in.bias = c.view_of(c.data.bias, {p.heads, p.s_q, p.s_k});  // [1, heads, S, S] as [heads, S, S]
    const PackedReferenceRun &ref = packed_reference_run(p.name() + "_varlen", c.config(), c.data.weights(), in);
    Attention layer(c.config(), c.data.weights(), c.variant.name);
    GuardedOutput y({packed.tokens(), p.hidden});
    GuardedOutput probs({packed_probs_size(in.sequence_offsets, p.heads)});
    auto run = [&] { layer.forward_packed(in, y.view(), with_probs ? probs.view() : MutableTensor{}); };
    const std::string function = with_probs ? "attention_layer_packed_probs" : "attention_layer_packed";
    if (!ran_or_refused(c.variant, function, run)) {
        EXPECT_TRUE(y.guards_intact() && probs.guards_intact()) << "a refused call wrote outside its outputs";
        return;
    }
    expect_matches_reference("y", y, ref.exact.y, ref.float32.y);
    if (with_probs) expect_matches_reference("probs", probs, ref.exact.probs, ref.float32.probs);
}

// Every manifest function's check (Manifest.EveryFunctionHasATestCheck holds this table to the manifest).
const std::map<std::string, std::function<void(const Call &)>> &checks() {
    static const std::map<std::string, std::function<void(const Call &)>> table{
        {"qkv_projection", qkv_projection},
        {"attention_scores", attention_scores},
        {"masked_softmax", masked_softmax},
        {"weighted_sum", weighted_sum},
        {"attention_core", attention_core},
        {"output_layernorm", output_layernorm},
        {"attention_layer", [](const Call &c) { attention_layer(c, false); }},
        {"attention_layer_probs", [](const Call &c) { attention_layer(c, true); }},
        {"attention_layer_packed", [](const Call &c) { attention_layer_packed(c, false); }},
        {"attention_layer_packed_probs", [](const Call &c) { attention_layer_packed(c, true); }},
    };
    return table;
}

}  // namespace

bool function_applies(const std::string &function, const Problem &problem) {
    const bool packed = function.rfind("attention_layer_packed", 0) == 0;
    return !(packed && problem.cross);
}

bool has_function_check(const std::string &function) { return checks().count(function) > 0; }

void check_function(const VariantInfo &variant, const std::string &function, const Problem &problem) {
    const auto check = checks().find(function);
    if (check == checks().end()) {
        ADD_FAILURE() << "no test check for manifest function " << function << " (tests/support/function_check.cpp)";
        return;
    }
    check->second(Call(variant, problem));
}

}  // namespace attn::testing
