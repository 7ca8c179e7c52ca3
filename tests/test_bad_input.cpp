// Malformed calls: each gets attn::Error naming the argument, with the expected and
// actual value in the message, and nothing is written.
#include "attn/generated/dispatch.h"
#include "attn/generated/manifest.h"
#include "attn/internal.h"
#include "support/variant_param.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <regex>

namespace attn::testing {
namespace {

struct BadCall {
    const char *name;
    const char *argument;  // expected Error::argument()
    const char *message;   // a substring the message must contain
    std::function<void(LayerData &, std::vector<float> &y)> call;
};

Problem small_problem() {
    Problem p;
    p.batch = 2, p.s_q = p.s_k = 5, p.hidden = 64, p.heads = 4, p.mask = Mask::padding;
    return p;
}

void forward(LayerData &d, AttentionInputs in, MutableTensor y_view, Config c, MutableTensor probs = {}) {
    Attention(c, d.weights()).forward(in, y_view, probs);
}

MutableTensor y_of(LayerData &d, std::vector<float> &y) {
    return view(y, {d.problem.batch, d.problem.s_q, d.problem.hidden});
}

std::vector<BadCall> bad_calls() {
    using D = LayerData;
    using Y = std::vector<float>;
    return {
        {"heads_not_dividing_hidden", "num_heads", "divisor of hidden_size 64, got 5",
         [](D &d, Y &) {
             Config c = d.problem.config();
             c.num_heads = 5;
             Attention(c, d.weights());
         }},
        {"zero_hidden", "hidden_size", "expected > 0, got 0",
         [](D &d, Y &) {
             Config c = d.problem.config();
             c.hidden_size = 0;
             Attention(c, d.weights());
         }},
        {"negative_eps", "layer_norm_eps", "finite value >= 0",
         [](D &d, Y &) {
             Config c = d.problem.config();
             c.layer_norm_eps = -1;
             Attention(c, d.weights());
         }},
        {"nan_eps", "layer_norm_eps", "finite value >= 0",
         [](D &d, Y &) {
             Config c = d.problem.config();
             c.layer_norm_eps = NAN;
             Attention(c, d.weights());
         }},
        {"w_q_wrong_shape", "w_q", "expected shape [64, 64] [H_out, H_in], got [64, 32]",
         [](D &d, Y &) {
             LayerWeights w = d.weights();
             w.w_q.shape = {64, 32};
             Attention(d.problem.config(), w);
         }},
        {"b_o_wrong_shape", "b_o", "expected shape [64] [H], got [63]",
         [](D &d, Y &) {
             LayerWeights w = d.weights();
             w.b_o.shape = {63};
             Attention(d.problem.config(), w);
         }},
        {"gamma_null", "gamma", "data is null",
         [](D &d, Y &) {
             LayerWeights w = d.weights();
             w.gamma.data = nullptr;
             Attention(d.problem.config(), w);
         }},
        {"w_v_too_small", "w_v", "needs 4096 elements, but the buffer holds 100",
         [](D &d, Y &) {
             LayerWeights w = d.weights();
             w.w_v.size = 100;
             Attention(d.problem.config(), w);
         }},
        {"unknown_variant", "variant", "got 'no_such_variant'",
         [](D &d, Y &) { Attention(d.problem.config(), d.weights(), "no_such_variant"); }},
        {"x_null", "x", "data is null",
         [](D &d, Y &y) {
             auto in = d.inputs();
             in.x.data = nullptr;
             forward(d, in, y_of(d, y), d.problem.config());
         }},
        {"x_rank_2", "x", "expected rank 3 [B, S_q, H], got shape [10, 64]",
         [](D &d, Y &y) {
             auto in = d.inputs();
             in.x.shape = {10, 64};
             forward(d, in, y_of(d, y), d.problem.config());
         }},
        {"x_wrong_hidden", "x", "expected shape [2, 10, 64] [B, S_q, H], got [2, 10, 32]",
         [](D &d, Y &y) {
             auto in = d.inputs();
             in.x.shape = {2, 10, 32};
             forward(d, in, y_of(d, y), d.problem.config());
         }},
        {"x_too_small", "x", "needs 640 elements, but the buffer holds 639",
         [](D &d, Y &y) {
             auto in = d.inputs();
             in.x.size = 639;
             forward(d, in, y_of(d, y), d.problem.config());
         }},
        {"x_zero_length", "x", "expected positive extents",
         [](D &d, Y &y) {
             auto in = d.inputs();
             in.x.shape = {2, 0, 64};
             forward(d, in, y_of(d, y), d.problem.config());
         }},
        {"mask_wrong_length", "key_padding_mask", "expected shape [2, 5] [B, S_k], got [2, 6]",
         [](D &d, Y &y) {
             auto in = d.inputs();
             in.key_padding_mask.shape = {2, 6};
             forward(d, in, y_of(d, y), d.problem.config());
         }},
        {"mask_wrong_batch", "key_padding_mask", "expected shape [2, 5] [B, S_k], got [1, 5]",
         [](D &d, Y &y) {
             auto in = d.inputs();
             in.key_padding_mask.shape = {1, 5};
             forward(d, in, y_of(d, y), d.problem.config());
         }},
        {"mask_null", "key_padding_mask", "data is null",
         [](D &d, Y &y) {
             auto in = d.inputs();
             in.key_padding_mask.data = nullptr;
             forward(d, in, y_of(d, y), d.problem.config());
         }},
        {"bias_wrong_heads", "bias", "[2 or 1, 4 or 1, 5, 5], got [1, 3, 5, 5]",
         [](D &d, Y &y) {
             auto in = d.inputs();
             std::vector<float> bias(3 * 25);
             in.bias = view(bias, {1, 3, 5, 5});
             forward(d, in, y_of(d, y), d.problem.config());
         }},
        {"kv_wrong_hidden", "kv", "expected shape [2, 7, 64] [B, S_k, H], got [2, 7, 48]",
         [](D &d, Y &y) {
             auto in = d.inputs();
             std::vector<float> kv(2 * 7 * 64);
             in.kv = view(kv, {2, 7, 48});
             forward(d, in, y_of(d, y), d.problem.config());
         }},
        {"kv_wrong_batch", "kv", "expected shape [2, 7, 64] [B, S_k, H], got [3, 7, 64]",
         [](D &d, Y &y) {
             auto in = d.inputs();
             std::vector<float> kv(3 * 7 * 64);
             in.kv = view(kv, {3, 7, 64});
             forward(d, in, y_of(d, y), d.problem.config());
         }},
        {"y_wrong_shape", "y", "expected shape [2, 5, 64] [B, S_q, H], got [2, 64, 5]",
         [](D &d, Y &y) {
             forward(d, d.inputs(), view(y, {2, 64, 5}), d.problem.config());
         }},
        {"y_too_small", "y", "needs 640 elements, but the buffer holds 10",
         [](D &d, Y &y) {
             MutableTensor v = y_of(d, y);
             v.size = 10;
             forward(d, d.inputs(), v, d.problem.config());
         }},
        {"y_overlaps_x", "y", "must not overlap an input buffer",
         [](D &d, Y &y) {
             auto in = d.inputs();
             MutableTensor v{d.x.data(), d.x.size(), in.x.shape};
             forward(d, in, v, d.problem.config());
         }},
        {"probs_wrong_shape", "probs", "expected shape [2, 4, 5, 5] [B, heads, S_q, S_k], got [2, 5, 5]",
         [](D &d, Y &y) {
             std::vector<float> probs(2 * 4 * 25);
             forward(d, d.inputs(), y_of(d, y), d.problem.config(), view(probs, {2, 5, 5}));
         }},
        {"probs_beyond_32bit_indexing", "probs", "more than the 2^31 - 1 a Halide buffer can index",
         [](D &d, Y &y) {
             // Views claiming huge buffers: validation must reject them before touching memory.
             const std::size_t claimed = std::numeric_limits<std::size_t>::max();
             AttentionInputs in;
             in.x = {d.x.data(), claimed, {1, 50000, 64}};
             forward(d, in, {y.data(), claimed, {1, 50000, 64}}, d.problem.config(),
                     {y.data(), claimed, {1, 4, 50000, 50000}});
         }},
        {"stage_scores_wrong_heads", "scores", "expected shape [2, 4, 5, 5] [B, heads, S_q, S_k], got [2, 2, 5, 5]",
         [](D &d, Y &y) {
             std::vector<float> q(640), k(640), scores(2 * 2 * 25);
             stages::attention_scores(select_variant(), d.problem.config(), view(q, {2, 5, 64}), view(k, {2, 5, 64}),
                                      {}, view(scores, {2, 2, 5, 5}));
             (void)y;
         }},
        {"stage_ctx_wrong_shape", "ctx", "expected shape [2, 5, 64] [B, S_q, H], got [2, 5, 32]",
         [](D &d, Y &y) {
             std::vector<float> probs(2 * 4 * 25), v(640), ctx(320);
             stages::weighted_sum(select_variant(), d.problem.config(), view(probs, {2, 4, 5, 5}), view(v, {2, 5, 64}),
                                  view(ctx, {2, 5, 32}));
             (void)y;
         }},
        {"core_v_wrong_length", "v", "expected shape [2, 7, 64] [B, S_k, H], got [2, 5, 64]",
         [](D &d, Y &y) {
             std::vector<float> k(2 * 7 * 64), v(640);
             stages::attention_core(select_variant(), d.problem.config(), view(d.x, {2, 5, 64}), view(k, {2, 7, 64}),
                                    view(v, {2, 5, 64}), {}, {}, y_of(d, y));
         }},
        {"core_mask_wrong_shape", "key_padding_mask", "expected shape [2, 5] [B, S_k], got [5, 2]",
         [](D &d, Y &y) {
             std::vector<uint8_t> mask(10, 1);
             stages::attention_core(select_variant(), d.problem.config(), view(d.x, {2, 5, 64}), view(d.x, {2, 5, 64}),
                                    view(d.x, {2, 5, 64}), view(mask, {5, 2}), {}, y_of(d, y));
         }},
        {"core_ctx_overlaps_q", "ctx", "must not overlap an input buffer",
         [](D &d, Y &y) {
             std::vector<float> k(640);
             stages::attention_core(select_variant(), d.problem.config(), view(d.x, {2, 5, 64}), view(k, {2, 5, 64}),
                                    view(k, {2, 5, 64}), {}, {}, {d.x.data(), d.x.size(), {2, 5, 64}});
             (void)y;
         }},
    };
}

void PrintTo(const BadCall &bad, std::ostream *os) { *os << bad.name; }

class BadInputTest : public ::testing::TestWithParam<BadCall> {};

TEST_P(BadInputTest, ThrowsErrorNamingTheArgument) {
    const BadCall &bad = GetParam();
    LayerData data(small_problem());
    std::vector<float> y(std::size_t(2 * 5 * 64), 7.0f);
    try {
        bad.call(data, y);
        FAIL() << "expected attn::Error for argument '" << bad.argument << "'";
    } catch (const Error &e) {
        EXPECT_EQ(e.argument(), bad.argument) << e.what();
        EXPECT_NE(std::string(e.what()).find(bad.message), std::string::npos)
            << "message: " << e.what() << "\nexpected to contain: " << bad.message;
    }
    for (float v : y) ASSERT_EQ(v, 7.0f) << "output written despite the error";
}

INSTANTIATE_TEST_SUITE_P(Table, BadInputTest, ::testing::ValuesIn(bad_calls()),
                         [](const ::testing::TestParamInfo<BadCall> &info) { return std::string(info.param.name); });

TEST(BadInput, VariantThisCpuCannotRunIsRefused) {
    for (const VariantInfo &v : variants()) {
        if (v.runnable) continue;
        LayerData data(small_problem());
        try {
            Attention(data.problem.config(), data.weights(), v.name);
            FAIL() << "variant " << v.name << " cannot run here but was accepted";
        } catch (const Error &e) {
            EXPECT_EQ(e.argument(), "variant");
            EXPECT_NE(std::string(e.what()).find("cannot run here"), std::string::npos) << e.what();
        }
        return;
    }
    GTEST_SKIP() << "every compiled variant runs on this CPU, so none can be refused";
}

TEST(Variants, ListingMatchesThisCpu) {
    ASSERT_FALSE(variants().empty());
    for (const VariantInfo &v : variants()) {
        EXPECT_EQ(v.name, v.schedule + "_" + v.isa);
        EXPECT_EQ(v.runnable, v.not_runnable_reason.empty()) << v.name << ": " << v.not_runnable_reason;
    }
    EXPECT_TRUE(select_variant().runnable);
}

// A VM reports "AMD EPYC" for any Zen: the id (family and model) tells Zen 1 from Zen 4, and a
// measurement is used on a CPU of its name and id first, then one made before ids were recorded.
TEST(Variants, MeasurementsOfThisCpuMatchItsNameAndIdFirst) {
    const std::string id = detail::cpu_id();
    if (!id.empty()) EXPECT_TRUE(std::regex_match(id, std::regex("family \\d+ model \\d+"))) << id;
    for (const manifest::Isa &isa : manifest::kIsas) {
        bool without_id = false;
        for (const manifest::MeasuredOrder *m : detail::measurements_of_this_cpu(isa.name)) {
            EXPECT_EQ(m->cpu_model, detail::cpu_model());
            EXPECT_TRUE(m->isas.contains(isa.name));
            if (*m->cpu_id) {
                EXPECT_EQ(m->cpu_id, id);
                EXPECT_FALSE(without_id) << "an entry with this CPU's id came after one without an id";
            }
            without_id = without_id || !*m->cpu_id;
        }
    }
}

// The default follows a measurement of this CPU that covered its widest instruction set
// (generated/dispatch.json), else the rule, and says which.
TEST(Variants, DefaultFollowsAMeasurementOfThisCpuOrTheRule) {
    const std::string reason = default_variant_reason();
    EXPECT_EQ(reason.rfind(select_variant().name + ": ", 0), 0u) << reason;
    std::string widest;
    int rank = 0;
    for (const VariantInfo &v : variants()) {
        for (const manifest::Isa &isa : manifest::kIsas) {
            if (v.runnable && isa.name == v.isa && isa.dispatch_rank > rank) widest = v.isa, rank = isa.dispatch_rank;
        }
    }
    for (const manifest::MeasuredOrder *m : detail::measurements_of_this_cpu(widest)) {
        for (const char *name : m->order) {
            const auto v = std::find_if(variants().begin(), variants().end(),
                                        [&](const VariantInfo &i) { return i.name == name && i.runnable; });
            if (v == variants().end()) continue;
            EXPECT_EQ(select_variant().name, name) << reason;
            EXPECT_NE(reason.find("measured"), std::string::npos) << reason;
            return;
        }
    }
    EXPECT_EQ(select_variant().isa, widest) << reason;
    EXPECT_NE(reason.find("by rule"), std::string::npos) << reason;
}

}  // namespace
}  // namespace attn::testing
