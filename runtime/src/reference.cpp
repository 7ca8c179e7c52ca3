#include "attn/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace attn::reference {

}  // namespace attn::reference

namespace attn {

uint16_t bf16_bits(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if (std::isnan(f)) return uint16_t((bits >> 16) | 0x40);  // quiet, sign kept
    bits += 0x7fff + ((bits >> 16) & 1);                        // to nearest, ties to even
    return uint16_t(bits >> 16);
}

float round_to_bf16(float f) {
    const uint32_t bits = uint32_t(bf16_bits(f)) << 16;
    float out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
}

Int8Weight quantize_int8(const ConstTensor &weight, const char *name) {
    const int64_t out = weight.shape.at(0), in = weight.shape.at(1);
    for (int64_t i = 0; i < out * in; ++i) {
        if (!std::isfinite(weight.data[i]))
            throw Error(name, "expected finite values to quantize to int8, got " + std::to_string(weight.data[i]) +
                                  " at [" + std::to_string(i / in) + ", " + std::to_string(i % in) + "]");
    }
    Int8Weight q;
    q.values.resize(std::size_t(out * in));
    q.scales.resize(std::size_t(out));
    q.sums.resize(std::size_t(out));
    for (int64_t o = 0; o < out; ++o) {
        const float *row = weight.data + o * in;
        float largest = 0;
        for (int64_t i = 0; i < in; ++i) largest = std::max(largest, std::abs(row[i]));
        constexpr float limit = float(kInt8WeightLimit);
        const float scale = largest / limit > 0 ? largest / limit : 1.0f;  // (1 for zeros, or if it underflows)
        int32_t sum = 0;
        for (int64_t i = 0; i < in; ++i) {
            const auto v = int8_t(std::clamp(std::nearbyint(row[i] / scale), -limit, limit));
            q.values[std::size_t(o * in + i)] = v;
            sum += v;
        }
        q.scales[std::size_t(o)] = scale;
        q.sums[std::size_t(o)] = sum;
    }
    return q;
}

// As attn_gen::quantized_to_u8 computes it, operation for operation in f32.
QuantizedRow quantize_row_u8(const float *x, int64_t size, uint8_t *values) {
    QuantizedRow row;
    if (std::any_of(x, x + size, [](float v) { return !std::isfinite(v); })) {
        // The whole row's projection NaN, as in fp32 (the values are unused).
        std::fill(values, values + size, uint8_t(0));
        row.step = std::numeric_limits<float>::quiet_NaN();
        return row;
    }
    float low = 0, high = 0;
    for (int64_t i = 0; i < size; ++i) low = std::min(low, x[i]), high = std::max(high, x[i]);
    const float range = high - low, inverse = range > 0 ? 255.0f / range : 1.0f;
    const bool invertible = range > 0 && std::isfinite(inverse);
    const float inverse_step = invertible ? inverse : 1.0f;
    row.step = invertible ? range * (1.0f / 255.0f) : 1.0f;
    row.zero = std::clamp(int32_t(std::nearbyint(-low * inverse_step)), 0, 255);
    for (int64_t i = 0; i < size; ++i)
        values[i] = uint8_t(std::clamp(int32_t(std::nearbyint(x[i] * inverse_step)) + row.zero, 0, 255));
    return row;
}

}  // namespace attn

namespace attn::reference {

int64_t element_count_of(const ConstTensor &t) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    return n;
}

namespace {
// acc[o] += x · weight row o, for each of `outputs` rows of `inputs` values, `row_stride` apart;
// each sum adds its products in order of k, so a result is the plain loop's. Eight outputs are
// summed side by side: their sums do not wait on each other's additions (the tests' time is
// mostly here).
template <typename T, typename W>
void add_products(const T *x, const W *weight, int64_t row_stride, int64_t outputs, int64_t inputs, T *acc) {
    constexpr int64_t side_by_side = 8;
    for (int64_t o0 = 0; o0 < outputs; o0 += side_by_side) {
        const int64_t n = std::min(side_by_side, outputs - o0);
        T sum[side_by_side];
        const W *w[side_by_side];
        for (int64_t i = 0; i < n; ++i) sum[i] = acc[o0 + i], w[i] = weight + (o0 + i) * row_stride;
        if (n == side_by_side) {
            for (int64_t k = 0; k < inputs; ++k)
                for (int64_t i = 0; i < side_by_side; ++i) sum[i] += x[k] * T(w[i][k]);
        } else {
            for (int64_t i = 0; i < n; ++i)
                for (int64_t k = 0; k < inputs; ++k) sum[i] += x[k] * T(w[i][k]);
        }
        for (int64_t i = 0; i < n; ++i) acc[o0 + i] = sum[i];
    }
}
}  // namespace

template <typename T>
std::vector<T> linear(const std::vector<T> &in, int64_t rows, const ConstTensor &weight, const ConstTensor &bias) {
    const int64_t out_features = weight.shape[0], in_features = weight.shape[1];
    std::vector<T> out(std::size_t(rows * out_features));
    for (int64_t r = 0; r < rows; ++r) {
        T *y = out.data() + r * out_features;
        for (int64_t o = 0; o < out_features; ++o) y[o] = T(bias.data[o]);
        add_products(in.data() + r * in_features, weight.data, in_features, out_features, in_features, y);
    }
    return out;
}

namespace {
const double kLn2 = 0.693147180559945309;
bool bf16_core(const Config &config) {
    return config.precision != Precision::fp32 && reduced_precision(config.precision).bf16_core();
}
// What a bf16 core's exponentials are taken from: the max rounded up to a multiple of ln 2,
// never below the max (in float the product may round under it), or the max itself beyond
// ±1e30 (attn_gen::flash_attention's block_offset).
template <typename T>
T weight_offset(T row_max) {
    return std::abs(row_max) > T(1e30) ? row_max : std::max(std::ceil(row_max / T(kLn2)) * T(kLn2), row_max);
}
// The core's operands in its precision: themselves, or each rounded to bf16.
template <typename T>
std::vector<T> core_operand(const Config &config, std::vector<T> values) {
    if (bf16_core(config))
        for (T &v : values) v = T(round_to_bf16(float(v)));
    return values;
}
}  // namespace

template <typename T>
std::vector<T> attention_scores(const Config &config, Sizes sz, const std::vector<T> &q, const std::vector<T> &k,
                                const ConstTensor &bias) {
    const int64_t H = config.hidden_size, heads = config.num_heads, d = config.head_dim();
    const T scale = T(1) / std::sqrt(T(d));
    std::vector<T> scores(std::size_t(sz.batch * heads * sz.s_q * sz.s_k));
    for (int64_t b = 0; b < sz.batch; ++b)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < sz.s_q; ++i) {
                T *dots = scores.data() + ((b * heads + h) * sz.s_q + i) * sz.s_k;  // zeros, then q_i · k_j
                add_products(q.data() + (b * sz.s_q + i) * H + h * d, k.data() + b * sz.s_k * H + h * d, H, sz.s_k, d,
                             dots);
                for (int64_t j = 0; j < sz.s_k; ++j) {
                    T s = dots[j] * scale;
                    if (!bias.empty()) {
                        const int64_t bb = bias.shape[0] == 1 ? 0 : b, hb = bias.shape[1] == 1 ? 0 : h;
                        s += T(bias.data[((bb * bias.shape[1] + hb) * sz.s_q + i) * sz.s_k + j]);
                    }
                    dots[j] = s;
                }
            }
    return scores;
}

template <typename T>
std::vector<T> masked_softmax(const Config &config, Sizes sz, const std::vector<T> &scores,
                              const MaskTensor &key_padding_mask) {
    const bool bf16 = bf16_core(config);
    const int64_t heads = config.num_heads;
    std::vector<T> probs(scores.size(), T(0));
    std::vector<char> keep(std::size_t(sz.s_k));
    for (int64_t b = 0; b < sz.batch; ++b)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < sz.s_q; ++i) {
                const int64_t row = ((b * heads + h) * sz.s_q + i) * sz.s_k;
                bool any = false;
                T row_max = -std::numeric_limits<T>::infinity();
                for (int64_t j = 0; j < sz.s_k; ++j) {
                    const bool padded = !key_padding_mask.empty() && key_padding_mask.data[b * sz.s_k + j] == 0;
                    const bool future = config.causal && j > i + (sz.s_k - sz.s_q);
                    keep[j] = !padded && !future;
                    if (keep[j]) {
                        any = true;
                        row_max = std::max(row_max, scores[row + j]);
                    }
                }
                if (!any) continue;  // fully masked row: zeros
                // A bf16 core's weights are rounded to bf16 before they are summed and weight V,
                // taken from a multiple of ln 2 (any: a power of 2 does not change the rounding).
                const T offset = bf16 ? weight_offset(row_max) : row_max;
                T sum = 0;
                for (int64_t j = 0; j < sz.s_k; ++j) {
                    if (!keep[j]) continue;
                    T weight = std::exp(scores[row + j] - offset);
                    if (bf16) weight = T(round_to_bf16(float(weight)));
                    sum += (probs[row + j] = weight);
                }
                for (int64_t j = 0; j < sz.s_k; ++j) probs[row + j] /= sum;
            }
    return probs;
}

template <typename T>
std::vector<T> weighted_sum(const Config &config, Sizes sz, const std::vector<T> &probs, const std::vector<T> &v) {
    const int64_t H = config.hidden_size, heads = config.num_heads, d = config.head_dim();
    std::vector<T> ctx(std::size_t(sz.batch * sz.s_q * H), T(0));
    // Each context element sums its products in order of j; all d of a row at once, so that V
    // is read along its rows.
    for (int64_t b = 0; b < sz.batch; ++b)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < sz.s_q; ++i) {
                T *acc = ctx.data() + (b * sz.s_q + i) * H + h * d;
                const T *p = probs.data() + ((b * heads + h) * sz.s_q + i) * sz.s_k;
                for (int64_t j = 0; j < sz.s_k; ++j) {
                    const T *vj = v.data() + (b * sz.s_k + j) * H + h * d;
                    for (int64_t e = 0; e < d; ++e) acc[e] += p[j] * vj[e];
                }
            }
    return ctx;
}

template <typename T>
std::vector<T> attention_core(const Config &config, Sizes sz, const std::vector<T> &q, const std::vector<T> &k,
                              const std::vector<T> &v, const MaskTensor &key_padding_mask, const ConstTensor &bias) {
    const std::vector<T> scores =
        attention_scores(config, sz, core_operand(config, q), core_operand(config, k), bias);
    return weighted_sum(config, sz, masked_softmax(config, sz, scores, key_padding_mask), core_operand(config, v));
}

template <typename T>
std::vector<T> output_layernorm(const Config &config, Sizes sz, const std::vector<T> &ctx, const std::vector<T> &x,
                                const LayerWeights &w) {
    const int64_t H = config.hidden_size, rows = sz.batch * sz.s_q;
    std::vector<T> z = linear(ctx, rows, w.w_o, w.b_o);
    std::vector<T> y(z.size());
    for (int64_t r = 0; r < rows; ++r) {
        T mean = 0, var = 0;
        for (int64_t o = 0; o < H; ++o) mean += (z[r * H + o] += x[r * H + o]);
        mean /= T(H);
        for (int64_t o = 0; o < H; ++o) var += (z[r * H + o] - mean) * (z[r * H + o] - mean);
        var /= T(H);
        const T inv_std = T(1) / std::sqrt(var + T(config.layer_norm_eps));
        for (int64_t o = 0; o < H; ++o)
            y[r * H + o] = T(w.gamma.data[o]) * (z[r * H + o] - mean) * inv_std + T(w.beta.data[o]);
    }
    return y;
}

template <typename T>
std::vector<T> gemm_input(const Config &config, std::vector<T> values, int64_t features) {
    if (config.precision == Precision::bf16) {
        for (T &v : values) v = T(round_to_bf16(float(v)));
    } else if (config.precision == Precision::int8) {
        std::vector<float> row(static_cast<std::size_t>(features));
        std::vector<uint8_t> q(static_cast<std::size_t>(features));
        for (std::size_t start = 0; start < values.size(); start += std::size_t(features)) {
            for (int64_t i = 0; i < features; ++i) row[std::size_t(i)] = float(values[start + std::size_t(i)]);
            const QuantizedRow r = quantize_row_u8(row.data(), features, q.data());
            for (int64_t i = 0; i < features; ++i)
                values[start + std::size_t(i)] = T(r.step) * T(int32_t(q[std::size_t(i)]) - r.zero);
        }
    }
    return values;
}

LayerWeights gemm_weights(const Config &config, const LayerWeights &w, std::vector<std::vector<float>> &rounded) {
    if (config.precision == Precision::fp32) return w;
    LayerWeights out = w;
    for (ConstTensor LayerWeights::*m : {&LayerWeights::w_q, &LayerWeights::w_k, &LayerWeights::w_v, &LayerWeights::w_o}) {
        const ConstTensor &t = w.*m;
        if (config.precision == Precision::int8) {
            const Int8Weight q = quantize_int8(t);
            const int64_t in = t.shape[1];
            std::vector<float> &d = rounded.emplace_back(q.values.size());
            for (std::size_t i = 0; i < d.size(); ++i) d[i] = q.scales[i / std::size_t(in)] * float(q.values[i]);
        } else {
            rounded.push_back(gemm_input(config, std::vector<float>(t.data, t.data + element_count_of(t)), 1));
        }
        out.*m = ConstTensor{rounded.back().data(), rounded.back().size(), t.shape};
    }
    return out;
}

template <typename T>
LayerOutputs<T> attention_layer(const Config &config, const LayerWeights &given, const AttentionInputs &in) {
    const bool cross = !in.kv.empty();
    Sizes sz{in.x.shape[0], in.x.shape[1], cross ? in.kv.shape[1] : in.x.shape[1]};
    std::vector<std::vector<float>> rounded;
    rounded.reserve(4);
    const LayerWeights w = gemm_weights(config, given, rounded);
    const std::vector<T> x = widen<T>(in.x), kv = cross ? widen<T>(in.kv) : x;
    const int64_t H = config.hidden_size;
    const std::vector<T> x_in = gemm_input(config, x, H), kv_in = gemm_input(config, kv, H);
    LayerOutputs<T> out;
    out.q = linear(x_in, sz.batch * sz.s_q, w.w_q, w.b_q);
    out.k = linear(kv_in, sz.batch * sz.s_k, w.w_k, w.b_k);
    out.v = linear(kv_in, sz.batch * sz.s_k, w.w_v, w.b_v);
    out.scores = attention_scores(config, sz, core_operand(config, out.q), core_operand(config, out.k), in.bias);
    out.probs = masked_softmax(config, sz, out.scores, in.key_padding_mask);
    out.ctx = weighted_sum(config, sz, out.probs, core_operand(config, out.v));
    out.y = output_layernorm(config, sz, gemm_input(config, out.ctx, H), x, w);
    return out;
}

template <typename T>
PackedOutputs<T> attention_layer_packed(const Config &config, const LayerWeights &w, const PackedInputs &in) {
    const int64_t H = config.hidden_size;
    const int64_t B = in.sequence_offsets.shape[0] - 1;
    PackedOutputs<T> out;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t start = in.sequence_offsets.data[b], L = in.sequence_offsets.data[b + 1] - start;
        if (L == 0) continue;
        AttentionInputs one;
        one.x = {in.x.data + start * H, std::size_t(L * H), {1, L, H}};
        // The bias's top-left L x L corner of each head.
        std::vector<float> bias;
        if (!in.bias.empty()) {
            const int64_t bias_heads = in.bias.shape[0], side = in.bias.shape[1];
            for (int64_t h = 0; h < bias_heads; ++h)
                for (int64_t i = 0; i < L; ++i) {
                    const float *row = in.bias.data + (h * side + i) * side;
                    bias.insert(bias.end(), row, row + L);
                }
            one.bias = {bias.data(), bias.size(), {1, bias_heads, L, L}};
        }
        const LayerOutputs<T> dense = attention_layer<T>(config, w, one);
        if constexpr (std::is_same_v<T, double>) {
            if (config.precision != Precision::fp32) {
                const std::vector<double> a = context_allowance(config, w, one, dense, attention_layer<float>(config, w, one));
                out.allowance.insert(out.allowance.end(), a.begin(), a.end());
            }
        }
        out.y.insert(out.y.end(), dense.y.begin(), dense.y.end());
        out.probs.insert(out.probs.end(), dense.probs.begin(), dense.probs.end());
    }
    return out;
}

#define ATTN_INSTANTIATE(T)                                                                                         \
    template std::vector<T> linear(const std::vector<T> &, int64_t, const ConstTensor &, const ConstTensor &);      \
    template std::vector<T> attention_scores(const Config &, Sizes, const std::vector<T> &, const std::vector<T> &, \
                                             const ConstTensor &);                                                  \
    template std::vector<T> masked_softmax(const Config &, Sizes, const std::vector<T> &, const MaskTensor &);      \
    template std::vector<T> weighted_sum(const Config &, Sizes, const std::vector<T> &, const std::vector<T> &);    \
    template std::vector<T> attention_core(const Config &, Sizes, const std::vector<T> &, const std::vector<T> &,   \
                                           const std::vector<T> &, const MaskTensor &, const ConstTensor &);        \
    template std::vector<T> output_layernorm(const Config &, Sizes, const std::vector<T> &, const std::vector<T> &, \
                                             const LayerWeights &);                                                 \
    template std::vector<T> gemm_input(const Config &, std::vector<T>, int64_t);                                 \
    template LayerOutputs<T> attention_layer(const Config &, const LayerWeights &, const AttentionInputs &);        \
    template PackedOutputs<T> attention_layer_packed(const Config &, const LayerWeights &, const PackedInputs &);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

namespace {
double bf16_of(double c) {  // c rounded to bf16's 8 significant bits, to nearest even (no f32 step)
    if (c == 0 || !std::isfinite(c)) return c;
    int e;
    const double f = std::frexp(c, &e);
    return std::ldexp(std::nearbyint(std::ldexp(f, 8)), e - 8);
}
// How far c's bf16 rounding may move if c moves by up to eta: 0 unless c lies within eta of a
// midpoint between bf16 neighbours, else the larger step to a neighbour (so just above a power
// of 2, where the neighbour below is half an ulp away, the smaller step counts too).
double bf16_flip(double c, double eta) {
    if (c == 0 || !std::isfinite(c)) return 0;
    const double here = bf16_of(c), below = bf16_of(c - eta), above = bf16_of(c + eta);
    return std::max(std::abs(below - here), std::abs(above - here));
}

// A bf16 core's share of η (context_allowance): per element of the context, how far an
// implementation's may move because one of its own roundings to bf16 goes the other way
// where the reference's value lies near a midpoint (within η: twice the plain f32 error, and
// for a weight also its exponential's error, 5e-7 relatively, and that of its offset in f32,
// the score's plain f32 error taken on the rounded operands). A flip of q or k by one
// ulp moves the scores by a_j (|Δs| of the flipped features' products); weights P·e^a
// renormalized move each P_j by a ratio within [e^-|a_j| / Σ P·e^|a|, e^(|a_j| + Σ P·|a|)];
// a flipped weight r_j moves by one ulp, at most 2^-7·r_j, which moves c by
// Δr·(v_j − c)/(Σr + Δr), at most P_j·2^-7·(1 + 2^-6)·|v_j − c|; so Δc_e <= Σ_j |ΔP_j|·|v_je − c_e|
// + Σ_(v_je flipped) P_j·ulp(v_je), plus twice the plain f32 error of the core's sums on the
// reference's rounded operands.
// `given`: q, k and v are the caller's f32 values (the core alone), which an implementation
// rounds exactly as the reference does, so they never round the other way.
std::vector<double> core_rounding_eta(const Config &config, Sizes sz, const LayerOutputs<double> &exact,
                                      const LayerOutputs<float> &float32, bool given = false) {
    const int64_t H = config.hidden_size, heads = config.num_heads, d = config.head_dim();
    const double scale = 1 / std::sqrt(double(d));
    std::vector<double> eta(exact.ctx.size(), 0.0);
    // How far each element of q, k, v may round the other way (bf16_flip), else 0.
    auto flips = [given](const std::vector<double> &x, const std::vector<float> &x32) {
        std::vector<double> f(x.size(), 0.0);
        for (std::size_t i = 0; i < x.size() && !given; ++i) {
            const double c = x[i], err = 2 * std::abs(double(x32[i]) - c) + 1e-7 * std::abs(c);
            f[i] = bf16_flip(c, err);
        }
        return f;
    };
    const std::vector<double> fq = flips(exact.q, float32.q), fk = flips(exact.k, float32.k),
                              fv = flips(exact.v, float32.v);
    // The reference's rounded operands, for the plain f32 error of the core's sums on them.
    const std::vector<double> q = core_operand(config, exact.q), k = core_operand(config, exact.k),
                              v = core_operand(config, exact.v);
    std::vector<double> a(std::size_t(sz.s_k)), change(std::size_t(sz.s_k)), dot_error(std::size_t(sz.s_k));
    std::vector<float> weight32(static_cast<std::size_t>(sz.s_k)), context32(static_cast<std::size_t>(d));
    std::vector<double> moved(static_cast<std::size_t>(d));
    for (int64_t b = 0; b < sz.batch; ++b)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < sz.s_q; ++i) {
                const int64_t row = ((b * heads + h) * sz.s_q + i) * sz.s_k, qi = (b * sz.s_q + i) * H + h * d;
                const double *P = &exact.probs[std::size_t(row)];
                double row_max = -std::numeric_limits<double>::infinity();
                for (int64_t j = 0; j < sz.s_k; ++j)
                    if (P[j] > 0) row_max = std::max(row_max, exact.scores[std::size_t(row + j)]);
                if (!std::isfinite(row_max)) continue;
                const double offset = weight_offset(row_max);
                double mean_a = 0, z_plus = 0;
                // Four keys side by side (q's element read once for them), each key's sums in
                // order of e, as one key at a time would add them.
                constexpr int64_t side_by_side = 4;
                for (int64_t j0 = 0; j0 < sz.s_k; j0 += side_by_side) {
                    const int64_t n = std::min(side_by_side, sz.s_k - j0), k0 = (b * sz.s_k + j0) * H + h * d;
                    double aj[side_by_side] = {}, dot[side_by_side] = {};
                    float dot32[side_by_side] = {};
                    for (int64_t e = 0; e < d; ++e) {
                        const double fq_e = fq[qi + e], q_abs = std::abs(exact.q[qi + e]), q_e = q[qi + e];
                        for (int64_t t = 0; t < n; ++t) {
                            const int64_t kx = k0 + t * H + e;
                            aj[t] += fq_e * (std::abs(exact.k[kx]) + fk[kx]) + fk[kx] * q_abs;
                            dot[t] += q_e * k[kx], dot32[t] += float(q_e) * float(k[kx]);
                        }
                    }
                    for (int64_t t = 0; t < n; ++t) {
                        const int64_t j = j0 + t;
                        a[j] = aj[t] * scale;
                        // The plain f32 error of the score from the same rounded operands.
                        dot_error[j] = std::abs(double(dot32[t]) - dot[t]) * scale;
                        mean_a += P[j] * a[j];
                        z_plus += P[j] * std::exp(a[j]);
                    }
                }
                float weight_sum32 = 0;
                for (int64_t j = 0; j < sz.s_k; ++j) {
                    change[j] = 0, weight32[j] = 0;
                    if (P[j] == 0) continue;
                    const double s = exact.scores[std::size_t(row + j)], w = std::exp(s - offset);
                    const double score_error = a[j] + 2 * dot_error[j] + 0x1p-23 * std::abs(s);
                    const double w_eta = w * (score_error + 5e-7 + 0x1p-23 * (std::abs(s) + std::abs(offset)));
                    const double ratio = std::max(std::exp(a[j] + mean_a) - 1, 1 - std::exp(-a[j]) / z_plus);
                    change[j] = P[j] * (ratio + bf16_flip(w, w_eta) / w * (1 + 0x1p-6));
                    weight32[j] = round_to_bf16(float(w));
                    weight_sum32 += weight32[j];
                }
                // Each element's sums in order of j, all d of the row at once (V read along its rows).
                std::fill(moved.begin(), moved.end(), 0.0);
                std::fill(context32.begin(), context32.end(), 0.0f);
                for (int64_t j = 0; j < sz.s_k; ++j) {
                    const int64_t vj = (b * sz.s_k + j) * H + h * d;
                    for (int64_t e = 0; e < d; ++e) {
                        moved[e] += change[j] * std::abs(exact.v[vj + e] - exact.ctx[qi + e]) + P[j] * fv[vj + e];
                        if (P[j] > 0) context32[e] += weight32[j] * float(v[vj + e]);
                    }
                }
                for (int64_t e = 0; e < d; ++e) {
                    // And twice the plain f32 error of the core's sums on the same rounded operands
                    // (the f32 reference's own error would count its own roundings' flips).
                    const double c = exact.ctx[qi + e];
                    eta[qi + e] = moved[e] + (weight_sum32 > 0 ? 2 * std::abs(double(context32[e] / weight_sum32) - c) : 0.0);
                }
            }
    return eta;
}
}  // namespace

std::vector<double> core_allowance(const Config &config, Sizes sz, const ConstTensor &q, const ConstTensor &k,
                                   const ConstTensor &v, const MaskTensor &key_padding_mask, const ConstTensor &bias) {
    if (!bf16_core(config)) return {};
    // The core's part of a layer's outputs, from these q, k and v.
    auto core = [&](auto t) {
        using T = decltype(t);
        LayerOutputs<T> out;
        out.q = widen<T>(q), out.k = widen<T>(k), out.v = widen<T>(v);
        out.scores = attention_scores(config, sz, core_operand(config, out.q), core_operand(config, out.k), bias);
        out.probs = masked_softmax(config, sz, out.scores, key_padding_mask);
        out.ctx = weighted_sum(config, sz, out.probs, core_operand(config, out.v));
        return out;
    };
    return core_rounding_eta(config, sz, core(double()), core(float()), true);
}

std::vector<double> context_allowance(const Config &config, const LayerWeights &given, const AttentionInputs &inputs,
                                      const LayerOutputs<double> &exact, const LayerOutputs<float> &float32) {
    if (config.precision == Precision::fp32) return {};
    const Sizes sz{inputs.x.shape[0], inputs.x.shape[1], inputs.kv.empty() ? inputs.x.shape[1] : inputs.kv.shape[1]};
    const bool bf16 = bf16_core(config);
    const std::vector<double> core_eta =
        bf16 ? core_rounding_eta(config, sz, exact, float32) : std::vector<double>(exact.ctx.size(), 0.0);
    const bool int8 = config.precision == Precision::int8;
    std::vector<std::vector<float>> rounded;
    const LayerWeights w = gemm_weights(config, given, rounded);
    const int64_t H = config.hidden_size, rows = int64_t(exact.ctx.size()) / H;
    double max_v = 0;
    for (double v : exact.v) max_v = std::max(max_v, std::abs(v));
    std::vector<double> allowance(exact.y.size(), 0.0);
    std::vector<double> shift(static_cast<std::size_t>(H)), z(static_cast<std::size_t>(H));
    std::vector<float> row(static_cast<std::size_t>(H));
    std::vector<uint8_t> values(static_cast<std::size_t>(H));
    const std::vector<double> ctx_in = gemm_input(config, exact.ctx, H);  // as the exact reference's projection reads it
    for (int64_t r = 0; r < rows; ++r) {
        std::fill(shift.begin(), shift.end(), 0.0);
        // η: how far an implementation's context element may lie from the exact one.
        auto eta_of = [&](int64_t e) {
            // (A bf16 core's own f32 error is in core_eta.)
            const double f32_error = bf16 ? 0 : 2 * std::abs(double(float32.ctx[r * H + e]) - exact.ctx[r * H + e]);
            return f32_error + 1e-6 * max_v + core_eta[r * H + e];
        };
        if (int8) {
            // The row's quantization (QuantizedRows): an element moves to the other side of a
            // rounding midpoint of c · inverse_step when its own error or the range's (low and
            // high each move by at most max η, so inverse_step by a relative 2·max η / range)
            // carries it there; it then moves z by one step times |W_o|. The step itself moves
            // z by that relative change; a zero point near a midpoint moves the clamped ends.
            for (int64_t e = 0; e < H; ++e) row[std::size_t(e)] = float(exact.ctx[r * H + e]);
            const QuantizedRow q = quantize_row_u8(row.data(), H, values.data());
            // The range's ends move only as far as the elements that may become them: the new low
            // lies in [min(0, min(c − η)), min(0, c_min + η_min)], the high likewise.
            double low = 0, high = 0, low_reach = 0, high_reach = 0, eta_low = 0, eta_high = 0;
            for (int64_t e = 0; e < H; ++e) {
                const double c = double(row[std::size_t(e)]), eta = eta_of(e);
                if (c < low) low = c, eta_low = eta;
                if (c > high) high = c, eta_high = eta;
                low_reach = std::min(low_reach, c - eta), high_reach = std::max(high_reach, c + eta);
            }
            if (high == low) continue;
            const double low_moves = std::max(low - low_reach, std::min(0.0, low + eta_low) - low),
                         high_moves = std::max(high_reach - high, high - std::max(0.0, high - eta_high));
            const double inverse_step = 255.0 / (high - low), relative = (low_moves + high_moves) / (high - low);
            auto near_midpoint = [](double t, double window) { return std::abs(t - std::floor(t) - 0.5) < window; };
            const bool zero_moves = near_midpoint(-low * inverse_step, -low * inverse_step * relative + low_moves * inverse_step);
            for (int64_t e = 0; e < H; ++e) {
                const double t = exact.ctx[r * H + e] * inverse_step;
                const bool end = values[std::size_t(e)] == 0 || values[std::size_t(e)] == 255;
                if (!near_midpoint(t, eta_of(e) * inverse_step + std::abs(t) * relative) && !(zero_moves && end)) continue;
                for (int64_t o = 0; o < H; ++o) shift[o] += double(q.step) * std::abs(double(w.w_o.data[o * H + e]));
            }
            std::fill(z.begin(), z.end(), 0.0);  // the projection
            add_products(ctx_in.data() + r * H, w.w_o.data, H, H, H, z.data());
            for (int64_t o = 0; o < H; ++o) shift[o] += relative * std::abs(z[o]);
        } else {
            for (int64_t e = 0; e < H; ++e) {
                // (a zero context, a fully masked row's, is exact)
                const double c = exact.ctx[r * H + e];
                const double flip = bf16_flip(c, eta_of(e));
                if (flip == 0) continue;
                for (int64_t o = 0; o < H; ++o) shift[o] += flip * std::abs(double(w.w_o.data[o * H + e]));
            }
        }
        const double largest = *std::max_element(shift.begin(), shift.end());
        if (largest == 0) continue;
        // σ of the row's LayerNorm input z = x + ctx as projected (rounded or quantized)·W_oᵀ + b_o.
        double mean = 0, var = 0;
        for (int64_t o = 0; o < H; ++o) z[o] = double(inputs.x.data[r * H + o]) + double(w.b_o.data[o]);
        add_products(ctx_in.data() + r * H, w.w_o.data, H, H, H, z.data());
        for (int64_t o = 0; o < H; ++o) mean += z[o];
        mean /= double(H);
        for (int64_t o = 0; o < H; ++o) var += (z[o] - mean) * (z[o] - mean);
        const double sigma = std::sqrt(var / double(H) + double(config.layer_norm_eps));
        for (int64_t o = 0; o < H; ++o)
            allowance[r * H + o] = std::abs(double(w.gamma.data[o])) * (shift[o] + 2 * largest) / sigma;
    }
    return allowance;
}

}  // namespace attn::reference
