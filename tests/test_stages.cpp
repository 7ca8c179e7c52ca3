// Each stage's own pipeline, of every variant, against the reference stage fed the
// same float32 inputs (the plain float32 layer's intermediates).
#include "support/variant_param.h"

#include <cmath>
#include <random>

namespace attn::testing {
namespace {

std::vector<Problem> stage_problems() {
    std::vector<Problem> problems;
    struct Size {
        int64_t batch, seq, hidden, heads;
    };
    for (const Size &s : {Size{1, 1, 64, 2}, Size{1, 97, 80, 2}, Size{3, 113, 160, 2}}) {
        for (int kind = 0; kind < 4; ++kind) {
            Problem p;
            p.batch = s.batch, p.s_q = p.s_k = s.seq, p.hidden = s.hidden, p.heads = s.heads;
            p.causal = kind == 1;
            p.mask = kind == 1 ? Mask::padding : kind == 3 ? Mask::empty_batch : Mask::none;
            p.bias = kind == 2;
            problems.push_back(p);
        }
    }
    Problem bert;  // BERT-base, B = 1, S = 128, padded
    bert.mask = Mask::padding;
    problems.push_back(bert);
    for (auto [s_q, s_k] : {std::pair<int64_t, int64_t>{7, 13}, {13, 7}}) {
        Problem p;
        p.batch = 2, p.s_q = s_q, p.s_k = s_k, p.hidden = 128, p.heads = 2, p.cross = true, p.causal = true;
        p.mask = Mask::padding;
        problems.push_back(p);
    }
    return problems;
}

class StageTest : public ::testing::TestWithParam<VariantProblem> {
protected:
    void SetUp() override {
        const auto &[variant, problem] = GetParam();
        ATTN_SKIP_IF_NOT_RUNNABLE(variant);
        data_ = std::make_unique<LayerData>(problem);
        ref_ = &reference_run(*data_);
        sizes_ = {problem.batch, problem.s_q, problem.s_k};
    }
    const VariantInfo &variant() const { return std::get<0>(GetParam()); }
    const Problem &problem() const { return std::get<1>(GetParam()); }
    Config config() const { return problem().config(); }
    static ConstTensor view_of(const std::vector<float> &v, Shape shape) {
        return {v.data(), v.size(), std::move(shape)};
    }
    Shape q_shape() const { return {problem().batch, problem().s_q, problem().hidden}; }
    Shape kv_shape() const { return {problem().batch, problem().s_k, problem().hidden}; }
    Shape score_shape() const { return {problem().batch, problem().heads, problem().s_q, problem().s_k}; }
    std::unique_ptr<LayerData> data_;
    const ReferenceRun *ref_ = nullptr;
    reference::Sizes sizes_;
};

TEST_P(StageTest, QkvProjection) {
    const AttentionInputs in = data_->inputs();
    const ConstTensor x_kv = problem().cross ? in.kv : in.x;
    const LayerWeights w = data_->weights();
    GuardedOutput q(q_shape()), k(kv_shape()), v(kv_shape());
    ATTN_RUN_OR_REFUSE(variant(), "qkv_projection",
                       stages::qkv_projection(variant(), config(), in.x, x_kv, w, q.view(), k.view(), v.view()));
    const int64_t rows_q = sizes_.batch * sizes_.s_q, rows_k = sizes_.batch * sizes_.s_k;
    const std::vector<double> x = reference::widen<double>(in.x), kv = reference::widen<double>(x_kv);
    const std::vector<float> xf = reference::widen<float>(in.x), kvf = reference::widen<float>(x_kv);
    expect_matches_reference("q", q, reference::linear(x, rows_q, w.w_q, w.b_q),
                             reference::linear(xf, rows_q, w.w_q, w.b_q));
    expect_matches_reference("k", k, reference::linear(kv, rows_k, w.w_k, w.b_k),
                             reference::linear(kvf, rows_k, w.w_k, w.b_k));
    expect_matches_reference("v", v, reference::linear(kv, rows_k, w.w_v, w.b_v),
                             reference::linear(kvf, rows_k, w.w_v, w.b_v));
}

TEST_P(StageTest, AttentionScores) {
    const std::vector<float> &q = ref_->float32.q, &k = ref_->float32.k;
    const ConstTensor bias = data_->inputs().bias;
    GuardedOutput scores(score_shape());
    ATTN_RUN_OR_REFUSE(variant(), "attention_scores",
                       stages::attention_scores(variant(), config(), view_of(q, q_shape()), view_of(k, kv_shape()),
                                                bias, scores.view()));
    const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end());
    expect_matches_reference("scores", scores, reference::attention_scores(config(), sizes_, qd, kd, bias),
                             reference::attention_scores(config(), sizes_, q, k, bias));
}

TEST_P(StageTest, MaskedSoftmax) {
    const std::vector<float> &scores = ref_->float32.scores;
    const MaskTensor mask = data_->inputs().key_padding_mask;
    GuardedOutput probs(score_shape());
    ATTN_RUN_OR_REFUSE(variant(), "masked_softmax",
                       stages::masked_softmax(variant(), config(), view_of(scores, score_shape()), mask, probs.view()));
    const std::vector<double> sd(scores.begin(), scores.end());
    expect_matches_reference("probs", probs, reference::masked_softmax(config(), sizes_, sd, mask),
                             reference::masked_softmax(config(), sizes_, scores, mask));
}

TEST_P(StageTest, WeightedSum) {
    const std::vector<float> &probs = ref_->float32.probs, &v = ref_->float32.v;
    GuardedOutput ctx(q_shape());
    ATTN_RUN_OR_REFUSE(
        variant(), "weighted_sum",
        stages::weighted_sum(variant(), config(), view_of(probs, score_shape()), view_of(v, kv_shape()), ctx.view()));
    const std::vector<double> pd(probs.begin(), probs.end()), vd(v.begin(), v.end());
    expect_matches_reference("ctx", ctx, reference::weighted_sum(config(), sizes_, pd, vd),
                             reference::weighted_sum(config(), sizes_, probs, v));
}

// The three stages above in one pass (the flash core), from the same q, k and v, with the
// problem's mask, bias and causality.
TEST_P(StageTest, AttentionCore) {
    const std::vector<float> &q = ref_->float32.q, &k = ref_->float32.k, &v = ref_->float32.v;
    const AttentionInputs in = data_->inputs();
    GuardedOutput ctx(q_shape());
    ATTN_RUN_OR_REFUSE(variant(), "attention_core",
                       stages::attention_core(variant(), config(), view_of(q, q_shape()), view_of(k, kv_shape()),
                                              view_of(v, kv_shape()), in.key_padding_mask, in.bias, ctx.view()));
    const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end());
    expect_matches_reference("ctx", ctx,
                             reference::attention_core(config(), sizes_, qd, kd, vd, in.key_padding_mask, in.bias),
                             reference::attention_core(config(), sizes_, q, k, v, in.key_padding_mask, in.bias));
}

TEST_P(StageTest, OutputLayerNorm) {
    const std::vector<float> &ctx = ref_->float32.ctx;
    const AttentionInputs in = data_->inputs();
    GuardedOutput y(q_shape());
    ATTN_RUN_OR_REFUSE(
        variant(), "output_layernorm",
        stages::output_layernorm(variant(), config(), view_of(ctx, q_shape()), in.x, data_->weights(), y.view()));
    const std::vector<double> cd(ctx.begin(), ctx.end());
    expect_matches_reference(
        "y", y, reference::output_layernorm(config(), sizes_, cd, reference::widen<double>(in.x), data_->weights()),
        reference::output_layernorm(config(), sizes_, ctx, reference::widen<float>(in.x), data_->weights()));
}

INSTANTIATE_TEST_SUITE_P(AllVariants, StageTest,
                         ::testing::Combine(::testing::ValuesIn(variants()), ::testing::ValuesIn(stage_problems())),
                         variant_problem_name);
// Each variant's declared min_shapes of a stage, at the smallest shape its own kernels run
// (every stage runs on it; the others may take the fallback there).
INSTANTIATE_TEST_SUITE_P(AtMinShapes, StageTest, ::testing::ValuesIn(min_shape_cases(false)), variant_problem_name);

// The softmax on hard scores: all very negative, huge magnitudes, ties at the max.
enum class Fill { all_negative, huge_magnitude, ties_at_max };
using VariantFill = std::tuple<VariantInfo, Fill>;

class SoftmaxFillTest : public ::testing::TestWithParam<VariantFill> {};

TEST_P(SoftmaxFillTest, MatchesReference) {
    const auto &[variant, fill] = GetParam();
    ATTN_SKIP_IF_NOT_RUNNABLE(variant);
    Problem p;
    p.batch = 2, p.s_q = p.s_k = 97, p.hidden = 80, p.heads = 2, p.causal = true, p.mask = Mask::padding;
    const LayerData data(p);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    std::vector<float> scores(std::size_t(p.batch * p.heads * p.s_q * p.s_k));
    for (std::size_t i = 0; i < scores.size(); ++i) {
        switch (fill) {
            case Fill::all_negative:
                scores[i] = -1000.0f - 50.0f * unit(rng);
                break;
            case Fill::huge_magnitude:
                scores[i] = (unit(rng) - 0.5f) * 2e4f;
                break;
            case Fill::ties_at_max:
                scores[i] = unit(rng) < 0.5f ? 3.0f : std::floor(3.0f * unit(rng));
                break;
        }
    }
    const Shape shape{p.batch, p.heads, p.s_q, p.s_k};
    GuardedOutput probs(shape);
    const MaskTensor mask = data.inputs().key_padding_mask;
    ATTN_RUN_OR_REFUSE(
        variant, "masked_softmax",
        stages::masked_softmax(variant, p.config(), {scores.data(), scores.size(), shape}, mask, probs.view()));
    const std::vector<double> sd(scores.begin(), scores.end());
    const reference::Sizes sizes{p.batch, p.s_q, p.s_k};
    expect_matches_reference("probs", probs, reference::masked_softmax(p.config(), sizes, sd, mask),
                             reference::masked_softmax(p.config(), sizes, scores, mask));
}

std::string variant_fill_name(const ::testing::TestParamInfo<VariantFill> &info) {
    static const char *const names[] = {"all_negative", "huge_magnitude", "ties_at_max"};
    return std::get<0>(info.param).name + "__" + names[int(std::get<1>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(AllVariants, SoftmaxFillTest,
                         ::testing::Combine(::testing::ValuesIn(variants()),
                                            ::testing::Values(Fill::all_negative, Fill::huge_magnitude,
                                                              Fill::ties_at_max)),
                         variant_fill_name);

}  // namespace
}  // namespace attn::testing
