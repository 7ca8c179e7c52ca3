// bf16 and int8 (attn::Precision): the rounding and quantization the runtime and the
// reference share, the choice of variant and its refusals, and each reduced-precision layer
// against the fp32 reference under a bound derived from its rounding. (Each variant against
// the double reference of the same rounding: test_layer.cpp's Bf16LayerTest and
// Int8LayerTest, test_packed.cpp's Bf16PackedTest and Int8PackedTest.)
#include "attn/internal.h"
#include "support/variant_param.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace attn::testing {
namespace {

float from_bits(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

TEST(Bf16, RoundsToNearestTiesToEven) {
    EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
    // Halfway between 1 and 1 + 2^-7: to 1 (even); halfway above 1 + 2^-7: up to 1 + 2^-6.
    EXPECT_EQ(round_to_bf16(1.0f + 0x1p-8f), 1.0f);
    EXPECT_EQ(round_to_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
    EXPECT_EQ(round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // above halfway: up
    EXPECT_EQ(round_to_bf16(-1.0f - 0x1p-8f - 0x1p-20f), -1.0f - 0x1p-7f);
    EXPECT_EQ(bf16_bits(1.0f), 0x3f80);
    EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
    EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::max()), std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
    EXPECT_TRUE(std::isnan(round_to_bf16(from_bits(0x7f800001u))));  // a NaN whose payload is in the low bits
}

TEST(Int8, QuantizesWeightsPerOutputFeature) {
    // Row 0: its largest magnitude, 1.26, becomes ±63 (kInt8WeightLimit; scale 0.02); 0.01 is
    // half a step, to even (0), 0.03 one and a half, to even (2). Row 1, zeros: scale 1.
    ASSERT_EQ(kInt8WeightLimit, 63);
    const std::vector<float> w{1.26f, -1.26f, 0.01f, 0.03f, 0, 0, 0, 0};
    const Int8Weight q = quantize_int8({w.data(), w.size(), {2, 4}});
    EXPECT_FLOAT_EQ(q.scales[0], 1.26f / 63.0f);
    EXPECT_EQ(q.scales[1], 1.0f);
    EXPECT_EQ(std::vector<int>(q.values.begin(), q.values.begin() + 4), (std::vector<int>{63, -63, 0, 2}));
    EXPECT_EQ(q.sums[0], 2);
    EXPECT_EQ(q.sums[1], 0);
}

TEST(Int8, QuantizesRowsToU8WithAZeroPoint) {
    // Range [-1, 3] (low from the row, high from it): step 4/255, zero round(63.75) = 64.
    const std::vector<float> row{-1.0f, 3.0f, 0.0f, 1.0f};
    std::vector<uint8_t> values(row.size());
    const QuantizedRow q = quantize_row_u8(row.data(), int64_t(row.size()), values.data());
    EXPECT_FLOAT_EQ(q.step, 4.0f / 255.0f);
    EXPECT_EQ(q.zero, 64);
    EXPECT_EQ(std::vector<int>(values.begin(), values.end()), (std::vector<int>{0, 255, 64, 128}));
    // Positive only: low is 0, so zero is 0 and 0 stays exact.
    const std::vector<float> positive{0.5f, 2.0f};
    std::vector<uint8_t> pv(2);
    const QuantizedRow p = quantize_row_u8(positive.data(), 2, pv.data());
    EXPECT_EQ(p.zero, 0);
    EXPECT_EQ(int(pv[1]), 255);
    // A row of zeros: step 1, every value the zero point.
    const std::vector<float> zeros(3, 0.0f);
    std::vector<uint8_t> zv(3);
    const QuantizedRow z = quantize_row_u8(zeros.data(), 3, zv.data());
    EXPECT_EQ(z.step, 1.0f);
    EXPECT_EQ(std::vector<int>(zv.begin(), zv.end()), std::vector<int>(3, z.zero));
}

Problem small(bool causal = false) {
    Problem p;
    p.batch = 2, p.s_q = p.s_k = 33, p.hidden = 128, p.heads = 4, p.mask = Mask::padding, p.causal = causal;
    return p;
}

Config reduced_config(const Problem &p, Precision precision, bool allow_storage_only = false) {
    Config c = p.config();
    c.precision = precision;
    c.allow_storage_only = allow_storage_only;
    return c;
}

const VariantInfo *first_runnable(Precision precision, bool native) {
    for (const VariantInfo *v : precision_variants(precision))
        if (v->runnable && computes_natively(*v, precision) == native) return v;
    return nullptr;
}

template <typename Call>
void expect_error(const char *argument, const std::string &message, Call &&call) {
    try {
        call();
    } catch (const Error &e) {
        EXPECT_EQ(e.argument(), argument) << e.what();
        EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
        return;
    }
    ADD_FAILURE() << "no attn::Error(" << argument << ")";
}

// Each reduced precision (attn::kReducedPrecisions) as a test parameter.
class ReducedPrecisionTest : public ::testing::TestWithParam<Precision> {};

std::string precision_param_name(const ::testing::TestParamInfo<Precision> &info) { return precision_name(info.param); }

// A build without the precision's variants (arm64: manifest.json's built_for) refuses it, saying so.
#define ATTN_SKIP_WITHOUT(precision, d)                                                                         \
    if (precision_variants(precision).empty()) {                                                              \
        expect_error("precision", "none in this build",                                                      \
                     [&] { Attention(reduced_config((d).problem, precision, true), (d).weights()); });        \
        GTEST_SKIP() << "this build has no " << precision_name(precision) << " variant (manifest.json: built_for)"; \
    }

TEST_P(ReducedPrecisionTest, DefaultIsTheWidestVariantThatComputesNatively) {
    const Precision precision = GetParam();
    const LayerData d(small());
    ATTN_SKIP_WITHOUT(precision, d);
    const ReducedPrecision &rp = reduced_precision(precision);
    const VariantInfo *native = first_runnable(precision, true);
    if (!native) {
        // None that computes natively runs here: refused, and the message says how to allow the fallback.
        expect_error("precision", "config.allow_storage_only",
                     [&] { Attention(reduced_config(d.problem, precision), d.weights()); });
        const VariantInfo *without = first_runnable(precision, false);
        ASSERT_NE(without, nullptr);
        EXPECT_EQ(Attention(reduced_config(d.problem, precision, true), d.weights()).variant().name, without->name);
        GTEST_SKIP() << "no variant that computes " << rp.name << " natively runs here (this CPU lacks "
                     << rp.cpu_feature << ", or the build that variant)";
    }
    const Attention layer(reduced_config(d.problem, precision), d.weights());
    EXPECT_TRUE(computes_natively(layer.variant(), precision)) << layer.variant().name;
    const Attention allowed(reduced_config(d.problem, precision, true), d.weights());
    EXPECT_EQ(allowed.variant().name, layer.variant().name) << "the fallback is never preferred";
}

TEST_P(ReducedPrecisionTest, RefusesWhatItCannotDo) {
    const Precision precision = GetParam();
    LayerData d(small());
    ATTN_SKIP_WITHOUT(precision, d);
    const ReducedPrecision &rp = reduced_precision(precision);
    const Config config = reduced_config(d.problem, precision);
    // A variant without the precision's layer, named.
    for (const VariantInfo &v : variants()) {
        const std::vector<const VariantInfo *> with = precision_variants(precision);
        if (!v.runnable || std::find(with.begin(), with.end(), &v) != with.end()) continue;
        expect_error("variant", std::string("does not provide ") + rp.layer,
                     [&] { Attention(reduced_config(d.problem, precision, true), d.weights(), v.name); });
        break;
    }
    // A variant without the instructions, named, without the caller's leave.
    if (const VariantInfo *without = first_runnable(precision, false)) {
        expect_error("precision", rp.without_feature, [&] { Attention(config, d.weights(), without->name); });
        EXPECT_EQ(Attention(reduced_config(d.problem, precision, true), d.weights(), without->name).variant().name,
                  without->name);
    }
    const Attention layer(reduced_config(d.problem, precision, true), d.weights());
    std::vector<float> y(std::size_t(d.problem.batch * d.problem.s_q * d.problem.hidden));
    std::vector<float> probs(std::size_t(d.problem.batch * d.problem.heads * d.problem.s_q * d.problem.s_k));
    const MutableTensor y_view = view(y, {d.problem.batch, d.problem.s_q, d.problem.hidden});
    expect_error("probs", "no probabilities output", [&] {
        layer.forward(d.inputs(), y_view, view(probs, {d.problem.batch, d.problem.heads, d.problem.s_q, d.problem.s_k}));
    });
    const PackedBatch packed = d.packed();
    std::vector<float> y_packed(packed.x.size()), probs_packed(std::size_t(
                                                      packed_probs_size(packed.inputs().sequence_offsets, d.problem.heads)));
    expect_error("probs", "no probabilities output", [&] {
        layer.forward_packed(packed.inputs(), view(y_packed, {packed.tokens(), packed.hidden}),
                             view(probs_packed, {int64_t(probs_packed.size())}));
    });
    // The stages: int8 is a layer's only, refused rather than computed in fp32; bf16 is refused
    // by a variant without the bf16 stage, naming those with it, and by one without the
    // instructions unless the caller allows it. (StageTest checks each bf16 stage against the reference.)
    std::vector<float> q(y.size()), k(y.size()), v(y.size());
    const Shape shape{d.problem.batch, d.problem.s_q, d.problem.hidden};
    auto project = [&](const VariantInfo &variant, const Config &c) {
        stages::qkv_projection(variant, c, d.inputs().x, d.inputs().x, d.weights(), view(q, shape), view(k, shape),
                               view(v, shape));
    };
    if (precision == Precision::int8) {
        expect_error("precision", "int8 is a precision of the whole layer", [&] { project(select_variant(), config); });
        return;
    }
    for (const VariantInfo &variant : variants()) {
        if (!variant.runnable || variant.provides("qkv_projection_bf16")) continue;
        expect_error("variant", "does not provide qkv_projection_bf16; the variants that do: ",
                     [&] { project(variant, config); });
        break;
    }
    if (const VariantInfo *without = first_runnable(precision, false)) {
        expect_error("precision", rp.without_feature, [&] { project(*without, config); });
        project(*without, reduced_config(d.problem, precision, true));
    }
}

// A variant without a bf16 layer or stage is refused naming the variants that have one, a
// candidate registered at run time (attn_bench --candidate) among them: the compiled functions
// of a bf16 variant under another name, as attn_bench registers a tuning candidate's.
TEST(Bf16, ARefusalNamesTheRegisteredCandidatesThatHaveIt) {
    const VariantInfo *bf16 = first_runnable(Precision::bf16, true);
    if (!bf16) bf16 = first_runnable(Precision::bf16, false);
    const auto without = std::find_if(variants().begin(), variants().end(), [](const VariantInfo &v) {
        return v.runnable && v.device == "cpu" && !v.provides("attention_layer_bf16");
    });
    if (!bf16 || without == variants().end()) GTEST_SKIP() << "needs a runnable CPU variant with bf16 and one without";
    VariantInfo info = *bf16;
    info.name = "candidate_refusal_test", info.schedule = "candidate";
    const auto registered = detail::compiled_and_registered_variants();  // once per process (--gtest_repeat)
    if (std::none_of(registered.begin(), registered.end(), [&](const VariantInfo *v) { return v->name == info.name; }))
        detail::register_variant(info, detail::runnable_functions(*bf16));
    const Problem p = small();
    const LayerData d(p);
    const Config config = reduced_config(p, Precision::bf16, true);
    expect_error("variant", "candidate_refusal_test", [&] { Attention(config, d.weights(), without->name); });
    std::vector<float> q(d.x.size()), k(d.x.size()), v(d.x.size());
    const Shape shape{p.batch, p.s_q, p.hidden};
    expect_error("variant", "candidate_refusal_test", [&] {
        stages::qkv_projection(*without, config, d.inputs().x, d.inputs().x, d.weights(), view(q, shape),
                               view(k, shape), view(v, shape));
    });
    // The candidate itself runs: select_variant finds it by name.
    Attention(config, d.weights(), info.name);
}

// The softmax has no products: a bf16 config computes it in f32, as fp32 does, bit for bit.
TEST(Bf16, MaskedSoftmaxIsTheFp32One) {
    const Problem p = small();
    const Shape shape{p.batch, p.heads, p.s_q, p.s_k};
    std::vector<float> scores(std::size_t(p.batch * p.heads * p.s_q * p.s_k)), fp32(scores.size()), bf16(scores.size());
    for (std::size_t i = 0; i < scores.size(); ++i) scores[i] = 3 * std::sin(0.37f * float(i));
    const VariantInfo &variant = select_variant();
    stages::masked_softmax(variant, p.config(), {scores.data(), scores.size(), shape}, {}, view(fp32, shape));
    stages::masked_softmax(variant, reduced_config(p, Precision::bf16), {scores.data(), scores.size(), shape}, {},
                           view(bf16, shape));
    EXPECT_EQ(std::memcmp(fp32.data(), bf16.data(), fp32.size() * sizeof(float)), 0);
}

// NaN in one token's input: its own row of y is NaN, and, through K and V (which every query
// attends), every other row too, as in fp32 (int8 makes the row's quantization step NaN:
// the min and max of its range may pass a NaN over). So does an infinity.
TEST_P(ReducedPrecisionTest, NaNAndInfinityInAnInputPropagate) {
    const Precision precision = GetParam();
    Problem p;
    p.batch = 1, p.s_q = p.s_k = 9, p.hidden = 64, p.heads = 2;
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        LayerData d(p);
        ATTN_SKIP_WITHOUT(precision, d);
        d.x[3 * 64 + 5] = bad;
        std::vector<float> y(std::size_t(p.s_q * p.hidden));
        Attention(reduced_config(p, precision, true), d.weights()).forward(d.inputs(), view(y, {1, p.s_q, p.hidden}));
        EXPECT_TRUE(std::isnan(y[3 * 64])) << precision_name(precision) << ", " << bad << ": the row holding it";
        EXPECT_TRUE(std::isnan(y[0])) << precision_name(precision) << ", " << bad << ": another row, through K and V";
    }
}

// A NaN in b_q makes every score of its head NaN, which the flash core's max and clamp would
// drop (x86's max returns its other operand): every row must come out NaN, in fp32 too.
// Whatever its bits: besides the usual quiet NaN, ones whose rounding of the bits to bf16 would
// carry into the sign or the exponent (0x7fffffff to -0, 0xffffffff, memset 0xff's pattern, to
// +0, 0x7f800001 to Inf), which attn_gen::rounded_as keeps NaN as the reference does.
TEST_P(ReducedPrecisionTest, NaNInEveryScoreOfAHeadPropagates) {
    const Precision precision = GetParam();
    Problem p;
    p.batch = 1, p.s_q = p.s_k = 9, p.hidden = 64, p.heads = 2;
    for (uint32_t bits : {0x7fc00000u, 0x7fffffffu, 0xffffffffu, 0x7f800001u}) {
        LayerData d(p);
        ATTN_SKIP_WITHOUT(precision, d);
        float nan;
        std::memcpy(&nan, &bits, sizeof nan);
        d.b_q[5] = nan;
        std::vector<float> y(std::size_t(p.s_q * p.hidden));
        for (const Config &config : {reduced_config(p, precision, true), p.config()}) {
            Attention(config, d.weights()).forward(d.inputs(), view(y, {1, p.s_q, p.hidden}));
            for (int64_t row : {0, 4, 8})
                EXPECT_TRUE(std::isnan(y[std::size_t(row * 64)])) << precision_name(config.precision) << ", NaN 0x"
                                                                  << std::hex << bits << std::dec << ": row " << row;
        }
    }
}

TEST(Int8, RefusesWeightsItCannotQuantize) {
    LayerData d(small());
    ATTN_SKIP_WITHOUT(Precision::int8, d);
    d.w_k[7] = std::numeric_limits<float>::infinity();
    expect_error("w_k", "expected finite values to quantize to int8, got inf at [0, 7]",
                 [&] { Attention(reduced_config(d.problem, Precision::int8, true), d.weights()); });
    Problem wide = small();
    // (2^31 / (2 · 255 · 63) − 4 = 66833 is the largest.)
    wide.hidden = 66834, wide.heads = 1;
    Config config = reduced_config(wide, Precision::int8, true);
    expect_error("hidden_size", "expected at most 66833 with int8 (its i32 sums), got 66834",
                 [&] { Attention(config, d.weights()); });
}

// The int8 pairs at their extreme: every activation quantized to 255 (x constant and positive:
// the row's range is [0, x]) and every weight to ±kInt8WeightLimit (all of one magnitude, the
// sign in pairs of input features), so that each pair of products sums to ±2·255·63 = ±32130,
// the most a 16-bit pair sum (AVX2's vpmaddubsw, attn_gen::Int8Sum) ever holds; the signs
// vary with the output feature so that LayerNorm sees distinct values. Every int8 variant that
// runs here, against the double reference of the same quantization.
TEST(Int8, PairsAtTheLargestSumMatchTheReference) {
    Problem p;
    p.batch = 2, p.s_q = p.s_k = 13, p.hidden = 64, p.heads = 2;
    LayerData d(p);
    ATTN_SKIP_WITHOUT(Precision::int8, d);
    std::fill(d.x.begin(), d.x.end(), 0.75f);
    for (std::vector<float> *w : {&d.w_q, &d.w_k, &d.w_v, &d.w_o})
        for (int64_t o = 0; o < p.hidden; ++o)
            for (int64_t i = 0; i < p.hidden; ++i)
                (*w)[std::size_t(o * p.hidden + i)] = ((i / 2 + o) % 3 == 0 ? -0.04f : 0.04f);
    const Config config = reduced_config(p, Precision::int8, true);
    const Int8Weight q = quantize_int8({d.w_q.data(), d.w_q.size(), {p.hidden, p.hidden}});
    ASSERT_EQ(*std::max_element(q.values.begin(), q.values.end()), kInt8WeightLimit);
    ASSERT_EQ(*std::min_element(q.values.begin(), q.values.end()), -kInt8WeightLimit);
    std::vector<uint8_t> row(std::size_t(p.hidden));
    quantize_row_u8(d.x.data(), p.hidden, row.data());
    ASSERT_EQ(*std::min_element(row.begin(), row.end()), 255);
    const auto exact = reference::attention_layer<double>(config, d.weights(), d.inputs());
    const auto plain = reference::attention_layer<float>(config, d.weights(), d.inputs());
    const std::vector<double> allowance = reference::context_allowance(config, d.weights(), d.inputs(), exact, plain);
    int ran = 0;
    for (const VariantInfo *v : precision_variants(Precision::int8)) {
        if (!v->runnable) continue;
        std::vector<float> y(exact.y.size());
        Attention(config, d.weights(), v->name).forward(d.inputs(), view(y, {p.batch, p.s_q, p.hidden}));
        const Accuracy a = check_accuracy(y.data(), exact.y, plain.y, allowance);
        EXPECT_TRUE(a.ok) << a.report(v->name);
        ++ran;
    }
    if (ran == 0) GTEST_SKIP() << "no int8 variant runs on this CPU";
}

INSTANTIATE_TEST_SUITE_P(Precisions, ReducedPrecisionTest, ::testing::Values(Precision::bf16, Precision::int8),
                         precision_param_name);

// A reduced-precision layer against the fp32 reference: a bound derived from its rounding.
// bf16: with
// u = 2^-8, the unit roundoff of rounding to bf16 (8 significant bits, to nearest), each
// rounded operand is a·(1 + δ) with δ spread evenly over [−u, u] (variance u²/3) and
// independent of the others, on these random inputs. Propagated to first order, as standard
// deviations (sd), a sum of independent roundings by the root of the sum of squares, and a
// sum of terms that share roundings by the sum of their sd (sd(X + Y) <= sd X + sd Y, for any
// correlation):
//   a projection p = Σ a·w + b: sd Δp = u·√(2/3)·√Σ(a·w)² (a and w rounded);
//   a score s = q·k/√d: sd Δs = √Σ(k²·sd²Δq + q²·sd²Δk)/√d;
//   a probability: ΔP_j = P_j·(Δs_j − Σ_l P_l·Δs_l), so sd ΔP_j <= P_j·(sd Δs_j + Σ_l P_l·sd Δs_l);
//   the context c = Σ P·v: sd Δc <= Σ_j (sd ΔP_j·|v_j| + P_j·sd Δv_j);
//   the output projection z = x + b + Σ round(c)·round(W_o): sd Δz_o <= Σ_e sd Δc_e·|W_o| +
//     u·√(2/3)·√Σ_e (c_e·W_o)² (the rounding of c and of W_o);
//   LayerNorm: Δy_o = γ_o/σ·(Δz_o − Δμ − ŷ_o·Δσ), sd Δμ and sd Δσ <= max sd Δz, so
//     sd Δy_o <= |γ_o|/σ·(sd Δz_o + (1 + |ŷ_o|)·max sd Δz), ŷ the normalized value.
// int8: each quantized operand is off by an error spread evenly over half a step either way,
// absolute rather than relative: the activation a by step_a/2 (its row's step,
// attn::quantize_row_u8), the weight w by scale_w/2 (its output feature's, attn::quantize_int8),
// variance step²/12 and scale²/12. So sd Δp = √Σ(w²·step_a² + a²·scale_w²)/√12 for a projection,
// and likewise for the output projection's √Σ_e (c_e·W_o)² term; the rest propagates as in bf16.
// (A row's largest value may be clamped to 255, one step off instead of half: one element of a
// row, which the 6 sd absorb.)
// A bf16 core (ReducedPrecision::bf16_core()) also rounds q, k and v (each adds u/√3·|a| to its
// sd, in quadrature) and the weights: ΔP_j = P_j·(δ_j − Σ_l P_l·δ_l), so sd ΔP_j gains at most
// P_j·2u/√3.
// The bound is 6 sd (a Gaussian tail of 2e-9 per element) plus the accuracy rule's allowance
// for evaluating in f32 (2 × the plain float32 error + 1e-5).
std::vector<double> fp32_bound(const Problem &p, const LayerData &d, const reference::LayerOutputs<double> &r,
                               Precision precision) {
    const double u = 0x1p-8, pair = u * std::sqrt(2.0 / 3.0), uniform = 1 / std::sqrt(12.0);
    const int64_t B = p.batch, S = p.s_q, H = p.hidden, heads = p.heads, dh = H / heads;
    const int64_t rows = B * S;
    const bool int8 = precision == Precision::int8;
    // int8: each row's step, each output feature's weight scale.
    auto row_steps = [&](const auto &a) {
        std::vector<double> steps(static_cast<std::size_t>(rows));
        std::vector<float> row(static_cast<std::size_t>(H));
        std::vector<uint8_t> values(static_cast<std::size_t>(H));
        for (int64_t i = 0; i < rows; ++i) {
            for (int64_t k = 0; k < H; ++k) row[std::size_t(k)] = float(a[i * H + k]);
            steps[std::size_t(i)] = quantize_row_u8(row.data(), H, values.data()).step;
        }
        return steps;
    };
    auto weight_scales = [&](const std::vector<float> &w) {
        const std::vector<float> scales = quantize_int8({w.data(), w.size(), {H, H}}).scales;
        return std::vector<double>(scales.begin(), scales.end());
    };
    // sd of Σ_k a_k·w_k for a's row `row` and w's output `o`.
    auto sum_sd = [&](const auto &a, const std::vector<float> &w, int64_t row, int64_t o, double step, double scale) {
        double s = 0;
        for (int64_t k = 0; k < H; ++k) {
            const double ak = double(a[row * H + k]), wk = double(w[o * H + k]);
            s += int8 ? wk * wk * step * step + ak * ak * scale * scale : std::pow(ak * wk, 2);
        }
        return (int8 ? uniform : pair) * std::sqrt(s);
    };
    const std::vector<double> x_steps = int8 ? row_steps(d.x) : std::vector<double>(),
                              ctx_steps = int8 ? row_steps(r.ctx) : std::vector<double>();
    auto projection_sd = [&](const std::vector<float> &a, const std::vector<float> &w) {
        const std::vector<double> scales = int8 ? weight_scales(w) : std::vector<double>();
        std::vector<double> sd(static_cast<std::size_t>(rows * H));
        for (int64_t row = 0; row < rows; ++row)
            for (int64_t o = 0; o < H; ++o)
                sd[row * H + o] = sum_sd(a, w, row, o, int8 ? x_steps[std::size_t(row)] : 0, int8 ? scales[std::size_t(o)] : 0);
        return sd;
    };
    // With a bf16 core, each of q, k and v rounded once more as the core reads it.
    const bool bf16_core = reduced_precision(precision).bf16_core();
    auto core_operand_sd = [&](std::vector<double> sd, const std::vector<double> &value) {
        if (bf16_core)
            for (std::size_t i = 0; i < sd.size(); ++i) sd[i] = std::hypot(sd[i], u / std::sqrt(3.0) * value[i]);
        return sd;
    };
    const std::vector<double> sq = core_operand_sd(projection_sd(d.x, d.w_q), r.q),
                              sk = core_operand_sd(projection_sd(d.x, d.w_k), r.k),
                              sv = core_operand_sd(projection_sd(d.x, d.w_v), r.v);
    const double weight_sd = bf16_core ? 2 * u / std::sqrt(3.0) : 0;
    std::vector<double> sc(static_cast<std::size_t>(rows * H), 0.0), ss(static_cast<std::size_t>(S)),
        sp(static_cast<std::size_t>(S));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < S; ++i) {
                const int64_t qi = (b * S + i) * H + h * dh;
                const double *P = &r.probs[std::size_t(((b * heads + h) * S + i) * S)];
                double mixed = 0;  // Σ_l P_l·sd Δs_l
                for (int64_t j = 0; j < S; ++j) {
                    const int64_t kj = (b * S + j) * H + h * dh;
                    double v = 0;
                    for (int64_t e = 0; e < dh; ++e)
                        v += r.k[kj + e] * r.k[kj + e] * sq[qi + e] * sq[qi + e] +
                             r.q[qi + e] * r.q[qi + e] * sk[kj + e] * sk[kj + e];
                    ss[j] = std::sqrt(v / double(dh));
                    mixed += P[j] * ss[j];
                }
                for (int64_t j = 0; j < S; ++j) sp[j] = P[j] * (ss[j] + mixed + weight_sd);
                for (int64_t e = 0; e < dh; ++e) {
                    double c = 0;
                    for (int64_t j = 0; j < S; ++j) {
                        const int64_t vj = (b * S + j) * H + h * dh + e;
                        c += sp[j] * std::abs(r.v[vj]) + P[j] * sv[vj];
                    }
                    sc[qi + e] = c;
                }
            }
    std::vector<double> bound(static_cast<std::size_t>(rows * H)), sz(static_cast<std::size_t>(H)),
        z(static_cast<std::size_t>(H));
    const std::vector<double> o_scales = int8 ? weight_scales(d.w_o) : std::vector<double>();
    for (int64_t row = 0; row < rows; ++row) {
        for (int64_t o = 0; o < H; ++o) {
            double shared = 0;
            for (int64_t e = 0; e < H; ++e) shared += sc[row * H + e] * std::abs(double(d.w_o[o * H + e]));
            sz[o] = shared + sum_sd(r.ctx, d.w_o, row, o, int8 ? ctx_steps[std::size_t(row)] : 0,
                                    int8 ? o_scales[std::size_t(o)] : 0);
        }
        const double largest = *std::max_element(sz.begin(), sz.end());
        double mean = 0, var = 0;
        for (int64_t o = 0; o < H; ++o) {
            double acc = double(d.x[row * H + o]) + double(d.b_o[o]);
            for (int64_t e = 0; e < H; ++e) acc += r.ctx[row * H + e] * double(d.w_o[o * H + e]);
            mean += (z[o] = acc);
        }
        mean /= double(H);
        for (double zo : z) var += (zo - mean) * (zo - mean);
        const double sigma = std::sqrt(var / double(H) + double(p.config().layer_norm_eps));
        EXPECT_LT(largest / sigma, 0.1) << "the first-order propagation needs sd Δz small against σ";
        for (int64_t o = 0; o < H; ++o) {
            const double normalized = std::abs(z[o] - mean) / sigma;
            bound[row * H + o] = 6 * std::abs(double(d.gamma[o])) / sigma * (sz[o] + (1 + normalized) * largest);
        }
    }
    return bound;
}

class AgainstFp32 : public ::testing::TestWithParam<std::tuple<Precision, Problem>> {};

TEST_P(AgainstFp32, WithinTheRoundingBound) {
    const auto &[precision, p] = GetParam();
    const LayerData d(p);
    ATTN_SKIP_WITHOUT(precision, d);
    Config fp32 = p.config();
    const auto exact = reference::attention_layer<double>(fp32, d.weights(), d.inputs());
    const auto plain = reference::attention_layer<float>(fp32, d.weights(), d.inputs());
    const std::vector<double> bound = fp32_bound(p, d, exact, precision);
    double f32_error = 0;
    for (std::size_t i = 0; i < exact.y.size(); ++i)
        f32_error = std::max(f32_error, std::abs(double(plain.y[i]) - exact.y[i]));
    for (const VariantInfo *v : precision_variants(precision)) {
        if (!v->runnable) continue;
        GuardedOutput y({p.batch, p.s_q, p.hidden});
        Attention(reduced_config(p, precision, true), d.weights(), v->name).forward(d.inputs(), y.view());
        double worst = 0, worst_bound = 0, largest_ratio = 0;
        std::size_t at = 0;
        for (std::size_t i = 0; i < exact.y.size(); ++i) {
            const double error = std::abs(double(y.data()[i]) - exact.y[i]);
            const double allowed = bound[i] + 2 * f32_error + kAbsoluteFloor;
            if (error / allowed > largest_ratio) largest_ratio = error / allowed, worst = error, worst_bound = allowed, at = i;
        }
        std::cout << "[ " << precision_name(precision) << "     ] " << v->name << " " << p.name() << ": largest error against fp32 " << worst
                  << " where the bound is " << worst_bound << " (" << largest_ratio << " of it), at " << at << "\n";
        EXPECT_LE(largest_ratio, 1.0) << v->name << ": error " << worst << " > bound " << worst_bound << " at " << at;
        EXPECT_TRUE(y.guards_intact()) << v->name;
    }
}

std::vector<Problem> against_fp32_problems() {
    Problem minilm;
    minilm.batch = 1, minilm.s_q = minilm.s_k = 64, minilm.hidden = 384, minilm.heads = 12;
    return {small(), small(true), minilm};
}

INSTANTIATE_TEST_SUITE_P(Problems, AgainstFp32,
                         ::testing::Combine(::testing::Values(Precision::bf16, Precision::int8),
                                            ::testing::ValuesIn(against_fp32_problems())),
                         [](const ::testing::TestParamInfo<std::tuple<Precision, Problem>> &info) {
                             return std::string(precision_name(std::get<0>(info.param))) + "_" +
                                    std::get<1>(info.param).name();
                         });

}  // namespace
}  // namespace attn::testing
