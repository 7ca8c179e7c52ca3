#include "problems/problem.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

namespace attn::testing {

std::string Problem::name() const {
    std::ostringstream s;
    s << "b" << batch << "_s" << s_q;
    if (cross || s_k != s_q) s << "_k" << s_k;
    s << "_h" << hidden << "_n" << heads;
    if (cross) s << "_cross";
    if (causal) s << "_causal";
    switch (packed ? Mask::none : mask) {
        case Mask::none:
            break;
        case Mask::squad:
            s << "_squad";
            break;
        case Mask::padding:
            s << "_pad";
            break;
        case Mask::one_real:
            s << "_onereal";
            break;
        case Mask::empty_batch:
            s << "_emptyrow";
            break;
    }
    if (bias) s << "_bias";
    if (packed) s << "_varlen";
    return s.str();
}

Config Problem::config() const {
    Config c;
    c.hidden_size = hidden;
    c.num_heads = heads;
    c.causal = causal;
    return c;
}

ProblemExtents Problem::extents() const { return {batch, s_q, s_k, heads, hidden / heads, hidden}; }

namespace {
void fill(std::vector<float> &v, std::size_t n, std::mt19937 &rng, float lo, float hi) {
    std::uniform_real_distribution<float> dist(lo, hi);
    v.resize(n);
    for (float &f : v) f = dist(rng);
}
}  // namespace

LayerData::LayerData(const Problem &p, uint32_t seed) : problem(p) {
    std::mt19937 rng(seed);
    const std::size_t H = std::size_t(p.hidden);
    // nn.Linear-like scale keeps activations O(1), as in a trained model.
    const float w = 1.0f / std::sqrt(float(p.hidden));
    fill(x, std::size_t(p.batch * p.s_q) * H, rng, -1.0f, 1.0f);
    if (p.cross) fill(kv, std::size_t(p.batch * p.s_k) * H, rng, -1.0f, 1.0f);
    for (auto *m : {&w_q, &w_k, &w_v, &w_o}) fill(*m, H * H, rng, -w, w);
    for (auto *b : {&b_q, &b_k, &b_v, &b_o, &beta}) fill(*b, H, rng, -0.1f, 0.1f);
    fill(gamma, H, rng, 0.9f, 1.1f);
    if (p.bias) fill(bias, std::size_t(p.heads * p.s_q * p.s_k), rng, -2.0f, 2.0f);
    if (p.mask != Mask::none) {
        mask.assign(std::size_t(p.batch * p.s_k), 1);
        std::uniform_int_distribution<int64_t> length(1, p.s_k);
        // SQuAD v1.1 as BERT sees it at max_seq_length 384 (a question and a passage
        // window): passages longer than a window make full windows, about a quarter of the
        // features; the rest spread log-normally around 150 tokens. A model of the
        // distribution, not a sample of the data set.
        std::bernoulli_distribution full_window(0.25);
        std::lognormal_distribution<double> squad_length(std::log(150.0), 0.35);
        for (int64_t b = 0; b < p.batch; ++b) {
            int64_t real = p.s_k;
            if (p.mask == Mask::padding) real = length(rng);
            if (p.mask == Mask::squad && !full_window(rng))
                real = std::clamp<int64_t>(std::llround(squad_length(rng)), 32, p.s_k);
            if (p.mask == Mask::one_real) real = 1;
            if (p.mask == Mask::empty_batch && b == 0) real = 0;
            for (int64_t j = real; j < p.s_k; ++j) mask[std::size_t(b * p.s_k + j)] = 0;
        }
    }
}

LayerWeights LayerData::weights() const {
    const Shape square{problem.hidden, problem.hidden}, vec{problem.hidden};
    auto v = [](const std::vector<float> &d, Shape s) { return ConstTensor{d.data(), d.size(), std::move(s)}; };
    return {v(w_q, square), v(b_q, vec),    v(w_k, square), v(b_k, vec),   v(w_v, square),
            v(b_v, vec),    v(w_o, square), v(b_o, vec),    v(gamma, vec), v(beta, vec)};
}

AttentionInputs LayerData::inputs() const {
    const Problem &p = problem;
    AttentionInputs in;
    in.x = {x.data(), x.size(), {p.batch, p.s_q, p.hidden}};
    if (p.cross) in.kv = {kv.data(), kv.size(), {p.batch, p.s_k, p.hidden}};
    if (!mask.empty()) in.key_padding_mask = {mask.data(), mask.size(), {p.batch, p.s_k}};
    if (p.bias) in.bias = {bias.data(), bias.size(), {1, p.heads, p.s_q, p.s_k}};
    return in;
}

std::vector<int64_t> LayerData::lengths() const {
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b < problem.batch; ++b) {
        const auto row = mask.begin() + b * problem.s_k;
        lengths.push_back(mask.empty() ? problem.s_k : std::count(row, row + problem.s_k, uint8_t(1)));
    }
    return lengths;
}

PackedBatch LayerData::packed() const {
    const AttentionInputs in = inputs();
    return pack(in.x, in.key_padding_mask);
}

GuardedOutput::GuardedOutput(Shape shape) : shape_(std::move(shape)) {
    size_ = 1;
    for (int64_t d : shape_) size_ *= std::size_t(d);
    data_.assign(size_ + 2 * kGuard, -12345.0f);
}

bool GuardedOutput::guards_intact() const {
    for (std::size_t i = 0; i < kGuard; ++i) {
        if (data_[i] != -12345.0f || data_[kGuard + size_ + i] != -12345.0f) return false;
    }
    return true;
}

Accuracy check_accuracy(const float *actual, const std::vector<double> &reference,
                        const std::vector<float> &plain_float32, const std::vector<double> &allowance) {
    Accuracy a;
    double baseline = 0, total = 0;
    std::vector<double> errors(reference.size());
    for (std::size_t i = 0; i < reference.size(); ++i) {
        // A NaN the reference does not have, or a missing one, is an infinite error.
        double e;
        if (std::isnan(reference[i])) {
            e = std::isnan(actual[i]) ? 0 : INFINITY;
        } else {
            baseline = std::max(baseline, std::abs(double(plain_float32[i]) - reference[i]));
            e = std::abs(double(actual[i]) - reference[i]);
            if (std::isnan(e)) e = INFINITY;
        }
        total += e;
        errors[i] = e;
    }
    const double base = 2 * baseline + kAbsoluteFloor;
    auto allowed = [&](std::size_t i) { return base + (allowance.empty() ? 0.0 : allowance[i]); };
    double worst_ratio = -1;
    for (std::size_t i = 0; i < reference.size(); ++i) {
        double ratio = errors[i] / allowed(i);
        if (std::isnan(ratio)) ratio = INFINITY;  // (an infinite error against an infinite tolerance)
        if (ratio > worst_ratio) {
            worst_ratio = ratio;
            a.max_error = errors[i], a.worst_index = i, a.worst_actual = actual[i], a.worst_reference = reference[i];
        }
    }
    a.mean_error = reference.empty() ? 0 : total / double(reference.size());
    a.allowance = allowance.empty() || reference.empty() ? 0.0 : allowance[a.worst_index];
    a.per_element = !allowance.empty();
    a.tolerance = base + a.allowance;
    a.ok = a.max_error <= a.tolerance;
    return a;
}

std::string Accuracy::report(const std::string &what) const {
    std::ostringstream s;
    s << what << ": " << (per_element ? "error nearest its tolerance " : "max error ") << max_error << " at index " << worst_index << " (got " << worst_actual
      << ", reference " << worst_reference << "), mean error " << mean_error << ", tolerance " << tolerance
      << " (2 x plain float32 error + " << kAbsoluteFloor;
    if (allowance > 0) s << " + " << allowance << " for the reduced-precision rounding of the computed context";
    s << ")";
    return s.str();
}

const std::vector<ListedProblem> &problem_list() {
    auto make = [](int64_t batch, int64_t seq, int64_t hidden, bool causal, Mask mask) {
        Problem p;
        p.batch = batch;
        p.s_q = p.s_k = seq;
        p.hidden = hidden;
        p.causal = causal;
        p.mask = mask;
        return p;
    };
    auto packed = [](Problem p) {
        p.packed = true;
        return p;
    };
    static const std::vector<ListedProblem> list{
        // BERT-base (12 heads of 64), one 128-token sequence: the latency case.
        {make(1, 128, 768, false, Mask::none), "BERT-base, one 128-token sequence", true},
        // BERT-base at SQuAD's usual 384-token length.
        {make(1, 384, 768, false, Mask::none), "BERT-base, 384 tokens (SQuAD)", true},
        // BERT-base serving a batch of 8 padded sentences of seeded lengths in [1, 128].
        {make(8, 128, 768, false, Mask::padding), "BERT-base, batch of 8 padded sentences", true},
        // The same 8 sentences packed: only their real tokens (Attention::forward_packed).
        {packed(make(8, 128, 768, false, Mask::padding)), "BERT-base, the 8 sentences packed", true},
        // BERT-base on 32 SQuAD-like features (up to 384 tokens), packed.
        {packed(make(32, 384, 768, false, Mask::squad)), "BERT-base, 32 SQuAD-like features packed", false},
        // BERT-base serving 8 padded passages of up to 512 tokens (SQuAD-style).
        {make(8, 512, 768, false, Mask::padding), "BERT-base, batch of 8 padded 512-token passages", false},
        // all-MiniLM-L6-v2 (H=384, 12 heads of 32), the sentence-embedding workhorse.
        {make(1, 128, 384, false, Mask::none), "MiniLM-L6 (all-MiniLM-L6-v2)", true},
        // GPT-2 small's decoder attention shape (H=768, 12 heads), causal.
        {make(1, 128, 768, true, Mask::none), "GPT-2 small, causal", true},
        // Long context at BERT-base width: the S×S probabilities would be 192 MiB
        // (S=2048) and 768 MiB (S=4096) per sequence; the fused layer keeps O(S).
        {make(1, 2048, 768, false, Mask::none), "long context, BERT-base width", false},
        {make(1, 2048, 768, true, Mask::none), "long context, causal (decoder)", false},
        {make(1, 4096, 768, false, Mask::none), "long context, BERT-base width", false},
        {make(1, 4096, 768, true, Mask::none), "long context, causal (decoder)", false},
        {make(1, 8192, 768, false, Mask::none), "long context, BERT-base width", false},
    };
    return list;
}

double median(std::vector<double> samples) {
    if (samples.empty()) return 0;
    std::sort(samples.begin(), samples.end());
    const std::size_t n = samples.size();
    return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

std::pair<double, double> median_interval(std::vector<double> samples, double level) {
    if (samples.empty()) return {0, 0};
    std::sort(samples.begin(), samples.end());
    const std::size_t n = samples.size();
    // The largest k with P(Binomial(n, 1/2) <= k - 1) <= (1 - level) / 2, at least 1.
    std::size_t k = 0;
    double below = 0, choose = 1;  // choose: C(n, k)
    while (k + 1 <= n / 2) {
        const double next = below + choose * std::pow(0.5, double(n));
        if (2 * next > 1 - level) break;
        below = next;
        choose = choose * double(n - k) / double(k + 1);
        ++k;
    }
    k = std::max<std::size_t>(k, 1);
    return {samples[k - 1], samples[n - k]};
}

}  // namespace attn::testing
