// Packed variable-length sequences (DESIGN.md): every variant's forward_packed against the
// double reference, which runs each sequence through the dense reference; the padded
// batch through forward_unpadded against the dense path; packing and unpacking; and each
// malformed call's error.
#include "support/variant_param.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace attn::testing {
namespace {

// Sequence lengths, their shapes and options.
struct PackedCase {
    const char *name;
    std::vector<int64_t> lengths;
    int64_t hidden = 64, heads = 2;
    bool causal = false;
    int64_t bias_side = 0;  // > 0: a bias [heads, bias_side, bias_side]
    bool shared_bias = false;  // the bias is [1, side, side]

    int64_t tokens() const { return std::accumulate(lengths.begin(), lengths.end(), int64_t(0)); }
    int64_t longest() const { return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end()); }
};

void PrintTo(const PackedCase &c, std::ostream *os) { *os << c.name; }

// 0 and 1 tokens; lengths straddling the CPU's query blocks (64) and the key chunks (16
// to 48 keys) and the GPU's blocks (32); all equal; one long among many short (its
// query blocks past the short ones' end are skipped, its keys span several key blocks at
// 529 > 512); causal; a bias per head and a shared one larger than the longest sequence.
std::vector<PackedCase> packed_cases() {
    std::vector<PackedCase> cases{
        {"empty_and_single", {0, 1, 5, 0}},
        {"straddling", {63, 64, 65, 1, 129, 31, 33}},
        {"all_equal", {40, 40, 40}},
        {"one_long_many_short", {529, 3, 5, 7, 2, 9, 1, 17}},
        {"one_sequence", {97}},
        {"causal", {63, 1, 130, 0, 18}},
        {"head_dim_64", {70, 12, 33}, 128, 2},
        {"bias_per_head", {20, 45, 7}},
        {"shared_bias_larger", {20, 45, 7}},
        {"causal_bias", {66, 3, 31}},
    };
    for (PackedCase &c : cases) {
        const std::string name = c.name;
        c.causal = name.find("causal") != std::string::npos;
        if (name.find("bias") != std::string::npos) c.bias_side = c.longest() + (name == "shared_bias_larger" ? 9 : 0);
        c.shared_bias = name == "shared_bias_larger";
    }
    return cases;
}

// Seeded data: the weights of a LayerData of the same width, token rows and a bias.
struct PackedData {
    PackedCase c;
    LayerData layer;
    std::vector<float> x, bias;
    std::vector<int32_t> offsets{0};

    explicit PackedData(const PackedCase &pc) : c(pc), layer(problem(pc)) {
        std::mt19937 rng(99);
        std::uniform_real_distribution<float> value(-1.0f, 1.0f), bias_value(-2.0f, 2.0f);
        x.resize(std::size_t(c.tokens() * c.hidden));
        for (float &v : x) v = value(rng);
        for (int64_t length : c.lengths) offsets.push_back(offsets.back() + int32_t(length));
        const int64_t bias_heads = c.shared_bias ? 1 : c.heads;
        bias.resize(std::size_t(bias_heads * c.bias_side * c.bias_side));
        for (float &v : bias) v = bias_value(rng);
    }
    static Problem problem(const PackedCase &c) {
        Problem p;
        p.batch = 1, p.s_q = p.s_k = 1, p.hidden = c.hidden, p.heads = c.heads, p.causal = c.causal;
        return p;
    }
    Config config() const { return layer.problem.config(); }
    PackedInputs inputs() const {
        PackedInputs in;
        in.x = {x.data(), x.size(), {c.tokens(), c.hidden}};
        in.sequence_offsets = {offsets.data(), offsets.size(), {int64_t(offsets.size())}};
        if (c.bias_side > 0) in.bias = {bias.data(), bias.size(), {c.shared_bias ? 1 : c.heads, c.bias_side, c.bias_side}};
        return in;
    }
    int64_t probs_size() const { return packed_probs_size(inputs().sequence_offsets, c.heads); }
};

using VariantPacked = std::tuple<VariantInfo, PackedCase>;

class PackedTest : public ::testing::TestWithParam<VariantPacked> {
protected:
    void run_and_check(bool with_probs) {
        const auto &[variant, c] = GetParam();
        const PackedData data(c);
        const PackedInputs in = data.inputs();
        const PackedReferenceRun &ref = packed_reference_run(c.name, data.config(), data.layer.weights(), in);
        Attention layer(data.config(), data.layer.weights(), variant.name);
        GuardedOutput y({c.tokens(), c.hidden});
        GuardedOutput probs({data.probs_size()});
        auto run = [&] { layer.forward_packed(in, y.view(), with_probs ? probs.view() : MutableTensor{}); };
        const std::string function = with_probs ? "attention_layer_packed_probs" : "attention_layer_packed";
        if (!ran_or_refused(variant, function, run)) {
            EXPECT_TRUE(y.guards_intact() && probs.guards_intact()) << "a refused call wrote outside its outputs";
            return;
        }
        expect_matches_reference("y", y, ref.exact.y, ref.float32.y);
        if (with_probs) expect_matches_reference("probs", probs, ref.exact.probs, ref.float32.probs);
    }
};

TEST_P(PackedTest, MatchesReference) {
    ATTN_SKIP_IF_NOT_RUNNABLE(std::get<0>(GetParam()));
    run_and_check(false);
}

TEST_P(PackedTest, WithProbabilitiesMatchesReference) {
    ATTN_SKIP_IF_NOT_RUNNABLE(std::get<0>(GetParam()));
    run_and_check(true);
}

std::string variant_packed_name(const ::testing::TestParamInfo<VariantPacked> &info) {
    return std::get<0>(info.param).name + "__" + std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(AllVariants, PackedTest,
                         ::testing::Combine(::testing::ValuesIn(tested_variants()), ::testing::ValuesIn(packed_cases())),
                         variant_packed_name);

// bf16 and int8 (attention_layer_packed_bf16, _int8): each variant with such a layer on every
// packed case, against the double reference of the same rounding or quantization, as
// test_layer.cpp's Bf16LayerTest and Int8LayerTest.
void check_reduced_packed(const VariantInfo &variant, const PackedCase &c, Precision precision) {
    const PackedData data(c);
    const PackedInputs in = data.inputs();
    Config config = data.config();
    config.precision = precision;
    config.allow_storage_only = true;
    const PackedReferenceRun &ref = packed_reference_run(std::string(c.name) + "_" + precision_name(precision), config,
                                                         data.layer.weights(), in);
    GuardedOutput y({c.tokens(), c.hidden});
    Attention(config, data.layer.weights(), variant.name).forward_packed(in, y.view());
    expect_matches_reference("y", y, ref.exact.y, ref.float32.y, ref.exact.allowance);
}

using Bf16PackedTest = PackedTest;
using Int8PackedTest = PackedTest;

TEST_P(Bf16PackedTest, MatchesReference) {
    const auto &[variant, c] = GetParam();
    ATTN_SKIP_IF_NOT_RUNNABLE(variant);
    check_reduced_packed(variant, c, Precision::bf16);
}

TEST_P(Int8PackedTest, MatchesReference) {
    const auto &[variant, c] = GetParam();
    ATTN_SKIP_IF_NOT_RUNNABLE(variant);
    check_reduced_packed(variant, c, Precision::int8);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Bf16PackedTest);  // (arm64 builds no bf16 or int8 variant)
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Int8PackedTest);
INSTANTIATE_TEST_SUITE_P(Bf16Variants, Bf16PackedTest,
                         ::testing::Combine(::testing::ValuesIn(precision_variant_list(Precision::bf16)),
                                            ::testing::ValuesIn(packed_cases())),
                         variant_packed_name);
INSTANTIATE_TEST_SUITE_P(Int8Variants, Int8PackedTest,
                         ::testing::Combine(::testing::ValuesIn(precision_variant_list(Precision::int8)),
                                            ::testing::ValuesIn(packed_cases())),
                         variant_packed_name);

// The listed packed problems (the benchmarks'), the long ones at hidden 64 with 2 heads
// as in test_layer.cpp; and the same lengths as a padded batch through forward_unpadded
// (at hidden 64): its real rows match the dense reference's, its padded rows are zeros.
class PackedProblemTest : public ::testing::TestWithParam<VariantProblem> {};

std::vector<Problem> packed_problems() {
    std::vector<Problem> problems;
    for (const ListedProblem &listed : problem_list()) {
        if (!listed.problem.packed) continue;
        Problem p = listed.problem;
        if (!listed.reference_checked) p.hidden = 64, p.heads = 2;
        problems.push_back(p);
    }
    return problems;
}

TEST_P(PackedProblemTest, PackedMatchesTheDenseReferenceOnRealTokens) {
    const auto &[variant, problem] = GetParam();
    ATTN_SKIP_IF_NOT_RUNNABLE(variant);
    const LayerData data(problem);
    const PackedBatch packed = data.packed();
    const Config config = problem.config();
    const PackedReferenceRun &ref = packed_reference_run(problem.name(), config, data.weights(), packed.inputs());
    Attention layer(config, data.weights(), variant.name);
    GuardedOutput y({packed.tokens(), problem.hidden});
    ATTN_RUN_OR_REFUSE(variant, "attention_layer_packed", layer.forward_packed(packed.inputs(), y.view()));
    expect_matches_reference("y", y, ref.exact.y, ref.float32.y);
}

TEST_P(PackedProblemTest, UnpaddedMatchesTheDensePathOnRealTokensAndZerosPadding) {
    const auto &[variant, problem] = GetParam();
    ATTN_SKIP_IF_NOT_RUNNABLE(variant);
    Problem padded = problem;
    padded.packed = false;
    // The dense reference's cost: packing and unpacking do not depend on the width.
    padded.batch = std::min<int64_t>(padded.batch, 8), padded.hidden = 64, padded.heads = 2;
    const LayerData data(padded);
    const Config config = padded.config();
    const reference::LayerOutputs<double> &exact = reference_run(data).exact;
    const reference::LayerOutputs<float> &float32 = reference_run(data).float32;
    Attention layer(config, data.weights(), variant.name);
    GuardedOutput y({padded.batch, padded.s_q, padded.hidden});
    ATTN_RUN_OR_REFUSE(variant, "attention_layer_packed", layer.forward_unpadded(data.inputs(), y.view()));
    // The real rows against the dense reference's; padded rows must be exactly zero.
    std::vector<float> real_y;
    std::vector<double> real_exact;
    std::vector<float> real_float32;
    const std::vector<int64_t> lengths = data.lengths();
    const int64_t H = padded.hidden;
    for (int64_t b = 0; b < padded.batch; ++b) {
        for (int64_t s = 0; s < padded.s_q; ++s) {
            const std::size_t row = std::size_t((b * padded.s_q + s) * H);
            if (s < lengths[std::size_t(b)]) {
                real_y.insert(real_y.end(), y.data() + row, y.data() + row + H);
                real_exact.insert(real_exact.end(), exact.y.begin() + row, exact.y.begin() + row + H);
                real_float32.insert(real_float32.end(), float32.y.begin() + row, float32.y.begin() + row + H);
            } else {
                for (int64_t o = 0; o < H; ++o) ASSERT_EQ(y.data()[row + o], 0.0f) << "padded row " << b << ", " << s;
            }
        }
    }
    const Accuracy a = check_accuracy(real_y.data(), real_exact, real_float32);
    EXPECT_TRUE(a.ok) << a.report("y (real rows)");
    EXPECT_TRUE(y.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(BenchmarkProblems, PackedProblemTest,
                         ::testing::Combine(::testing::ValuesIn(tested_variants()), ::testing::ValuesIn(packed_problems())),
                         variant_problem_name);

// Packing and unpacking alone.
TEST(Pack, KeepsRealTokensAndUnpackRestoresThemWithZeros) {
    const int64_t B = 3, S = 4, H = 2;
    std::vector<float> x(B * S * H);
    std::iota(x.begin(), x.end(), 1.0f);
    const std::vector<uint8_t> mask{1, 1, 0, 0, /**/ 0, 0, 0, 0, /**/ 1, 1, 1, 1};
    const PackedBatch packed = pack(view(x, {B, S, H}), view(mask, {B, S}));
    EXPECT_EQ(packed.sequence_offsets, (std::vector<int32_t>{0, 2, 2, 6}));
    const std::vector<float> expected{1, 2, 3, 4, 17, 18, 19, 20, 21, 22, 23, 24};
    EXPECT_EQ(packed.x, expected);
    std::vector<float> back(B * S * H, -1.0f);
    unpack(packed.inputs().x, packed.inputs().sequence_offsets, view(back, {B, S, H}));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s)
            for (int64_t h = 0; h < H; ++h) {
                const std::size_t i = std::size_t((b * S + s) * H + h);
                EXPECT_EQ(back[i], mask[std::size_t(b * S + s)] ? x[i] : 0.0f) << b << " " << s << " " << h;
            }
}

TEST(Pack, WithoutAMaskKeepsEveryToken) {
    std::vector<float> x(2 * 3 * 4, 1.0f);
    const PackedBatch packed = pack(view(x, {2, 3, 4}), {});
    EXPECT_EQ(packed.sequence_offsets, (std::vector<int32_t>{0, 3, 6}));
    EXPECT_EQ(packed.tokens(), 6);
}

// Malformed calls: each gets attn::Error naming the argument, expected and actual.
void expect_error(const std::function<void()> &call, const std::string &argument, const std::string &message) {
    try {
        call();
        ADD_FAILURE() << "expected attn::Error(" << argument << ")";
    } catch (const Error &e) {
        EXPECT_EQ(e.argument(), argument) << e.what();
        EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
}

class PackedBadInput : public ::testing::Test {
protected:
    PackedData data{{"bad", {3, 0, 4}}};
    Attention layer{data.config(), data.layer.weights()};
    std::vector<float> y = std::vector<float>(data.x.size(), -7.0f);
    MutableTensor y_view() { return view(y, {data.c.tokens(), data.c.hidden}); }
    void expect(std::vector<int32_t> offsets, const std::string &message) {
        PackedInputs in = data.inputs();
        in.sequence_offsets = {offsets.data(), offsets.size(), {int64_t(offsets.size())}};
        expect_error([&] { layer.forward_packed(in, y_view()); }, "sequence_offsets", message);
        EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == -7.0f; })) << "y was written";
    }
};

TEST_F(PackedBadInput, OffsetsNotStartingAtZero) { expect({1, 3, 3, 7}, "expected o_0 = 0, got 1"); }
TEST_F(PackedBadInput, OffsetsDecreasing) { expect({0, 5, 3, 7}, "non-decreasing offsets, got o_2 = 3 < o_1 = 5"); }
TEST_F(PackedBadInput, OffsetsNotEndingAtT) { expect({0, 3, 3, 6}, "o_3 = T = 7 (x's rows), got 6"); }
TEST_F(PackedBadInput, OffsetsEmpty) { expect({}, "data is null"); }

TEST_F(PackedBadInput, OffsetsInDeviceMemory) {
    PackedInputs in = data.inputs();
    in.sequence_offsets.memory = Memory::device;
    expect_error([&] { layer.forward_packed(in, y_view()); }, "sequence_offsets", "expected host memory");
}

TEST_F(PackedBadInput, BiasTooSmallForTheLongestSequence) {
    std::vector<float> bias(2 * 3 * 3);
    PackedInputs in = data.inputs();
    in.bias = view(bias, {2, 3, 3});
    expect_error([&] { layer.forward_packed(in, y_view()); }, "bias", "S_max >= the longest sequence, 4, got [2, 3, 3]");
}

TEST_F(PackedBadInput, BiasNotSquare) {
    std::vector<float> bias(2 * 4 * 5);
    PackedInputs in = data.inputs();
    in.bias = view(bias, {2, 4, 5});
    expect_error([&] { layer.forward_packed(in, y_view()); }, "bias", "got [2, 4, 5]");
}

TEST_F(PackedBadInput, XOfAnotherWidth) {
    std::vector<float> x(7 * 32);
    PackedInputs in = data.inputs();
    in.x = view(x, {7, 32});
    expect_error([&] { layer.forward_packed(in, y_view()); }, "x", "expected shape [T, H] with H = 64, got [7, 32]");
}

TEST_F(PackedBadInput, YOfAnotherShape) {
    std::vector<float> y_small(6 * 64);
    expect_error([&] { layer.forward_packed(data.inputs(), view(y_small, {6, 64})); }, "y",
                 "expected shape [T, H] = [7, 64], got [6, 64]");
}

TEST_F(PackedBadInput, ProbsOfAnotherSize) {
    std::vector<float> probs(10);
    expect_error([&] { layer.forward_packed(data.inputs(), y_view(), view(probs, {10})); }, "probs",
                 "expected shape [50]");
}

TEST(PackedProbsSize, IsHeadsTimesEachLengthSquaredSummed) {
    const std::vector<int32_t> offsets{0, 3, 3, 7}, decreasing{0, 5, 3};
    EXPECT_EQ(packed_probs_size({offsets.data(), offsets.size(), {4}}, 2), 2 * (9 + 0 + 16));
    expect_error([&] { packed_probs_size({decreasing.data(), decreasing.size(), {3}}, 2); }, "sequence_offsets",
                 "non-decreasing offsets, got o_2 = 3 < o_1 = 5");
    expect_error([&] { packed_probs_size({offsets.data(), offsets.size(), {4}}, 0); }, "heads",
                 "expected at least 1, got 0");
}

TEST_F(PackedBadInput, NoTokensIsNotAnError) {
    const std::vector<int32_t> offsets{0, 0, 0};
    PackedInputs in;
    in.x = {nullptr, 0, {0, 64}};
    in.sequence_offsets = {offsets.data(), offsets.size(), {3}};
    layer.forward_packed(in, {nullptr, 0, {0, 64}});
}

TEST(PackBadInput, LeftPaddingIsRefused) {
    std::vector<float> x(2 * 3 * 4);
    const std::vector<uint8_t> mask{1, 1, 0, /**/ 0, 1, 1};
    expect_error([&] { pack(view(x, {2, 3, 4}), view(mask, {2, 3})); }, "key_padding_mask",
                 "row 1 has a real token at position 1 after padding at position 0");
}

TEST(PackBadInput, UnpackIntoTooShortABatch) {
    std::vector<float> packed(5 * 2), padded(2 * 2 * 2);
    const std::vector<int32_t> offsets{0, 3, 5};
    expect_error([&] { unpack(view(packed, {5, 2}), view(offsets, {3}), view(padded, {2, 2, 2})); }, "padded",
                 "expected shape [B, S, H] = [2, S >= 3, 2], got [2, 2, 2]");
}

TEST(PackBadInput, UnpaddedRefusesCrossAttentionAndABatchedBias) {
    Problem p;
    p.batch = 2, p.s_q = p.s_k = 4, p.hidden = 64, p.heads = 2, p.mask = Mask::padding;
    LayerData d(p);
    Attention layer(p.config(), d.weights());
    std::vector<float> y(d.x.size());
    AttentionInputs in = d.inputs();
    in.kv = in.x;
    expect_error([&] { layer.forward_unpadded(in, view(y, {2, 4, 64})); }, "kv", "expected no kv");
    std::vector<float> bias(2 * 2 * 4 * 4);
    in = d.inputs();
    in.bias = view(bias, {2, 2, 4, 4});
    expect_error([&] { layer.forward_unpadded(in, view(y, {2, 4, 64})); }, "bias",
                 "expected shape [1, heads or 1, S, S] = [1, 2 or 1, 4, 4] (one bias for every sequence), got [2, 2, 4, 4]");
}

}  // namespace
}  // namespace attn::testing
