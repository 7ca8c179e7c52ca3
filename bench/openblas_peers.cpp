#include "openblas_peers.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace attn::bench {

using testing::LayerData;
using testing::Problem;

BlasWorkspace::BlasWorkspace(const Problem &p)
    : q(std::size_t(p.batch * p.s_q * p.hidden)),
      k(std::size_t(p.batch * p.s_k * p.hidden)),
      v(k.size()),
      ctx(q.size()),
      dense(q.size()),
      scores(std::size_t(p.s_q * p.s_k)) {}

namespace {

// out[rows, H] = in[rows, H] · Wᵀ (+ bias rows when given), nn.Linear's layout.
void linear(const float *in, int64_t rows, int64_t hidden, const float *weight, const float *bias, float *out) {
    float beta = 0.0f;
    if (bias) {
        for (int64_t r = 0; r < rows; ++r) std::copy(bias, bias + hidden, out + r * hidden);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(hidden), int(hidden), 1.0f, in, int(hidden),
                weight, int(hidden), beta, out, int(hidden));
}

// scores[S_q, S_k] = alpha · Q_bh · K_bhᵀ, rows of Q and K strided by H.
void head_scores(const Problem &p, const float *q, const float *k, float alpha, float *scores) {
    const int d = int(p.hidden / p.heads), ld = int(p.hidden);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(p.s_q), int(p.s_k), d, alpha, q, ld, k, ld, 0.0f, scores,
                int(p.s_k));
}

// ctx_bh[S_q, d] = P[S_q, S_k] · V_bh[S_k, d], written into the [S_q, H] rows of ctx.
void head_context(const Problem &p, const float *probs, const float *v, float *ctx) {
    const int d = int(p.hidden / p.heads), ld = int(p.hidden);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(p.s_q), d, int(p.s_k), 1.0f, probs, int(p.s_k), v, ld,
                0.0f, ctx, ld);
}

template <typename PerHead>
void for_each_head(const Problem &p, PerHead per_head) {
    const int64_t d = p.hidden / p.heads;
    for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t h = 0; h < p.heads; ++h) {
            per_head(b, h, b * p.s_q * p.hidden + h * d, b * p.s_k * p.hidden + h * d);
        }
    }
}

}  // namespace

void openblas_roofline(Gemms which, const LayerData &data, BlasWorkspace &ws) {
    const Problem &p = data.problem;
    const float *kv = p.cross ? data.kv.data() : data.x.data();
    const bool all = which == Gemms::layer;
    if (all || which == Gemms::qkv_projection) {
        linear(data.x.data(), p.batch * p.s_q, p.hidden, data.w_q.data(), nullptr, ws.q.data());
        linear(kv, p.batch * p.s_k, p.hidden, data.w_k.data(), nullptr, ws.k.data());
        linear(kv, p.batch * p.s_k, p.hidden, data.w_v.data(), nullptr, ws.v.data());
    }
    if (all || which == Gemms::attention_scores || which == Gemms::weighted_sum) {
        for_each_head(p, [&](int64_t, int64_t, int64_t q_off, int64_t kv_off) {
            if (which != Gemms::weighted_sum)
                head_scores(p, ws.q.data() + q_off, ws.k.data() + kv_off, 1.0f, ws.scores.data());
            if (which != Gemms::attention_scores)
                head_context(p, ws.scores.data(), ws.v.data() + kv_off, ws.ctx.data() + q_off);
        });
    }
    if (all || which == Gemms::output_projection) {
        linear(ws.ctx.data(), p.batch * p.s_q, p.hidden, data.w_o.data(), nullptr, ws.dense.data());
    }
}

void openblas_unfused(const LayerData &data, BlasWorkspace &ws, float *y) {
    const Problem &p = data.problem;
    const int64_t H = p.hidden, d = H / p.heads;
    const float *kv = p.cross ? data.kv.data() : data.x.data();
    linear(data.x.data(), p.batch * p.s_q, H, data.w_q.data(), data.b_q.data(), ws.q.data());
    linear(kv, p.batch * p.s_k, H, data.w_k.data(), data.b_k.data(), ws.k.data());
    linear(kv, p.batch * p.s_k, H, data.w_v.data(), data.b_v.data(), ws.v.data());

    const float scale = 1.0f / std::sqrt(float(d));
    for_each_head(p, [&](int64_t b, int64_t h, int64_t q_off, int64_t kv_off) {
        float *scores = ws.scores.data();
        head_scores(p, ws.q.data() + q_off, ws.k.data() + kv_off, scale, scores);
        for (int64_t i = 0; i < p.s_q; ++i) {
            float *row = scores + i * p.s_k;
            const float *bias = p.bias ? data.bias.data() + (h * p.s_q + i) * p.s_k : nullptr;
            auto keep = [&](int64_t j) {
                const bool real = data.mask.empty() || data.mask[std::size_t(b * p.s_k + j)] != 0;
                return real && !(p.causal && j > i + (p.s_k - p.s_q));
            };
            float row_max = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j < p.s_k; ++j) {
                if (bias) row[j] += bias[j];
                if (keep(j)) row_max = std::max(row_max, row[j]);
            }
            float sum = 0.0f;
            for (int64_t j = 0; j < p.s_k; ++j) {
                row[j] = keep(j) ? std::exp(row[j] - row_max) : 0.0f;
                sum += row[j];
            }
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            for (int64_t j = 0; j < p.s_k; ++j) row[j] *= inv;
        }
        head_context(p, scores, ws.v.data() + kv_off, ws.ctx.data() + q_off);
    });

    linear(ws.ctx.data(), p.batch * p.s_q, H, data.w_o.data(), data.b_o.data(), ws.dense.data());
    for (int64_t r = 0; r < p.batch * p.s_q; ++r) {
        float *row = ws.dense.data() + r * H;
        const float *x = data.x.data() + r * H;
        double sum = 0, sum_sq = 0;
        for (int64_t o = 0; o < H; ++o) {
            row[o] += x[o];
            sum += row[o];
        }
        const double mean = sum / double(H);
        for (int64_t o = 0; o < H; ++o) sum_sq += (row[o] - mean) * (row[o] - mean);
        const float inv_std = float(1.0 / std::sqrt(sum_sq / double(H) + 1e-12));
        for (int64_t o = 0; o < H; ++o) {
            y[r * H + o] = data.gamma[std::size_t(o)] * (row[o] - float(mean)) * inv_std + data.beta[std::size_t(o)];
        }
    }
}

Prepared openblas_layer(bool roofline, const testing::ListedProblem &lp) {
    Fixture &f = fixture(lp);
    auto ws = std::make_shared<BlasWorkspace>(lp.problem);
    Prepared prepared;
    if (roofline) {
        prepared.run = [ws, &f] { openblas_roofline(Gemms::layer, f.data, *ws); };
        return prepared;
    }
    auto y = std::make_shared<std::vector<float>>(f.data.x.size());
    prepared.run = [ws, y, &f] { openblas_unfused(f.data, *ws, y->data()); };
    prepared.run();
    if (const detail::CallReference *ref = f.reference(kLayerFunction)) {
        prepared.error = accuracy_error(prepared, y->data(), ref->exact[0], ref->float32[0], "openblas_unfused");
    }
    return prepared;
}

Prepared openblas_stage(Gemms gemms, const testing::ListedProblem &lp) {
    const Fixture &f = fixture(lp);
    auto ws = std::make_shared<BlasWorkspace>(lp.problem);
    return {[ws, gemms, &f] { openblas_roofline(gemms, f.data, *ws); }};
}

}  // namespace attn::bench
