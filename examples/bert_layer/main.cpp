// Runs one BERT-base self-attention layer (random weights, a padded batch) with the
// variant attn picks for this CPU, checks it against attn's float64 reference, and
// shows how a bad argument is reported. Exit status 0 when the output agrees.
#include <attn/attention.h>
#include <attn/reference.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
    const int64_t batch = 2, seq = 128, hidden = 768;
    attn::Config config;  // BERT-base: hidden 768, 12 heads, eps 1e-12

    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto random = [&](int64_t n, float scale) {
        std::vector<float> v(n);
        for (float &e : v) e = scale * normal(rng);
        return v;
    };
    const float w_scale = 1.0f / std::sqrt(float(hidden));
    std::vector<float> w_q = random(hidden * hidden, w_scale), w_k = random(hidden * hidden, w_scale),
                       w_v = random(hidden * hidden, w_scale), w_o = random(hidden * hidden, w_scale);
    std::vector<float> b_q = random(hidden, 0.1f), b_k = random(hidden, 0.1f), b_v = random(hidden, 0.1f),
                       b_o = random(hidden, 0.1f), beta = random(hidden, 0.1f);
    std::vector<float> gamma(hidden, 1.0f);
    std::vector<float> x = random(batch * seq * hidden, 1.0f);
    std::vector<uint8_t> mask(batch * seq, 1);
    std::fill(mask.begin() + seq + 100, mask.end(), 0);  // the second sequence has 100 real tokens

    attn::LayerWeights weights;
    weights.w_q = attn::view(w_q, {hidden, hidden});
    weights.w_k = attn::view(w_k, {hidden, hidden});
    weights.w_v = attn::view(w_v, {hidden, hidden});
    weights.w_o = attn::view(w_o, {hidden, hidden});
    weights.b_q = attn::view(b_q, {hidden});
    weights.b_k = attn::view(b_k, {hidden});
    weights.b_v = attn::view(b_v, {hidden});
    weights.b_o = attn::view(b_o, {hidden});
    weights.gamma = attn::view(gamma, {hidden});
    weights.beta = attn::view(beta, {hidden});

    attn::AttentionInputs inputs;
    inputs.x = attn::view(x, {batch, seq, hidden});
    inputs.key_padding_mask = attn::view(mask, {batch, seq});

    try {
        const attn::Attention layer(config, weights);  // the best variant this CPU runs
        std::printf("variant %s (target %s)\n", layer.variant().name.c_str(), layer.variant().target.c_str());

        std::vector<float> y(x.size());
        layer.forward(inputs, attn::view(y, {batch, seq, hidden}));

        const auto expected = attn::reference::attention_layer<double>(config, weights, inputs);
        double max_error = 0;
        for (std::size_t i = 0; i < y.size(); ++i) max_error = std::max(max_error, std::abs(y[i] - expected.y[i]));
        std::printf("max |y - reference| = %.3g\n", max_error);

        // Bad input is an attn::Error naming the argument, never a crash.
        try {
            std::vector<float> too_small(10);
            layer.forward(inputs, attn::view(too_small, {batch, seq, hidden}));
        } catch (const attn::Error &e) {
            std::printf("refused as expected: %s\n", e.what());
        }
        return max_error < 1e-3 ? 0 : 1;
    } catch (const attn::Error &e) {
        std::fprintf(stderr, "attn error: %s\n", e.what());
        return 2;
    }
}
