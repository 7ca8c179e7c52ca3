// bf16 (attn::Precision): the rounding the runtime and the reference share, the choice of
// variant and its refusals, and the bf16 layer against the fp32 reference under a bound
// derived from the rounding. (Each bf16 variant against the double reference of the same
// rounding: test_layer.cpp's Bf16LayerTest, test_packed.cpp's Bf16PackedTest.)
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

Problem small(bool causal = false) {
    Problem p;
    p.batch = 2, p.s_q = p.s_k = 33, p.hidden = 128, p.heads = 4, p.mask = Mask::padding, p.causal = causal;
    return p;
}

Config bf16_config(const Problem &p, bool allow_storage_only = false) {
    Config c = p.config();
    c.precision = Precision::bf16;
    c.allow_storage_only = allow_storage_only;
    return c;
}

const VariantInfo *first_bf16(bool computes) {
    for (const VariantInfo *v : bf16_variants())
        if (v->runnable && computes_bf16(*v) == computes) return v;
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

// A build without bf16 variants (arm64: manifest.json's built_for) refuses bf16, saying so.
#define ATTN_SKIP_WITHOUT_BF16(d)                                                                              \
    if (bf16_variants().empty()) {                                                                           \
        expect_error("precision", "none in this build", [&] { Attention(bf16_config((d).problem, true), (d).weights()); }); \
        GTEST_SKIP() << "this build has no bf16 variant (manifest.json: built_for)";                          \
    }

TEST(Bf16, DefaultIsTheWidestVariantThatComputesBf16) {
    const LayerData d(small());
    ATTN_SKIP_WITHOUT_BF16(d);
    const VariantInfo *computes = first_bf16(true);
    if (!computes) {
        // None that computes in bf16 runs here: refused, and the message says how to allow storage only.
        expect_error("precision", "config.allow_storage_only", [&] { Attention(bf16_config(d.problem), d.weights()); });
        const VariantInfo *stores = first_bf16(false);
        ASSERT_NE(stores, nullptr);
        EXPECT_EQ(Attention(bf16_config(d.problem, true), d.weights()).variant().name, stores->name);
        GTEST_SKIP() << "no variant that computes in bf16 runs here (this CPU lacks avx512bf16, or the build that variant)";
    }
    const Attention layer(bf16_config(d.problem), d.weights());
    EXPECT_TRUE(computes_bf16(layer.variant())) << layer.variant().name;
    const Attention allowed(bf16_config(d.problem, true), d.weights());
    EXPECT_EQ(allowed.variant().name, layer.variant().name) << "storage only is a fallback, never preferred";
}

TEST(Bf16, RefusesWhatItCannotDo) {
    LayerData d(small());
    ATTN_SKIP_WITHOUT_BF16(d);
    const Config bf16 = bf16_config(d.problem);
    // A variant without a bf16 layer, named.
    for (const VariantInfo &v : variants()) {
        const std::vector<const VariantInfo *> with = bf16_variants();
        if (!v.runnable || std::find(with.begin(), with.end(), &v) != with.end()) continue;
        expect_error("variant", "does not provide attention_layer_bf16",
                     [&] { Attention(bf16_config(d.problem, true), d.weights(), v.name); });
        break;
    }
    // Storage only, named, without the caller's leave.
    if (const VariantInfo *stores = first_bf16(false)) {
        expect_error("precision", "only store bf16", [&] { Attention(bf16, d.weights(), stores->name); });
        EXPECT_EQ(Attention(bf16_config(d.problem, true), d.weights(), stores->name).variant().name, stores->name);
    }
    const Attention layer(bf16_config(d.problem, true), d.weights());
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
    // The stages are fp32: a bf16 config is refused, not computed in fp32.
    std::vector<float> q(y.size()), k(y.size()), v(y.size());
    const Shape shape{d.problem.batch, d.problem.s_q, d.problem.hidden};
    expect_error("precision", "fp32 only", [&] {
        stages::qkv_projection(select_variant(), bf16, d.inputs().x, d.inputs().x, d.weights(), view(q, shape),
                               view(k, shape), view(v, shape));
    });
}

// The bf16 layer against the fp32 reference: a bound derived from the rounding. With
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
// The bound is 6 sd (a Gaussian tail of 2e-9 per element) plus the accuracy rule's allowance
// for evaluating in f32 (2 × the plain float32 error + 1e-5).
std::vector<double> fp32_bound(const Problem &p, const LayerData &d, const reference::LayerOutputs<double> &r) {
    const double u = 0x1p-8, pair = u * std::sqrt(2.0 / 3.0);
    const int64_t B = p.batch, S = p.s_q, H = p.hidden, heads = p.heads, dh = H / heads;
    const int64_t rows = B * S;
    auto projection_sd = [&](const std::vector<float> &a, const std::vector<float> &w) {
        std::vector<double> sd(static_cast<std::size_t>(rows * H));
        for (int64_t row = 0; row < rows; ++row)
            for (int64_t o = 0; o < H; ++o) {
                double s = 0;
                for (int64_t k = 0; k < H; ++k) s += std::pow(double(a[row * H + k]) * double(w[o * H + k]), 2);
                sd[row * H + o] = pair * std::sqrt(s);
            }
        return sd;
    };
    const std::vector<double> sq = projection_sd(d.x, d.w_q), sk = projection_sd(d.x, d.w_k),
                              sv = projection_sd(d.x, d.w_v);
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
                for (int64_t j = 0; j < S; ++j) sp[j] = P[j] * (ss[j] + mixed);
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
    for (int64_t row = 0; row < rows; ++row) {
        for (int64_t o = 0; o < H; ++o) {
            double shared = 0, independent = 0;
            for (int64_t e = 0; e < H; ++e) {
                const double w = double(d.w_o[o * H + e]);
                shared += sc[row * H + e] * std::abs(w);
                independent += std::pow(r.ctx[row * H + e] * w, 2);
            }
            sz[o] = shared + pair * std::sqrt(independent);
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

class Bf16AgainstFp32 : public ::testing::TestWithParam<Problem> {};

TEST_P(Bf16AgainstFp32, WithinTheRoundingBound) {
    const Problem &p = GetParam();
    const LayerData d(p);
    ATTN_SKIP_WITHOUT_BF16(d);
    Config fp32 = p.config();
    const auto exact = reference::attention_layer<double>(fp32, d.weights(), d.inputs());
    const auto plain = reference::attention_layer<float>(fp32, d.weights(), d.inputs());
    const std::vector<double> bound = fp32_bound(p, d, exact);
    double f32_error = 0;
    for (std::size_t i = 0; i < exact.y.size(); ++i)
        f32_error = std::max(f32_error, std::abs(double(plain.y[i]) - exact.y[i]));
    for (const VariantInfo *v : bf16_variants()) {
        if (!v->runnable) continue;
        GuardedOutput y({p.batch, p.s_q, p.hidden});
        Attention(bf16_config(p, true), d.weights(), v->name).forward(d.inputs(), y.view());
        double worst = 0, worst_bound = 0, largest_ratio = 0;
        std::size_t at = 0;
        for (std::size_t i = 0; i < exact.y.size(); ++i) {
            const double error = std::abs(double(y.data()[i]) - exact.y[i]);
            const double allowed = bound[i] + 2 * f32_error + kAbsoluteFloor;
            if (error / allowed > largest_ratio) largest_ratio = error / allowed, worst = error, worst_bound = allowed, at = i;
        }
        std::cout << "[ BF16     ] " << v->name << " " << p.name() << ": largest error against fp32 " << worst
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

INSTANTIATE_TEST_SUITE_P(Problems, Bf16AgainstFp32, ::testing::ValuesIn(against_fp32_problems()),
                         [](const ::testing::TestParamInfo<Problem> &info) { return info.param.name(); });

}  // namespace
}  // namespace attn::testing
