// Measures the smallest extents at which a variant's own kernels run each function, for
// the variants whose schedule source declares min_shapes (manifest.json; README, "Every
// variant on every shape"), and prints the min_shapes entry to declare. The runtime
// never discovers a minimum from an error: it reads the declaration, and the tests hold
// it (AtMinShapes/*). Run this after tools/freeze_schedules.sh changes such a schedule
// (a few minutes per variant under PoCL):
//   attn_min_shapes [VARIANT...]   default: every runnable variant with min_shapes
//
// How: from a shape the kernels run (B=8, S=128, d=64, the fewest of 4, 8, 12, 16
// heads that runs), each dimension is lowered one step at a time while the call runs.
// A bound found by lowering the heads or d is then told apart from one on H = heads·d
// by trying the next lower value with H kept at the bound. Last, the smallest shape
// of the declared box must run.
#include "attn/internal.h"  // detail::register_variant: the kernels without the fallback

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace attn {
namespace {

struct Shape5 {
    int64_t batch, seq_q, seq_k, heads, head_dim;
    int64_t hidden() const { return heads * head_dim; }
};

std::vector<float> random_values(int64_t n) {
    static std::mt19937 generator(1);
    std::uniform_real_distribution<float> uniform(-1, 1);
    std::vector<float> v(std::size_t(n > 0 ? n : 0));
    for (float &x : v) x = uniform(generator);
    return v;
}

// Whether `function` of `variant` runs on a shape (random inputs; the values do not matter).
bool runs(const VariantInfo &variant, const std::string &function, const Shape5 &s) {
    const int64_t B = s.batch, Sq = s.seq_q, Sk = s.seq_k, n = s.heads, H = s.hidden();
    Config config;
    config.hidden_size = H, config.num_heads = n;
    std::vector<std::vector<float>> w;
    for (int i = 0; i < 4; ++i) w.push_back(random_values(H * H));
    for (int i = 0; i < 6; ++i) w.push_back(random_values(H));
    const LayerWeights weights{view(w[0], {H, H}), view(w[4], {H}), view(w[1], {H, H}), view(w[5], {H}),
                               view(w[2], {H, H}), view(w[6], {H}), view(w[3], {H, H}), view(w[7], {H}),
                               view(w[8], {H}),    view(w[9], {H})};
    std::vector<float> x = random_values(B * Sq * H), kv = random_values(B * Sk * H), q = random_values(B * Sq * H),
                       k = random_values(B * Sk * H), v = random_values(B * Sk * H), y = random_values(B * Sq * H),
                       scores = random_values(B * n * Sq * Sk), out = random_values(B * n * Sq * Sk);
    const Shape xs{B, Sq, H}, ks{B, Sk, H}, ss{B, n, Sq, Sk};
    try {
        if (function == "attention_layer" || function == "attention_layer_probs") {
            Attention layer(config, weights, variant.name);
            AttentionInputs in;
            in.x = view(x, xs);
            if (Sq != Sk) in.kv = view(kv, ks);
            layer.forward(in, view(y, xs), function == "attention_layer" ? MutableTensor{} : view(out, ss));
        } else if (function == "qkv_projection") {
            stages::qkv_projection(variant, config, view(x, xs), view(kv, ks), weights, view(q, xs), view(k, ks),
                                   view(v, ks));
        } else if (function == "attention_scores") {
            stages::attention_scores(variant, config, view(q, xs), view(k, ks), {}, view(out, ss));
        } else if (function == "masked_softmax") {
            stages::masked_softmax(variant, config, view(scores, ss), {}, view(out, ss));
        } else if (function == "weighted_sum") {
            stages::weighted_sum(variant, config, view(scores, ss), view(v, ks), view(y, xs));
        } else if (function == "attention_core") {
            stages::attention_core(variant, config, view(q, xs), view(k, ks), view(v, ks), {}, {}, view(y, xs));
        } else if (function == "output_layernorm") {
            stages::output_layernorm(variant, config, view(q, xs), view(x, xs), weights, view(y, xs));
        } else {
            return false;
        }
    } catch (const Error &) {
        return false;
    }
    return true;
}

// The smallest value v <= top of a dimension such that every value in [v, top] runs.
template <typename Make>
int64_t lowest_running(const VariantInfo &own, const std::string &function, int64_t top, Make make) {
    int64_t m = top;
    while (m > 1 && runs(own, function, make(m - 1))) --m;
    return m;
}

// The min_shapes of one function, as a JSON object (dimensions at 1 left out); empty
// when no starting shape runs or the box's smallest shape does not.
std::string measure(const VariantInfo &own, const std::string &function) {
    Shape5 base{8, 128, 128, 0, 64};
    for (int64_t heads : {4, 8, 12, 16}) {
        base.heads = heads;
        if (runs(own, function, base)) break;
        base.heads = 0;
    }
    if (!base.heads) return "";
    auto with = [&](int64_t Shape5::*d) {
        return [&, d](int64_t value) {
            Shape5 s = base;
            s.*d = value;
            return s;
        };
    };
    ProblemExtents m;
    m.batch = lowest_running(own, function, base.batch, with(&Shape5::batch));
    m.seq_q = lowest_running(own, function, base.seq_q, with(&Shape5::seq_q));
    m.seq_k = lowest_running(own, function, base.seq_k, with(&Shape5::seq_k));
    const int64_t heads = lowest_running(own, function, base.heads, with(&Shape5::heads));
    const int64_t head_dim = lowest_running(own, function, base.head_dim, with(&Shape5::head_dim));
    // Is the heads bound one on H? One head fewer with d raised to keep H at heads·64 tells.
    if (heads > 1) {
        const int64_t h_bound = heads * base.head_dim;
        Shape5 s = base;
        s.heads = heads - 1, s.head_dim = (h_bound + s.heads - 1) / s.heads;
        if (runs(own, function, s))
            m.hidden = std::max(m.hidden, h_bound);
        else
            m.heads = heads;
    }
    // And the head_dim bound: d one lower with twice the heads.
    if (head_dim > 1) {
        const int64_t h_bound = base.heads * head_dim;
        Shape5 s = base;
        s.head_dim = head_dim - 1, s.heads = 2 * base.heads;
        if (runs(own, function, s))
            m.hidden = std::max(m.hidden, h_bound);
        else
            m.head_dim = head_dim;
    }
    Shape5 corner{m.batch, m.seq_q, m.seq_k, m.heads, 0};
    corner.head_dim = std::max(m.head_dim, (m.hidden + m.heads - 1) / m.heads);
    if (!runs(own, function, corner)) return "";
    std::string json;
    for (const ProblemDimension &d : kProblemDimensions) {
        const int64_t value = m.*d.extent;
        if (value > 1) json += std::string(json.empty() ? "" : ", ") + "\"" + d.name + "\": " + std::to_string(value);
    }
    return "{" + json + "}";
}

int run(const std::vector<std::string> &names) {
    int failures = 0;
    for (const VariantInfo &v : variants()) {
        const bool named = std::find(names.begin(), names.end(), v.name) != names.end();
        if (names.empty() ? v.min_shapes.empty() || !v.runnable : !named) continue;
        if (!v.runnable) {
            std::fprintf(stderr, "%s cannot run here: %s\n", v.name.c_str(), v.not_runnable_reason.c_str());
            ++failures;
            continue;
        }
        // The same compiled functions under a source with no min_shapes: never the fallback.
        VariantInfo own_info = v;
        own_info.name = "own_kernels_of_" + v.name;
        own_info.schedule = "own_kernels";
        const VariantInfo &own = detail::register_variant(own_info, detail::runnable_functions(v));
        std::printf("%s (its source's min_shapes entry for the ISA it was frozen for):\n", v.name.c_str());
        for (const std::string &function : v.functions) {
            if (function.find("packed") != std::string::npos) continue;  // extents vary by sequence
            const std::string json = measure(own, function);
            std::printf("  \"%s\": %s\n", function.c_str(), json.empty() ? "no shape found that runs" : json.c_str());
            std::fflush(stdout);
            failures += json.empty();
        }
    }
    return failures ? 1 : 0;
}

}  // namespace
}  // namespace attn

int main(int argc, char **argv) { return attn::run(std::vector<std::string>(argv + 1, argv + argc)); }
