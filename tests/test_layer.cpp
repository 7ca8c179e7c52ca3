// The fused layer (self- and cross-attention, with and without probabilities) of
// every variant against the double-precision reference.
#include "attn/internal.h"
#include "support/function_check.h"

#include <algorithm>
#include <set>

namespace attn::testing {
namespace {

std::vector<Problem> layer_problems() {
    std::vector<Problem> problems;
    struct Size {
        int64_t batch, seq, hidden, heads;
    };
    // head_dim 32, 40, 80, 64; S = 1 and S not a multiple of any tile.
    const Size sizes[] = {{1, 1, 64, 2}, {1, 97, 80, 2}, {3, 113, 160, 2}, {2, 128, 256, 4}};
    for (const Size &s : sizes) {
        auto add = [&](bool causal, Mask mask, bool bias) {
            Problem p;
            p.batch = s.batch, p.s_q = p.s_k = s.seq, p.hidden = s.hidden, p.heads = s.heads;
            p.causal = causal, p.mask = mask, p.bias = bias;
            problems.push_back(p);
        };
        add(false, Mask::none, false);
        add(false, Mask::padding, false);
        add(true, Mask::none, false);
        add(true, Mask::padding, false);
        add(false, Mask::none, true);
        add(false, Mask::one_real, false);
        add(false, Mask::empty_batch, false);
    }
    // Cross-attention, S_q != S_k both ways; causal with S_q > S_k leaves fully masked rows.
    auto cross = [&](int64_t s_q, int64_t s_k, bool causal, Mask mask, bool bias) {
        Problem p;
        p.batch = 2, p.s_q = s_q, p.s_k = s_k, p.hidden = 128, p.heads = 2, p.cross = true;
        p.causal = causal, p.mask = mask, p.bias = bias;
        problems.push_back(p);
    };
    cross(7, 13, false, Mask::padding, false);
    cross(13, 7, true, Mask::none, false);
    cross(13, 7, true, Mask::padding, false);
    cross(7, 13, true, Mask::none, true);
    cross(113, 97, false, Mask::empty_batch, true);
    return problems;
}

// The benchmarks' problem list (tests/support/problem.cpp), so every problem the
// comparison times is checked too. Long contexts are checked at hidden 64 with 2
// heads and S capped at 2048: the same blocks, masks and streaming over keys, at a
// cost the double reference can afford in every test run.
std::vector<Problem> listed_problems() {
    std::vector<Problem> problems;
    std::set<std::string> seen;
    for (const ListedProblem &listed : problem_list()) {
        if (listed.problem.packed) continue;  // test_packed.cpp
        Problem p = listed.problem;
        if (!listed.reference_checked) {
            p.hidden = 64, p.heads = 2;
            p.s_q = p.s_k = std::min<int64_t>(p.s_q, 2048);
        }
        if (seen.insert(p.name()).second) problems.push_back(p);
    }
    return problems;
}

// Long contexts (the flash core's key blocks, 512-528 keys on CPUs): lengths just
// under and over one and two blocks, causal cross-attention with S_q < S_k and
// S_q > S_k, one real token in a long padded sequence, a fully masked batch and padded
// batches at long S. Small heads (d = 16, 32) keep the double reference affordable.
std::vector<Problem> long_problems() {
    std::vector<Problem> problems;
    auto add = [&](int64_t batch, int64_t s_q, int64_t s_k, int64_t hidden, bool causal, Mask mask) {
        Problem p;
        p.batch = batch, p.s_q = s_q, p.s_k = s_k, p.hidden = hidden, p.heads = 2, p.cross = s_q != s_k;
        p.causal = causal, p.mask = mask;
        problems.push_back(p);
    };
    for (int64_t s : {511, 513, 529, 1025, 2047}) add(1, s, s, 32, false, Mask::none);
    add(1, 1057, 1057, 64, true, Mask::none);
    add(1, 1025, 2047, 32, true, Mask::none);
    add(1, 2047, 1025, 32, true, Mask::none);
    add(1, 2047, 2047, 32, false, Mask::one_real);
    add(2, 1025, 1025, 32, true, Mask::empty_batch);
    add(3, 1025, 1025, 64, false, Mask::padding);
    return problems;
}

class LayerTest : public ::testing::TestWithParam<VariantProblem> {
protected:
    void run_and_check(bool with_probs) {
        const auto &[variant, problem] = GetParam();
        check_function(variant, layer_function(with_probs), problem);
    }
};

TEST_P(LayerTest, MatchesReference) {
    ATTN_SKIP_IF_NOT_RUNNABLE(std::get<0>(GetParam()));
    run_and_check(false);
}

TEST_P(LayerTest, WithProbabilitiesMatchesReference) {
    ATTN_SKIP_IF_NOT_RUNNABLE(std::get<0>(GetParam()));
    run_and_check(true);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, LayerTest,
                         ::testing::Combine(::testing::ValuesIn(tested_variants()), ::testing::ValuesIn(layer_problems())),
                         variant_problem_name);
// Each variant's declared min_shapes of the layer, at the smallest shape its own kernels run.
INSTANTIATE_TEST_SUITE_P(AtMinShapes, LayerTest, ::testing::ValuesIn(min_shape_cases(true)), variant_problem_name);

using ListedProblemTest = LayerTest;

TEST_P(ListedProblemTest, MatchesReference) {
    ATTN_SKIP_IF_NOT_RUNNABLE(std::get<0>(GetParam()));
    run_and_check(false);
}

INSTANTIATE_TEST_SUITE_P(LongContext, ListedProblemTest,
                         ::testing::Combine(::testing::ValuesIn(tested_variants()), ::testing::ValuesIn(long_problems())),
                         variant_problem_name);

INSTANTIATE_TEST_SUITE_P(BenchmarkProblems, ListedProblemTest,
                         ::testing::Combine(::testing::ValuesIn(tested_variants()), ::testing::ValuesIn(listed_problems())),
                         variant_problem_name);

// bf16 (attn::Precision): each variant with a bf16 layer, on the layer's problems, the
// benchmarks' and an odd hidden size (H = 15, d = 5: the last pair of input features is
// completed by a zero weight), against the double reference of the same rounding (the
// weights, and every projection's input, rounded to bf16), under the accuracy rule with
// the float32 reference of that rounding; test_precision.cpp bounds it against fp32.
std::vector<Problem> reduced_precision_problems() {
    std::vector<Problem> problems = layer_problems();
    for (const Problem &p : listed_problems()) problems.push_back(p);
    Problem odd;
    odd.batch = 2, odd.s_q = odd.s_k = 9, odd.hidden = 15, odd.heads = 3, odd.mask = Mask::padding;
    problems.push_back(odd);
    return problems;
}

using Bf16LayerTest = LayerTest;

TEST_P(Bf16LayerTest, MatchesReference) {
    const auto &[variant, problem] = GetParam();
    ATTN_SKIP_IF_NOT_RUNNABLE(variant);
    check_function(variant, reduced_precision(Precision::bf16).layer, problem);
}

// (A build without bf16 variants, arm64's, instantiates none.)
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Bf16LayerTest);
INSTANTIATE_TEST_SUITE_P(Bf16Variants, Bf16LayerTest,
                         ::testing::Combine(::testing::ValuesIn(precision_variant_list(Precision::bf16)),
                                            ::testing::ValuesIn(reduced_precision_problems())),
                         variant_problem_name);

// int8 likewise (the odd hidden size's last quad of input features is completed by zero
// weights), against the double reference of the same quantization (the weights per output
// feature, every projection's input per token row), with the allowance for a context that
// quantizes to a neighbouring value (reference::context_allowance).
using Int8LayerTest = LayerTest;

TEST_P(Int8LayerTest, MatchesReference) {
    const auto &[variant, problem] = GetParam();
    ATTN_SKIP_IF_NOT_RUNNABLE(variant);
    check_function(variant, reduced_precision(Precision::int8).layer, problem);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Int8LayerTest);
INSTANTIATE_TEST_SUITE_P(Int8Variants, Int8LayerTest,
                         ::testing::Combine(::testing::ValuesIn(precision_variant_list(Precision::int8)),
                                            ::testing::ValuesIn(reduced_precision_problems())),
                         variant_problem_name);

}  // namespace
}  // namespace attn::testing
