#include "attention_algorithm.h"

#include <limits>

namespace attn_gen {

using namespace Halide;

namespace {
const Dims dims;
// The identity of the row max. A finite value, not -inf: Halide compiles with
// fast-math assumptions, and a fully excluded row must give zeros, not NaN.
const float kLowest = std::numeric_limits<float>::lowest();

// An index a tile may run past, clamped to the last valid one (see the header).
Expr last(Expr i, Expr extent) { return min(i, extent - 1); }
// The same, where the clamp is shared by several loads (a let): tagged `likely`, or Halide's
// loop partitioning does not find it, and the steady state gathers each vector lane by lane.
Expr last_likely(Expr i, Expr extent) { return min(likely(i), extent - 1); }

// Element `at` = group·out + lane of group row in_group of a weight in panels of `panel`
// outputs (WeightLayout::panels: group 1, (panel·in, panels); ::grouped: each panel's
// group rows one after another, group·panel elements each, viewed as (group·panel, rows) with
// grouped_rows(features, group) rows a panel, so that an AMX tile's rows are the view's).
// Past the last output, the last panel (whole: zeros past `features`): only the panel is
// clamped, so that a vector of a panel stays one load.
Expr last_panel(Expr p, int panel, Expr features) { return last(p, (features + panel - 1) / panel); }
// Element `in_row` of row in_group of panel p of a grouped weight (the view's).
Expr grouped_at(Func weight, int group, int panel, Expr in_row, Expr in_group, Expr p, Expr features) {
    return weight(in_row, in_group + grouped_rows(features, group) * last_panel(p, panel, features));
}
Expr panel_at(Func weight, int group, int panel, Expr at, Expr in_group, Expr features) {
    if (panel <= 0) throw CompileError("WeightLayout::panels and ::grouped need the panel's width");
    const int row = group * panel;
    if (group == 1) return weight(at % row + row * in_group, last_panel(at / row, panel, features));
    return grouped_at(weight, group, panel, at % row, in_group, at / row, features);
}

// W[out, in] from a weight in `layout` (of `panel` outputs a panel), `features` outputs.
Expr weight_at(Func weight, WeightLayout layout, Expr out, Expr in_feature, Expr features, int panel = 0) {
    switch (layout) {
    case WeightLayout::transposed: return weight(last(out, features), in_feature);
    case WeightLayout::panels: return panel_at(weight, 1, panel, out, in_feature, features);
    default: return weight(in_feature, last(out, features));
    }
}

// weight_t(lane, out, in_group) = W[out, group·in_group + lane] from a weight in `layout`, zero
// past the input features (a grouped weight has its zeros already): a reduced precision's
// groups of input features (Linear::weight_transposed).
void define_weight_in_groups(Func weight_t, Func weight, WeightLayout layout, int group, Expr features, Type type,
                             int panel) {
    const Var &out = dims.hidden;
    Var lane{group == 2 ? "pair" : "quad"}, in_group{group == 2 ? "in_pair" : "in_quad"};
    Expr in_feature = group * in_group + lane;
    weight_t(lane, out, in_group) =
        layout == WeightLayout::grouped
            ? panel_at(weight, group, panel, group * out + lane, in_group, features)
            : select(in_feature < features, weight_at(weight, layout, out, last(in_feature, features), features),
                     cast(type, 0));
}

// weight_t(out, in) = W[out, in] from a weight in `layout`, `features` outputs.
void define_weight_transposed(Func weight_t, Func weight, WeightLayout layout, Expr features, int panel) {
    const Var &out = dims.hidden;
    Var in_feature{"in_feature"};
    weight_t(out, in_feature) = weight_at(weight, layout, out, in_feature, features, panel);
}
}  // namespace


Expr grouped_rows(Expr features, int group) {
    const int tile = kAmxTileColumns * group;
    return (features + tile - 1) / tile * kAmxTileColumns;
}

Func rounded_to_bf16(const std::string &name, Func in, Expr features) {
    Func rounded{name};
    rounded(dims.hidden, dims.seq, dims.batch) =
        rounded_as(BFloat(16), in(last(dims.hidden, features), dims.seq, dims.batch));
    return rounded;
}

QuantizedRows quantized_to_u8(const std::string &name, Func in, Expr features) {
    const Var &k = dims.hidden, &s = dims.seq, &b = dims.batch;
    QuantizedRows q;
    q.feature = RDom(0, features, name + "_feature");
    // The row's low, high and sum in one pass over it (a Tuple reduction).
    q.stats = Func{name + "_stats"};
    q.stats(s, b) = Tuple(0.0f, 0.0f, 0.0f);
    Expr x = in(q.feature, s, b);
    q.stats(s, b) = Tuple(min(q.stats(s, b)[0], x), max(q.stats(s, b)[1], x), q.stats(s, b)[2] + x);
    q.low = Func{name + "_low"};
    q.low(s, b) = q.stats(s, b)[0];
    q.high = Func{name + "_high"};
    q.high(s, b) = q.stats(s, b)[1];
    // A row holding NaN or ±Inf has a non-finite sum (min and max may pass NaN over): its
    // step is NaN, so that the projection's whole row is, as in fp32. (is_finite is
    // evaluated strictly, whatever Halide's fast-math.)
    q.sum = Func{name + "_sum"};
    q.sum(s, b) = q.stats(s, b)[2];
    Expr range = q.high(s, b) - q.low(s, b), inverse = 255.0f / range;
    Expr invertible = range > 0.0f && is_finite(inverse);
    q.inverse_step = Func{name + "_inverse_step"};
    q.inverse_step(s, b) = select(invertible, inverse, 1.0f);
    q.step = Func{name + "_step"};
    // range · (1/255), not range / 255: Halide's simplifier rewrites a division by a constant
    // so, and the reference computes what Halide does. Strict, so that the NaN survives.
    q.step(s, b) = strict_float(select(!is_finite(q.sum(s, b)), cast<float>(NAN),
                                       select(invertible, range * (1.0f / 255.0f), 1.0f)));
    q.zero = Func{name + "_zero"};
    q.zero(s, b) = clamp(cast<int>(round(-q.low(s, b) * q.inverse_step(s, b))), 0, 255);
    q.values = Func{name};
    q.values(k, s, b) =
        cast<uint8_t>(clamp(cast<int>(round(in(last(k, features), s, b) * q.inverse_step(s, b))) + q.zero(s, b), 0, 255));
    return q;
}

Func rows_for_amx_tiles(const std::string &name, Func in, Expr features, Expr tokens) {
    const Var &k = dims.hidden, &s = dims.seq, &b = dims.batch;
    Func rows{name};
    // Zero past the features (times the panels' zero weights there: no Inf · 0).
    rows(k, s, b) = select(k < features, in(k, last(s, tokens), b), cast(in.type(), 0));
    return rows;
}

Linear linear(const std::string &name, Func in, Func weight, Func bias, Expr features, Expr tokens, Func rows,
              WeightLayout layout, Precision precision, const Int8Operands &int8, Type out_type, int panel,
              bool amx_tiles, Func shared_amx_rows) {
    const Var &out = dims.hidden, &s = dims.seq, &b = dims.batch;
    Linear l;
    l.input = in;
    l.weight_transposed = Func{name + "_weight_t"};
    l.weight_layout = layout;
    l.precision = precision;
    l.product = Func{name + "_product"};
    if (amx_tiles) {
        if (precision == Precision::fp32 || layout != WeightLayout::grouped || panel != kAmxTileColumns)
            _halide_user_error << name << ": AMX tiles take bf16 or int8 weights grouped in panels of "
                               << kAmxTileColumns << " outputs\n";
        const int group = features_a_group(precision);
        Var lane{"lane"}, in_panel{"in_panel"};
        l.amx_rows =
            shared_amx_rows.defined() ? shared_amx_rows : rows_for_amx_tiles(name + "_amx_rows", in, features, tokens);
        // Over a panel's rows (grouped_rows: whole tiles' features).
        l.k = RDom(0, grouped_rows(features, group) * group, name + "_k");
        Expr k = l.k.x, x = l.amx_rows(k, s, b);
        Expr w = grouped_at(weight, group, panel, group * lane + k % group, k / group, in_panel, features);
        l.amx_tile = Func{name + "_amx_tile"};
        if (precision == Precision::int8) {
            l.amx_tile(lane, in_panel, s, b) = 0;
            l.amx_tile(lane, in_panel, s, b) += cast<int32_t>(x) * cast<int32_t>(w);  // u8 × i8: tdpbusd
        } else {
            l.amx_tile(lane, in_panel, s, b) = 0.0f;
            l.amx_tile(lane, in_panel, s, b) += cast<float>(x) * cast<float>(w);  // bf16 pairs: tdpbf16ps
        }
        l.product(out, s, b) = l.amx_tile(out % kAmxTileColumns, out / kAmxTileColumns, s, b);
    } else if (precision == Precision::fp32) {
        l.product(out, s, b) = 0.0f;
        define_weight_transposed(l.weight_transposed, weight, layout, features, panel);
        l.k = RDom(0, features, name + "_k");
        l.product(out, s, b) += in(l.k, last(s, tokens), b) * l.weight_transposed(out, l.k);
    } else if (precision == Precision::int8) {
        // Quads of input features; the last quad is completed by zero weights. Not clamped
        // (QuantizedRows::values is defined past the row), so that a quad is one 4-byte load,
        // broadcast to every lane.
        l.product(out, s, b) = 0;
        define_weight_in_groups(l.weight_transposed, weight, layout, 4, features, Int(8), panel);
        Expr row = last(s, tokens), quads = (features + 3) / 4;
        if (int8.sum == Int8Sum::quads) {
            l.k = RDom({{0, 4}, {0, quads}}, name + "_k");
            l.product(out, s, b) += cast<int32_t>(in(4 * l.k.y + l.k.x, row, b)) *
                                    cast<int32_t>(l.weight_transposed(l.k.x, out, l.k.y));
        } else {
            // Each pair's two products summed in i16 (Int8Sum), reading the grouped weight in
            // place: the (out_pair, pair) lanes of one quad row are its bytes 2·out_pair + pair.
            if (layout != WeightLayout::grouped)
                _halide_user_error << name << ": int8 summed in pairs reads its weight grouped\n";
            Var out_pair{"out_pair"}, in_quad{"in_quad"};
            RDom pair(0, 2, name + "_pair");
            Expr byte = 2 * out_pair + pair;
            l.pair_sums = Func{name + "_pair_sums"};
            l.pair_sums(out_pair, s, b, in_quad) = cast<int16_t>(0);
            l.pair_sums(out_pair, s, b, in_quad) =
                saturating_add(l.pair_sums(out_pair, s, b, in_quad),
                               cast<int16_t>(in(4 * in_quad + byte % 4, row, b)) *
                                   cast<int16_t>(panel_at(weight, 4, panel, byte, in_quad, features)));
            l.k = RDom({{0, 2}, {0, quads}}, name + "_k");
            l.product(out, s, b) += cast<int32_t>(l.pair_sums(2 * out + l.k.x, s, b, l.k.y));
        }
    } else {
        l.product(out, s, b) = 0.0f;
        // Pairs of input features; an odd count's last pair is completed by a zero weight.
        define_weight_in_groups(l.weight_transposed, weight, layout, 2, features, BFloat(16), panel);
        const std::vector<Var> pair_out_in = l.weight_transposed.args();
        l.weight_widened = Func{name + "_weight_widened"};
        l.weight_widened(pair_out_in) = cast<float>(l.weight_transposed(pair_out_in));
        l.input_widened = Func{name + "_input_widened"};
        l.input_widened(dims.hidden, s, b) = cast<float>(in(dims.hidden, s, b));
        l.k = RDom({{0, 2}, {0, (features + 1) / 2}}, name + "_k");
        // Not clamped (as int8's quads): a pair is one 4-byte load, broadcast to every lane.
        l.product(out, s, b) += l.input_widened(2 * l.k.y + l.k.x, last(s, tokens), b) * l.weight_widened(l.k.x, out, l.k.y);
    }
    Expr result = l.product(out, s, b);  // out − bias
    if (precision == Precision::int8) {
        // Dequantized (vectors or tiles alike); the scales clamped for whole vectors of outputs
        // past the last (a panel's).
        const QuantizedRows &r = int8.rows;
        Expr row = last(s, tokens), o = last_likely(out, features);
        result = r.step(row, b) * int8.weight.scale(o) * cast<float>(result - r.zero(row, b) * int8.weight.sum(o));
    }
    l.out = Func{name};
    // (The bias clamped, so that a schedule may compute whole vectors of outputs past the last:
    // a panel's, WeightLayout::panels.)
    Expr bias_at = bias(last(out, features));
    if (!rows.defined()) {
        l.out(out, s, b) = converted(out_type, result + bias_at);
        return l;
    }
    l.row = RDom(0, tokens, name + "_row");
    l.row.where(l.row < rows(b));
    l.out(out, s, b) = undef(out_type);
    l.out(out, l.row, b) = converted(out_type, substitute(s, l.row.x, result) + bias_at);
    return l;
}

Func split_heads(const std::string &name, Func tensor, Expr head_dim) {
    Func heads{name};
    heads(dims.head_dim, dims.head, dims.seq, dims.batch) =
        tensor(dims.head * head_dim + dims.head_dim, dims.seq, dims.batch);
    return heads;
}

namespace {
Var pair{"pair"}, head_dim_pair{"head_dim_pair"}, key_pair{"key_pair"};
Expr bf16_zero() { return cast(BFloat(16), 0.0f); }
}  // namespace

Expr rounded_as(Type type, Expr x, bool instruction) {
    if (x.type().is_bfloat()) return cast(type, x);  // (Q, K, V from projections that stored them rounded)
    Expr bits;
    if (instruction) {
        bits = Internal::Call::make(UInt(16), "vcvtne2ps2bf16", {x}, Internal::Call::PureExtern);
    } else {
        Expr u = reinterpret<uint32_t>(x);
        Expr nan = (u & 0x7fffffff) > 0x7f800000;
        bits = cast<uint16_t>(select(nan, (u >> 16) | 0x40, (u + 0x7fff + ((u >> 16) & 1)) >> 16));
    }
    return cast(type, reinterpret(BFloat(16), bits));
}

Expr converted(Type type, Expr x) { return type.is_bfloat() ? rounded_as(type, x) : cast(type, x); }

Expr exp_nonpositive(Expr t) {
    const float log2e = 1.44269504088896341f, ln2 = 0.693147180559945309f;
    // k = round(t·log2e), read from the low bits of t·log2e + 1.5·2^23 (whose ulp is 1): an
    // add in place of a rounding, which Halide 21 makes two 8-lane vroundps and a shuffle on
    // AVX-512, and a conversion to int. Those bits, shifted into the exponent, give 2^k.
    Expr shifted = reinterpret<uint32_t>(t * log2e + 12582912.0f);  // 0x4B400000 + k
    Expr k = cast<float>(reinterpret<int32_t>(shifted) - 0x4B400000);
    Expr r = t - k * ln2;
    Expr p = ((((0.008297655f * r + 0.04191538f) * r + 0.16667575f) * r + 0.49998894f) * r + 0.9999997f) * r + 1.0000001f;
    return p * reinterpret<float>((shifted << 23) + cast<uint32_t>(127 << 23));
}

Func queries_bf16(const std::string &name, Func q_heads, Expr head_dim, Expr s_q, Type operand_type) {
    const Var &e = dims.head_dim, &h = dims.head, &i = dims.query, &b = dims.batch;
    Func q{name};
    q(e, h, i, b) = select(e < head_dim, rounded_as(operand_type, q_heads(last(e, head_dim), h, last(i, s_q), b)),
                           cast(operand_type, bf16_zero()));
    return q;
}

Func keys_transposed(const std::string &name, Func k_heads, Expr head_dim, Expr s_k) {
    const Var &j = dims.key, &e = dims.head_dim, &h = dims.head, &b = dims.batch;
    Func k{name};
    // The head features' clamp `likely`: a schedule reading K's rows as whole vectors of them
    // then gets loops free of it but at the edge, where a clamped vector index is a gather.
    // Not the keys': their clamp is scalar there, and with it too the GPU flash kernel took
    // 122 registers a thread instead of 72 (the default GPU parameters).
    k(j, e, h, b) = k_heads(min(likely(e), head_dim - 1), h, last(j, s_k), b);
    return k;
}

Func keys_in_pairs(const std::string &name, Func k_heads, Expr head_dim, Expr s_k, Type operand_type) {
    const Var &j = dims.key, &h = dims.head, &b = dims.batch;
    Expr feature = 2 * head_dim_pair + pair;
    Func k{name};
    k(pair, j, head_dim_pair, h, b) =
        select(feature < head_dim, rounded_as(operand_type, k_heads(last(feature, head_dim), h, last(j, s_k), b)),
               cast(operand_type, bf16_zero()));
    return k;
}

Func pair_rows(const std::string &name, Func pairs) {
    const std::vector<Var> a = pairs.args();  // (pair, along, outer, head, batch)
    Var pair_along{"pair_along"};
    Func rows{name};
    rows(pair_along, a[2], a[3], a[4]) = pairs(pair_along % 2, pair_along / 2, a[2], a[3], a[4]);
    return rows;
}

Func values_in_pairs(const std::string &name, Func v_heads, Expr head_dim, Expr s_k, Type operand_type) {
    const Var &e = dims.head_dim, &h = dims.head, &b = dims.batch;
    Func v{name};
    v(pair, e, key_pair, h, b) =
        rounded_as(operand_type, v_heads(last(e, head_dim), h, last(2 * key_pair + pair, s_k), b));
    return v;
}

Scores scaled_scores(Func q_heads, Func k_heads, Func bias, Expr head_dim, Expr s_q, Expr s_k, Precision precision) {
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch, &e = dims.head_dim;
    Scores s;
    s.precision = precision == Precision::bf16 ? Precision::bf16 : Precision::fp32;
    s.dot = Func{"dot"};
    s.dot(j, i, h, b) = 0.0f;
    if (s.precision == Precision::bf16) {
        // Pairs of head features: bf16 products, exact in f32, summed in f32 (vdpbf16ps).
        s.query_heads = queries_bf16("query_heads", q_heads, head_dim, s_q);
        s.key_transposed = keys_in_pairs("key_transposed", k_heads, head_dim, s_k);
        s.e = RDom({{0, 2}, {0, (head_dim + 1) / 2}}, "e");
        s.dot(j, i, h, b) += cast<float>(s.query_heads(2 * s.e.y + s.e.x, h, i, b)) *
                             cast<float>(s.key_transposed(s.e.x, j, s.e.y, h, b));
    } else {
        s.query_heads = q_heads;
        s.key_transposed = keys_transposed("key_transposed", k_heads, head_dim, s_k);
        s.e = RDom(0, head_dim, "e");
        s.dot(j, i, h, b) += q_heads(s.e, h, last(i, s_q), b) * s.key_transposed(j, s.e, h, b);
    }
    s.scores = Func{"scores"};
    s.scores(j, i, h, b) = s.dot(j, i, h, b) * (1.0f / sqrt(cast<float>(head_dim))) + bias(j, i, h, b);
    return s;
}

MaskedSoftmax masked_softmax(Func scores, Func key_padding_mask, Expr causal, Expr s_q, Expr s_k) {
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch;
    MaskedSoftmax m;
    m.keep = Func{"keep"};
    m.keep(j, i, h, b) = key_padding_mask(j, b) != 0 && !(causal && j > i + (s_k - s_q));
    m.j = RDom(0, s_k, "j");
    m.row_max = Func{"row_max"};
    m.row_max(i, h, b) = kLowest;
    m.row_max(i, h, b) = max(m.row_max(i, h, b), select(m.keep(m.j, i, h, b), scores(m.j, i, h, b), kLowest));
    m.exp_scores = Func{"exp_scores"};
    m.exp_scores(j, i, h, b) = select(m.keep(j, i, h, b), exp(scores(j, i, h, b) - m.row_max(i, h, b)), 0.0f);
    m.row_sum = Func{"row_sum"};
    m.row_sum(i, h, b) = 0.0f;
    m.row_sum(i, h, b) += m.exp_scores(m.j, i, h, b);
    m.probs = Func{"probs"};
    // A row with no kept key sums to 0 and gets zeros; a NaN sum still propagates.
    m.probs(j, i, h, b) = select(m.row_sum(i, h, b) == 0.0f, 0.0f, m.exp_scores(j, i, h, b) / m.row_sum(i, h, b));
    return m;
}

WeightedSum weighted_sum(Func probs, Func v_heads, Expr head_dim, Expr s_q, Expr s_k, Precision precision) {
    const Var &e = dims.head_dim, &h = dims.head, &i = dims.query, &b = dims.batch, &j = dims.key;
    WeightedSum w;
    w.precision = precision == Precision::bf16 ? Precision::bf16 : Precision::fp32;
    w.ctx_sum = Func{"ctx_sum"};
    w.ctx_sum(e, h, i, b) = 0.0f;
    if (w.precision == Precision::bf16) {
        // Pairs of keys: bf16 products, exact in f32, summed in f32 (vdpbf16ps). An odd s_k's
        // last pair is completed by a zero weight.
        w.probs = Func{"probs_rounded"};
        w.probs(j, i, h, b) =
            select(j < s_k, rounded_as(BFloat(16), probs(last(j, s_k), last(i, s_q), h, b)), bf16_zero());
        w.values = values_in_pairs("values_in_pairs", v_heads, head_dim, s_k);
        w.j = RDom({{0, 2}, {0, (s_k + 1) / 2}}, "context_j");
        w.ctx_sum(e, h, i, b) +=
            cast<float>(w.probs(2 * w.j.y + w.j.x, i, h, b)) * cast<float>(w.values(w.j.x, e, w.j.y, h, b));
    } else {
        w.probs = probs;
        w.values = v_heads;
        w.j = RDom(0, s_k, "context_j");
        w.ctx_sum(e, h, i, b) += probs(w.j, last(i, s_q), h, b) * v_heads(last(e, head_dim), h, w.j, b);
    }
    w.ctx = Func{"ctx"};
    w.ctx(e, h, i, b) = w.ctx_sum(e, h, i, b);
    return w;
}

OutputLayerNorm output_layernorm(Func ctx_heads, Func residual, Func w_o, Func b_o, Func gamma, Func beta, Expr eps,
                                 Expr head_dim, Expr heads, Expr hidden, Expr tokens, WeightLayout layout,
                                 Precision precision, WeightScales w_o_scales, Int8Sum int8_sum, int panel,
                                 bool amx_tiles) {
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    OutputLayerNorm n;
    n.context_heads = ctx_heads;
    n.weight_layout = layout;
    if (precision == Precision::fp32) {
        n.weight_transposed = Func{"w_o_t"};
        define_weight_transposed(n.weight_transposed, w_o, layout, hidden, panel);
        n.in_feature = RDom(0, head_dim, 0, heads, "in_feature");
        const RVar &e = n.in_feature.x, &h = n.in_feature.y;
        n.projection = Func{"projection"};
        n.projection(o, s, b) = 0.0f;
        n.projection(o, s, b) += ctx_heads(e, h, last(s, tokens), b) * n.weight_transposed(o, h * head_dim + e);
    } else {
        // The context by feature (h·d + e), rounded, so that each pair of features is
        // adjacent for the GEMM, whatever d: zeros, then each head's features written as they
        // lie (an update over (e, h): a vector of them is one load and one store, where
        // finding each feature's head made every vector a gather: 8% of the bf16 AMX layer's
        // time at B=1 S=384). The zeros stand past H, where a GEMM's pair, quad or tile reads.
        n.context_rounded = Func{"context_rounded"};
        const Type context_type = precision == Precision::bf16 ? BFloat(16) : Float(32);
        n.context_features = RDom(0, head_dim, 0, heads, "context_features");
        const RVar &e = n.context_features.x, &h = n.context_features.y;
        n.context_rounded(dims.hidden, s, b) = cast(context_type, 0.0f);
        n.context_rounded(h * head_dim + e, s, b) = converted(context_type, ctx_heads(e, h, s, b));
        Func no_bias{"no_bias"};
        no_bias(o) = 0.0f;
        if (precision == Precision::bf16) {
            n.rounded = linear("projection", n.context_rounded, w_o, no_bias, hidden, tokens, Func(), layout, precision,
                               Int8Operands(), Float(32), panel, amx_tiles);
        } else {
            n.context_quantized = quantized_to_u8("context_quantized", n.context_rounded, hidden);
            n.rounded = linear("projection", n.context_quantized.values, w_o, no_bias, hidden, tokens, Func(), layout,
                               precision, {n.context_quantized, w_o_scales, int8_sum}, Float(32), panel, amx_tiles);
        }
        n.weight_transposed = n.rounded.weight_transposed;
        n.projection = n.rounded.out;
    }
    n.dense = Func{"dense"};
    // (The residual's row and feature and the bias clamped, as the projection's reads are, so
    // that a schedule may compute whole tiles of rows past the last, and whole panels.)
    Expr feature = last_likely(o, hidden);
    n.dense(o, s, b) = residual(feature, last(s, tokens), b) + b_o(feature) + n.projection(o, s, b);

    n.row = RDom(0, hidden, "row");
    Expr inv_hidden = 1.0f / cast<float>(hidden);
    n.sum = Func{"sum"};
    n.sum(s, b) = 0.0f;
    n.sum(s, b) += n.dense(n.row, s, b);
    n.mean = Func{"mean"};
    n.mean(s, b) = n.sum(s, b) * inv_hidden;
    n.sum_sq_dev = Func{"sum_sq_dev"};
    n.sum_sq_dev(s, b) = 0.0f;
    Expr deviation = n.dense(n.row, s, b) - n.mean(s, b);
    n.sum_sq_dev(s, b) += deviation * deviation;
    n.variance = Func{"variance"};
    n.variance(s, b) = n.sum_sq_dev(s, b) * inv_hidden;
    n.y = Func{"y"};
    n.y(o, s, b) = gamma(o) * (n.dense(o, s, b) - n.mean(s, b)) / sqrt(n.variance(s, b) + eps) + beta(o);
    return n;
}

Func last_real_key(Func key_padding_mask, Expr s_k) {
    const Var &b = dims.batch;
    RDom j(0, s_k, "all_keys");
    Func key_end{"key_end"};
    key_end(b) = 0;
    key_end(b) = max(key_end(b), select(key_padding_mask(j, b) != 0, j + 1, 0));
    return key_end;
}

FlashAttention flash_attention(Func q_heads, Func k_heads, Func v_heads, Func key_padding_mask, Func key_end, Func bias,
                               Expr bias_keys, Expr causal, Expr head_dim, Expr s_q, Expr s_k, Blocking blocking,
                               Func query_end, Precision precision, Bf16Core bf16_core) {
    const Var &e = dims.head_dim, &h = dims.head, &b = dims.batch, &i = dims.query, &j = dims.key;
    const Var &qi = dims.query_in_block, &qb = dims.query_block, &kb = dims.key_block;
    const Var &kc = dims.key_chunk, &kl = dims.key_in_chunk;
    const int Q = blocking.query_block, C = blocking.key_chunk, K = blocking.chunks() * C;
    const bool bf16 = precision == Precision::bf16;
    const bool bf16_widened = bf16_core.widened, amx_tiles = bf16_core.amx_tiles;
    if (bf16 && C % 2 != 0)
        _halide_user_error << "flash_attention: a bf16 core sums its keys in pairs, so key_chunk must be even, got "
                           << C << "\n";
    // (The generator refuses a query_block that is no multiple of the tiles' rows, naming it.)
    if (amx_tiles && (!bf16 || bf16_widened || C != kAmxTileStep || Q % kAmxTileColumns != 0))
        _halide_user_error << "flash_attention: AMX tiles take a bf16 core's products in chunks of " << kAmxTileStep
                           << " keys and blocks of a multiple of " << kAmxTileColumns << " queries\n";
    FlashAttention f;
    f.blocking = blocking;
    f.blocking.key_block = K;
    f.precision = bf16 ? Precision::bf16 : Precision::fp32;

    // One past the last key a query of block qb may see: causal keys end at the diagonal of
    // the block's last query (bottom-right aligned), padded ones at the batch's last real key.
    Expr last_query = min(qb * Q + Q - 1, s_q - 1);
    Expr key_limit = min(key_end(b), select(causal, last_query + (s_k - s_q) + 1, s_k));
    // A query block wholly past query_end sees no key: (query_end − its first query) · s_k
    // is ≤ 0 there and ≥ s_k elsewhere. A min, not a select: Halide bounds the loops over
    // key blocks and chunks by it, and computes none of a dead block's scores.
    if (query_end.defined()) key_limit = min(key_limit, (query_end(b) - qb * Q) * s_k);

    // K and V packed per head. bf16: rounded, and in pairs, as the products read them
    // (keys_in_pairs, values_in_pairs), and Q rounded (queries_bf16); bf16_widened: each held
    // as the f32 value it rounds to, the exponentials too.
    const Type operand_type = bf16 && bf16_widened ? Float(32) : BFloat(16);
    if (amx_tiles) {
        f.keys = pair_rows("keys", keys_in_pairs("keys_in_pairs", k_heads, head_dim, s_k));
        f.values = pair_rows("values", values_in_pairs("values_in_pairs", v_heads, head_dim, s_k));
        f.queries = queries_bf16("queries", q_heads, head_dim, s_q);
    } else if (bf16) {
        f.keys = keys_in_pairs("keys", k_heads, head_dim, s_k, operand_type);
        f.values = values_in_pairs("values", v_heads, head_dim, s_k, operand_type);
        f.queries = queries_bf16("queries", q_heads, head_dim, s_q, operand_type);
    } else {
        f.keys = keys_transposed("keys", k_heads, head_dim, s_k);
        f.values = Func{"values"};
        f.values(e, j, h, b) = v_heads(last(e, head_dim), h, last(j, s_k), b);
    }

    // Within a key block, whole chunks up to key_limit. The predicate names only the chunk,
    // so that Halide turns it into the bound of the loop over chunks (a vectorized lane in
    // the predicate would keep the loop whole); keys of the last chunk past key_limit are
    // excluded by `kept`. A block of one chunk needs no predicate: the loop over key blocks
    // stops at key_limit already (and an unrolled loop would test it at every key).
    auto chunk_visited = [&](Expr chunk) { return kb * K + chunk * C < key_limit; };
    f.key_in_block = RDom({{0, C}, {0, blocking.chunks()}}, "key_in_block");
    const RVar &lane = f.key_in_block.x, &chunk = f.key_in_block.y;
    if (blocking.chunks() > 1) f.key_in_block.where(chunk_visited(chunk));
    Expr query = qb * Q + qi, key = kb * K + chunk * C + lane;
    // Whether each key of the batch is real, for whole blocks (0 past s_k): the core reads it
    // without clamping the key. 1 or 0 in 32 bits, the scores' lane width, so that a vector
    // of it is a select's mask after one comparison (bytes would be widened on every use).
    f.key_is_real = Func{"key_is_real"};
    f.key_is_real(j, b) = cast<int32_t>(j < s_k && key_padding_mask(last(j, s_k), b) != 0);
    f.causal = causal;
    f.head_dim = head_dim;
    Expr kept = f.key_is_real(key, b) != 0 && !(causal && key > query + (s_k - s_q));

    f.dot = Func{"dot"};
    Expr key_of_dot = kb * K + kc * C + kl;
    if (amx_tiles) {
        // 16 × 16 tiles of (key, query), each summed over kAmxTileStep head features a step
        // (Halide's AMX lowering: rows of Q as they lie, and K's rows of head-feature pairs,
        // 16 keys' pairs a row), the features padded to whole steps (Q and K are zero past d).
        Var key_in_tile{"key_in_tile"}, key_tile{"key_tile"};
        f.e = RDom(0, (head_dim + kAmxTileStep - 1) / kAmxTileStep * kAmxTileStep, "e");
        Expr key = kb * K + kc * C + kAmxTileColumns * key_tile + key_in_tile;
        f.dot_tile = Func{"dot_tile"};
        f.dot_tile(key_in_tile, key_tile, qi, kc, qb, kb, h, b) = 0.0f;
        f.dot_tile(key_in_tile, key_tile, qi, kc, qb, kb, h, b) +=
            cast<float>(f.queries(f.e, h, query, b)) * cast<float>(f.keys(2 * key + f.e % 2, f.e / 2, h, b));
        f.dot(kl, kc, qi, qb, kb, h, b) = f.dot_tile(kl % kAmxTileColumns, kl / kAmxTileColumns, qi, kc, qb, kb, h, b);
    } else if (bf16) {
        f.dot(kl, kc, qi, qb, kb, h, b) = 0.0f;
        // Pairs of head features: bf16 products, exact in f32, summed in f32 (vdpbf16ps).
        f.e = RDom({{0, 2}, {0, (head_dim + 1) / 2}}, "e");
        f.dot(kl, kc, qi, qb, kb, h, b) += cast<float>(f.queries(2 * f.e.y + f.e.x, h, query, b)) *
                                           cast<float>(f.keys(f.e.x, key_of_dot, f.e.y, h, b));
    } else {
        f.dot(kl, kc, qi, qb, kb, h, b) = 0.0f;
        f.e = RDom(0, head_dim, "e");
        f.dot(kl, kc, qi, qb, kb, h, b) += q_heads(f.e, h, last(query, s_q), b) * f.keys(key_of_dot, f.e, h, b);
    }
    // The block's scores and exponentials exist only for the chunks visited (the updates
    // over key_in_block); the rest of a block is never computed or read. The bias's key is
    // clamped `likely` within the bias's keys, so that Halide splits off the chunks wholly
    // inside, which read it as dense vectors (a clamped vector index is otherwise a gather,
    // element by element); an absent bias's zeros reach past S_k for the last chunk too.
    f.scores = Func{"block_scores"};
    f.scores(kl, kc, qi, qb, kb, h, b) = undef<float>();
    f.scores(lane, chunk, qi, qb, kb, h, b) =
        f.dot(lane, chunk, qi, qb, kb, h, b) * (1.0f / sqrt(cast<float>(head_dim))) +
        bias(min(likely(key), max(bias_keys, s_k) - 1), last(query, s_q), h, b);
    Expr score = f.scores(lane, chunk, qi, qb, kb, h, b);
    f.block_max = Func{"block_max"};
    f.block_max(qi, qb, kb, h, b) = kLowest;
    f.block_max(qi, qb, kb, h, b) = max(f.block_max(qi, qb, kb, h, b), select(kept, score, kLowest));
    // What the block's exponentials are taken from. fp32: its max. bf16: the max rounded up
    // to a multiple of ln 2, so that exp(s − offset) is exp(s) times a power of 2 (to f32's
    // error) whichever block it is: its rounding to bf16 is then the same in every block
    // and in the reference (which takes any multiple of ln 2), and the weights stay in (½, 1]
    // at the block's max. Never below the max: beyond about 1e4 the f32 product may round
    // under it, and from about 1e9 on, where an ulp passes 88, a weight would overflow to
    // infinity (the max itself is used then: exact multiples of ln 2 do not exist at that
    // size in f32 anyway). A block with no key kept keeps kLowest, and a max beyond ±1e30
    // (whose multiple of ln 2 would overflow) itself, as the reference does; a NaN stays NaN,
    // so that it reaches the context through its weights (and, past the first block, the
    // running rescale), as in fp32.
    // (fp32 defines no Func for it, which would change the stages frozen schedules name.)
    Func offset_of = f.block_max;
    if (bf16) {
        Expr block_max = f.block_max(qi, qb, kb, h, b);
        const float ln2 = 0.693147180559945309f;
        offset_of = f.block_offset = Func{"block_offset"};
        f.block_offset(qi, qb, kb, h, b) =
            select(block_max == kLowest || abs(block_max) > 1e30f, block_max,
                   max(ceil(block_max * (1.0f / ln2)) * ln2, block_max));
    }
    f.block_exp = Func{"block_exp"};
    const Type weight_type = bf16 ? operand_type : Float(32);
    f.block_exp(kl, kc, qi, qb, kb, h, b) = undef(weight_type);
    // exp_nonpositive: 4.3e-7 relative error at most on [-87, 0] (with FMA), and a quarter
    // less time than Halide's fast_exp (1.7e-6), itself 2% faster than exp on long contexts; its
    // exponent holds 2^k down to k = -126, hence the clamp (exp(-87) = 1.6e-38 stands for
    // smaller weights). bf16: the weight rounded, as P·V reads it, and as the sum takes it.
    // A NaN score stays NaN (the max and the clamp would drop it: x86's max returns its other
    // operand), so that it reaches the sum and the context, as in the reference.
    Expr exponential =
        select(kept, select(is_nan(score), score, exp_nonpositive(max(score - offset_of(qi, qb, kb, h, b), -87.0f))), 0.0f);
    f.block_exp(lane, chunk, qi, qb, kb, h, b) =
        bf16 ? rounded_as(weight_type, exponential, bf16_core.rounding_instruction) : exponential;
    Expr weight = cast<float>(f.block_exp(lane, chunk, qi, qb, kb, h, b));
    f.block_sum = Func{"block_sum"};
    f.block_sum(qi, qb, kb, h, b) = 0.0f;
    f.block_sum(qi, qb, kb, h, b) += weight;
    f.block_context = Func{"block_context"};
    if (amx_tiles) {
        // 16 × 16 tiles of (head feature, query), each summed over a chunk's kAmxTileStep keys a
        // step (the rows of exponentials as they lie, and V's rows of key pairs, 16 head
        // features' pairs a row), over the chunks visited: past them the exponentials are
        // never computed.
        Var feature_in_tile{"feature_in_tile"}, feature_tile{"feature_tile"};
        f.chunk_keys = RDom({{0, C}, {0, blocking.chunks()}}, "chunk_keys");
        const RVar &in_chunk = f.chunk_keys.x, &key_chunk = f.chunk_keys.y;
        if (blocking.chunks() > 1) f.chunk_keys.where(chunk_visited(key_chunk));
        Expr key = kb * K + key_chunk * C + in_chunk;
        f.context_tile = Func{"context_tile"};
        f.context_tile(feature_in_tile, feature_tile, qi, qb, kb, h, b) = 0.0f;
        f.context_tile(feature_in_tile, feature_tile, qi, qb, kb, h, b) +=
            cast<float>(f.block_exp(in_chunk, key_chunk, qi, qb, kb, h, b)) *
            cast<float>(f.values(2 * (kAmxTileColumns * feature_tile + feature_in_tile) + key % 2, key / 2, h, b));
        f.block_context(e, qi, qb, kb, h, b) =
            f.context_tile(e % kAmxTileColumns, e / kAmxTileColumns, qi, qb, kb, h, b);
    } else if (bf16) {
        f.block_context(e, qi, qb, kb, h, b) = 0.0f;
        // Pairs of keys: (pair, key_pair_in_chunk, chunk), the key chunk·C + 2·key_pair + pair.
        f.key_pairs = RDom({{0, 2}, {0, C / 2}, {0, blocking.chunks()}}, "key_pairs");
        const RVar &p = f.key_pairs.x, &lane_pair = f.key_pairs.y, &pair_chunk = f.key_pairs.z;
        if (blocking.chunks() > 1) f.key_pairs.where(chunk_visited(pair_chunk));
        f.block_context(e, qi, qb, kb, h, b) +=
            cast<float>(f.block_exp(2 * lane_pair + p, pair_chunk, qi, qb, kb, h, b)) *
            cast<float>(f.values(p, e, (kb * K + pair_chunk * C) / 2 + lane_pair, h, b));
    } else {
        f.block_context(e, qi, qb, kb, h, b) = 0.0f;
        f.block_context(e, qi, qb, kb, h, b) += weight * f.values(e, key, h, b);
    }

    f.key_blocks = RDom(0, (s_k + K - 1) / K, "key_blocks");
    f.key_blocks.where(f.key_blocks * K < key_limit);
    f.one_key_block = s_k <= K;
    const RVar &block = f.key_blocks.x;
    f.running = Func{"running"};
    // Undefined until the first block visited sets it (below), so nothing is stored before; a
    // query block that visits none reads zeros instead (block_result).
    const bool from_first_block = blocking.state_from_first_block;
    if (from_first_block) {
        f.running(e, qi, qb, h, b) = Tuple(undef<float>(), undef<float>(), undef<float>());
    } else {
        f.running(e, qi, qb, h, b) = Tuple(0.0f, kLowest, 0.0f);
    }
    FuncRef now = f.running(e, qi, qb, h, b);
    Expr offset = offset_of(qi, qb, block, h, b);
    Expr new_max = max(now[1], offset);
    // exp(now[1] − new_max) and exp(offset − new_max): one of them is exp(0) = 1, so
    // one exponential of −|now[1] − offset| gives both.
    Expr block_is_max = offset >= now[1];
    Expr rescale = exp(-abs(now[1] - offset));
    // The first block (always block 0: the masks end the visits, never start them) is the
    // state itself: the same values as the merge with the initial state, without its
    // exponential, which a schedule specialized on one_key_block then never computes.
    Expr first = block == 0;
    Expr keep_old = select(first, 0.0f, select(block_is_max, rescale, 1.0f));
    Expr keep_block = select(first || block_is_max, 1.0f, rescale);
    Expr block_context = f.block_context(e, qi, qb, block, h, b), block_sum = f.block_sum(qi, qb, block, h, b);
    // A row with no key kept sums to 0 and gets zeros; a NaN sum still propagates.
    auto context_over = [](Expr context, Expr sum) { return select(sum == 0.0f, 0.0f, context / sum); };
    f.block_result = Func{"block_result"};
    FuncRef done = f.running(e, qi, qb, h, b);
    if (from_first_block) {
        // The first block is the state itself (the undefined state is never read). Where it is
        // the only one (one_key_block) it divides the context by its sum as it stores it, and
        // leaves the max and the sum as they are (stores of what they load, which Halide drops);
        // otherwise a second update divides, after the last block. block_result copies.
        // The sum's zero is tested on its bits: it is one per row at one key block, and LLVM
        // (Halide's no-NaN flags) makes a float test of a scalar one that a NaN passes as 0.
        auto context_over_sum = [](Expr context, Expr sum) {
            return select((reinterpret<uint32_t>(sum) << 1) == cast<uint32_t>(0), 0.0f, context / sum);
        };
        Expr merged_context = select(first, block_context, now[0] * keep_old + block_context * keep_block);
        Expr merged_sum = select(first, block_sum, now[2] * keep_old + block_sum * keep_block);
        f.running(e, qi, qb, h, b) =
            Tuple(select(f.one_key_block, context_over_sum(merged_context, merged_sum), merged_context),
                  select(f.one_key_block, now[1], select(first, offset, new_max)),
                  select(f.one_key_block, now[2], merged_sum));
        f.running(e, qi, qb, h, b) =
            Tuple(select(f.one_key_block, now[0], context_over_sum(now[0], now[2])), now[1], now[2]);
        f.block_result(e, qi, qb, h, b) = select(key_limit <= 0, 0.0f, done[0]);
    } else {
        f.running(e, qi, qb, h, b) =
            Tuple(now[0] * keep_old + block_context * keep_block, new_max, now[2] * keep_old + block_sum * keep_block);
        f.block_result(e, qi, qb, h, b) = context_over(done[0], done[2]);
    }
    f.ctx = Func{"ctx"};
    f.ctx(e, h, i, b) = f.block_result(e, i % Q, i / Q, h, b);
    return f;
}

PackedSequences packed_sequences(Func offsets, Expr sequences, Expr tokens) {
    const Var &b = dims.batch, &s = dims.seq, &j = dims.key;
    PackedSequences p;
    p.offsets = offsets;
    p.sequences = sequences, p.tokens = tokens;
    p.length = Func{"sequence_length"};
    p.length(b) = p.offset(b + 1) - p.offset(b);
    p.key_is_real = Func{"sequence_key_is_real"};
    p.key_is_real(j, b) = cast<uint8_t>(j < p.length(b));
    // Offsets do not decrease, so the sequence of row s is the last b with offsets(b) <= s
    // (empty sequences before it share its start): the count of later starts <= s.
    p.later_starts = RDom(1, sequences - 1, "later_starts");
    p.sequence = Func{"token_sequence"};
    p.sequence(s) = 0;
    p.sequence(s) += select(p.offset(p.later_starts) <= s, 1, 0);
    return p;
}

Expr PackedSequences::offset(Expr b) const { return offsets(clamp(b, 0, sequences)); }

Func PackedSequences::by_sequence(const std::string &name, Func token_heads) const {
    const Var &e = dims.head_dim, &h = dims.head, &i = dims.seq, &b = dims.batch;
    Func view{name};
    // Positions past a sequence's end read its last token (clamped, like every edge read);
    // an empty sequence reads a neighbour's, never used.
    view(e, h, i, b) = token_heads(e, h, clamp(offset(b) + min(i, length(b) - 1), 0, tokens - 1), 0);
    return view;
}

namespace {
// of_kv (..., seq, batch), or of_x at the same place where kv_is_x holds: K and V read what was
// computed from x, and of_kv is never computed (Halide computes a producer that only an untaken
// branch of a uniform select reads under that condition). x's rows are clamped to its s_q.
Func kv_or_x(Func of_x, Func of_kv, Expr kv_is_x, Expr x_rows) {
    std::vector<Expr> at_x;
    for (const Var &v : of_kv.args()) at_x.push_back(v.same_as(dims.seq) ? last(v, x_rows) : Expr(v));
    Func either{of_kv.name() + "_or_x"};
    either(of_kv.args()) = select(kv_is_x, of_x(at_x), of_kv(of_kv.args()));
    return either;
}
}  // namespace

AttentionLayer attention_layer(const LayerInputs &in) {
    const bool packed = in.sequence_offsets.defined();
    Expr head_dim = in.hidden / in.heads;
    // The rows the projections see: each batch's sequence, or every token row of packed sequences.
    Expr q_rows = packed ? in.tokens : in.s_q, kv_rows_all = packed ? in.tokens : in.s_k;
    AttentionLayer l;
    l.kv_is_x = in.kv_is_x;
    // What the projections read: the activations themselves, or rounded to bf16 once.
    Func x = in.x, kv = in.kv;
    const bool self_attention = in.kv.name() == in.x.name();
    if (in.precision == Precision::bf16) {
        l.x_rounded = x = rounded_to_bf16("x_rounded", in.x, in.hidden);
        l.kv_rounded = kv = self_attention ? l.x_rounded : rounded_to_bf16("kv_rounded", in.kv, in.hidden);
        if (!self_attention && in.kv_is_x.defined()) kv = kv_or_x(l.x_rounded, l.kv_rounded, in.kv_is_x, q_rows);
    }
    // int8: each projection's weight scales from weight_scales, and the rows quantized once.
    auto scales_of = [&](int projection) {
        const Var &o = dims.hidden;
        WeightScales w{Func{"weight_scale_" + std::to_string(projection)}, Func{"weight_sum_" + std::to_string(projection)}};
        w.scale(o) = in.weight_scales(o, 0, projection);
        w.sum(o) = cast<int32_t>(in.weight_scales(o, 1, projection));
        return w;
    };
    Int8Operands q_int8, kv_int8;
    if (in.precision == Precision::int8) {
        l.x_quantized = quantized_to_u8("x_quantized", in.x, in.hidden);
        l.kv_quantized = self_attention ? l.x_quantized : quantized_to_u8("kv_quantized", in.kv, in.hidden);
        l.x_rounded = x = l.x_quantized.values;
        l.kv_rounded = kv = l.kv_quantized.values;
        q_int8 = {l.x_quantized, scales_of(0), in.int8_sum};
        kv_int8.rows = l.kv_quantized;
        kv_int8.sum = in.int8_sum;
        if (!self_attention && in.kv_is_x.defined()) {
            // What K and V read of the rows: their values, steps and zero points.
            kv = kv_int8.rows.values = kv_or_x(l.x_quantized.values, l.kv_quantized.values, in.kv_is_x, q_rows);
            kv_int8.rows.step = kv_or_x(l.x_quantized.step, l.kv_quantized.step, in.kv_is_x, q_rows);
            kv_int8.rows.zero = kv_or_x(l.x_quantized.zero, l.kv_quantized.zero, in.kv_is_x, q_rows);
        }
    }
    // A bf16 flash core reads Q, K and V rounded to bf16: the projections store them so,
    // rounded once as they are computed (the same rounding), half the bytes to write and read.
    const Type qkv_type = !in.output_probs && in.core_precision == Precision::bf16 ? BFloat(16) : Float(32);
    // AMX: the rows the tiles read, copied once for Q and once for K and V, each copy rounding
    // (bf16) as it reads; one copy for all three where kv is x's Func with x's rows (packed
    // sequences). Where kv is x only at run time (kv_is_x), K's and V's copy reads x again.
    Func x_amx_rows, kv_amx_rows;
    if (in.amx_tiles) {
        x_amx_rows = rows_for_amx_tiles("x_amx_rows", x, in.hidden, q_rows);
        kv_amx_rows = self_attention && q_rows.same_as(kv_rows_all)
                          ? x_amx_rows
                          : rows_for_amx_tiles("kv_amx_rows", kv, in.hidden, kv_rows_all);
    }
    l.q = linear("q", x, in.w_q, in.b_q, in.hidden, q_rows, Func(), in.weight_layout, in.precision, q_int8, qkv_type,
                 in.weight_panel, in.amx_tiles, x_amx_rows);
    Func kv_rows{"kv_rows"};  // the flash core reads K and V up to the chunk holding each batch's last real key
    if (!in.output_probs && !packed) {
        l.key_end = last_real_key(in.key_padding_mask, in.s_k);
        const int C = in.blocking.key_chunk;
        kv_rows(dims.batch) = min((l.key_end(dims.batch) + C - 1) / C * C, in.s_k);
    }
    if (in.precision == Precision::int8) kv_int8.weight = scales_of(1);
    l.k = linear("k", kv, in.w_k, in.b_k, in.hidden, kv_rows_all, kv_rows, in.weight_layout, in.precision, kv_int8,
                 qkv_type, in.weight_panel, in.amx_tiles, kv_amx_rows);
    if (in.precision == Precision::int8) kv_int8.weight = scales_of(2);
    l.v = linear("v", kv, in.w_v, in.b_v, in.hidden, kv_rows_all, kv_rows, in.weight_layout, in.precision, kv_int8,
                 qkv_type, in.weight_panel, in.amx_tiles, kv_amx_rows);
    l.q_heads = split_heads("q_heads", l.q.out, head_dim);
    l.k_heads = split_heads("k_heads", l.k.out, head_dim);
    l.v_heads = split_heads("v_heads", l.v.out, head_dim);
    // What the attention core sees: the batch, or the packed sequences viewed as a padded batch.
    Func q_heads = l.q_heads, k_heads = l.k_heads, v_heads = l.v_heads, key_padding_mask = in.key_padding_mask;
    if (packed) {
        l.packed = packed_sequences(in.sequence_offsets, in.sequences, in.tokens);
        q_heads = l.packed.by_sequence("q_by_sequence", l.q_heads);
        k_heads = l.packed.by_sequence("k_by_sequence", l.k_heads);
        v_heads = l.packed.by_sequence("v_by_sequence", l.v_heads);
        key_padding_mask = l.packed.key_is_real;
        l.key_end = l.packed.length;
    }
    Func ctx;
    if (in.output_probs) {
        l.scores = scaled_scores(q_heads, k_heads, in.bias, head_dim, in.s_q, in.s_k);
        l.softmax = masked_softmax(l.scores.scores, key_padding_mask, in.causal, in.s_q, in.s_k);
        l.context = weighted_sum(l.softmax.probs, v_heads, head_dim, in.s_q, in.s_k);
        ctx = l.context.ctx;
    } else {
        l.flash = flash_attention(q_heads, k_heads, v_heads, key_padding_mask, l.key_end, in.bias, in.bias_keys,
                                  in.causal, head_dim, in.s_q, in.s_k, in.blocking, packed ? l.packed.length : Func(),
                                  in.core_precision, in.bf16_core);
        ctx = l.flash.ctx;
    }
    if (packed) {
        // Each token row takes its row of its sequence's context.
        const Var &e = dims.head_dim, &h = dims.head, &s = dims.seq, &b = dims.batch;
        Expr sequence = clamp(l.packed.sequence(s), 0, in.sequences - 1);
        l.packed.ctx = Func{"packed_ctx"};
        l.packed.ctx(e, h, s, b) = ctx(e, h, clamp(s - l.packed.offset(sequence), 0, in.s_q - 1), sequence);
        ctx = l.packed.ctx;
    }
    l.output = output_layernorm(ctx, in.x, in.w_o, in.b_o, in.gamma, in.beta, in.eps, head_dim, in.heads, in.hidden,
                                q_rows, in.weight_layout, in.precision,
                                in.precision == Precision::int8 ? scales_of(3) : WeightScales(), in.int8_sum,
                                in.weight_panel, in.amx_tiles);
    return l;
}

}  // namespace attn_gen
