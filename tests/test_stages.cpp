// Each stage's own pipeline, of every variant, against the reference stage fed the
// same float32 inputs (the plain float32 layer's intermediates).
#include "attn/generated/manifest.h"
#include "support/function_check.h"

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
    Problem odd;  // an odd head dimension (d = 5) and hidden size: the bf16 pairs' zero completions
    odd.batch = 2, odd.s_q = odd.s_k = 9, odd.hidden = 15, odd.heads = 3, odd.mask = Mask::padding;
    problems.push_back(odd);
    for (auto [s_q, s_k] : {std::pair<int64_t, int64_t>{7, 13}, {13, 7}}) {
        Problem p;
        p.batch = 2, p.s_q = s_q, p.s_k = s_k, p.hidden = 128, p.heads = 2, p.cross = true, p.causal = true;
        p.mask = Mask::padding;
        problems.push_back(p);
    }
    return problems;
}

// The stages' functions: every manifest function but the fused layer's.
std::vector<std::string> stage_functions() {
    std::vector<std::string> names;
    for (const manifest::Function &f : manifest::kFunctions) {
        if (!f.fused_layer) names.push_back(f.name);
    }
    return names;
}

using VariantFunctionProblem = std::tuple<VariantInfo, std::string, Problem>;

class StageTest : public ::testing::TestWithParam<VariantFunctionProblem> {};

TEST_P(StageTest, MatchesReference) {
    const auto &[variant, function, problem] = GetParam();
    ATTN_SKIP_IF_NOT_RUNNABLE(variant);
    check_function(variant, function, problem);
}

std::string stage_case_name(const ::testing::TestParamInfo<VariantFunctionProblem> &info) {
    return std::get<0>(info.param).name + "__" + std::get<1>(info.param) + "__" + std::get<2>(info.param).name();
}

INSTANTIATE_TEST_SUITE_P(AllVariants, StageTest,
                         ::testing::Combine(::testing::ValuesIn(tested_variants()), ::testing::ValuesIn(stage_functions()),
                                            ::testing::ValuesIn(stage_problems())),
                         stage_case_name);

// Each variant's declared min_shapes of a stage's function, at the smallest shape its own
// kernels run (a minimum declared too low fails here; below it, the matrix above runs the
// fallback).
std::vector<VariantFunctionProblem> stage_min_shape_cases() {
    std::vector<VariantFunctionProblem> cases;
    for (const auto &[variant, problem] : min_shape_cases(false)) {
        for (const auto &[function, extents] : variant.min_shapes) {
            if (function.rfind("attention_layer", 0) != 0) cases.emplace_back(variant, function, problem);
        }
    }
    return cases;
}
INSTANTIATE_TEST_SUITE_P(AtMinShapes, StageTest, ::testing::ValuesIn(stage_min_shape_cases()), stage_case_name);

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
                         ::testing::Combine(::testing::ValuesIn(tested_variants()),
                                            ::testing::Values(Fill::all_negative, Fill::huge_magnitude,
                                                              Fill::ties_at_max)),
                         variant_fill_name);

// The flash core's merge of a key block into its running state, on scores that make each
// block's max move: every 256 keys the bias rises or falls by 1000 (the old state or the
// block rescaled to 0), or by less than ln 2; or one key of each row reaches 5e9 and a later
// one 1e12, and a head's keys lie near -5e9 but one at -4e9 (an f32 offset rounded to a
// multiple of ln 2 may fall under such a max, and a weight above 1 overflows there); or they
// reach 2e30 and 3e30 (beyond 1e30 a block's offset is its max itself), and a head's keys all
// lie near -2e30. Cross attention, 8 queries over 1100 keys (a long problem): three key
// blocks of 512 for the hand-written CPU schedules, two of 1024 for autotuned_avx512_zen4's
// long class, 35 of 32 on a GPU.
enum class BlockMax { rising, falling, rising_by_little, falling_by_little, beyond_1e9, beyond_1e30 };
using VariantCoreCase = std::tuple<VariantInfo, std::string, BlockMax>;

class FlashCoreTest : public ::testing::TestWithParam<VariantCoreCase> {};

TEST_P(FlashCoreTest, MergesKeyBlocksWhoseMaxMoves) {
    const auto &[variant, function, block_max] = GetParam();
    ATTN_SKIP_IF_NOT_RUNNABLE(variant);
    Problem p;
    p.batch = 1, p.s_q = 8, p.s_k = 1100, p.hidden = 128, p.heads = 2, p.cross = true, p.bias = true;
    LayerData data(p);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> noise(-1.0f, 1.0f);
    for (int64_t h = 0; h < p.heads; ++h) {
        for (int64_t i = 0; i < p.s_q; ++i) {
            for (int64_t j = 0; j < p.s_k; ++j) {
                const float group = float(j / 256);
                float bias = noise(rng);
                switch (block_max) {
                    case BlockMax::rising: bias += 1000.0f * group; break;
                    case BlockMax::falling: bias -= 1000.0f * group; break;
                    case BlockMax::rising_by_little: bias += 0.6f * group; break;
                    case BlockMax::falling_by_little: bias -= 0.6f * group; break;
                    case BlockMax::beyond_1e9:
                        bias = h == 1 ? (j == 600 + i ? -4e9f : -5e9f) : j == 300 + i ? 5e9f : j == 800 + i ? 1e12f : bias;
                        break;
                    case BlockMax::beyond_1e30:
                        bias = h == 1 ? -2e30f : j == 300 + i ? 2e30f : j == 800 + i ? 3e30f : bias;
                        break;
                }
                data.bias[std::size_t((h * p.s_q + i) * p.s_k + j)] = bias;
            }
        }
    }
    const AttentionInputs layer = data.inputs();
    detail::CallInputs in;
    in.q = layer.x, in.k = in.v = layer.kv, in.bias = layer.bias;
    check_function_on(variant, function, {p.config(), p.batch, p.s_q, p.s_k}, in);
}

std::string variant_core_case_name(const ::testing::TestParamInfo<VariantCoreCase> &info) {
    static const char *const names[] = {"rising",      "falling",    "rising_by_little", "falling_by_little",
                                        "beyond_1e9", "beyond_1e30"};
    return std::get<0>(info.param).name + "__" + std::get<1>(info.param) + "__" + names[int(std::get<2>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(AllVariants, FlashCoreTest,
                         ::testing::Combine(::testing::ValuesIn(tested_variants()),
                                            ::testing::Values("attention_core", "attention_core_bf16"),
                                            ::testing::Values(BlockMax::rising, BlockMax::falling,
                                                              BlockMax::rising_by_little, BlockMax::falling_by_little,
                                                              BlockMax::beyond_1e9, BlockMax::beyond_1e30)),
                         variant_core_case_name);

}  // namespace

}  // namespace attn::testing
