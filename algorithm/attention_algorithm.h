// The BERT self-attention algorithm, written once (see shared DESIGN.md).
// Every generator (each stage alone, and the fused layer) builds its pipeline
// from these helpers; none of them schedules anything.
//
// Edge reads are clamped: every read whose index a schedule's register tile may run
// past (a token row, an output feature, a key, a packed sequence's offsets) goes through
// min(i, extent - 1) or a clamp, so a schedule can compute whole constant-size tiles at
// a buffer's edge; the extra values are never stored.
//
// Dimension order: buffers arrive in PyTorch's row-major layout, and Halide lists
// dimensions innermost first, so a [B, S, H] tensor is indexed (hidden, seq, batch)
// here and a [B, heads, S_q, S_k] tensor is (key, query, head, batch).
#pragma once

#include "Halide.h"

#include <string>

namespace attn_gen {

// Pure variables shared by the algorithm and the schedules. Halide identifies a
// Var by name, so a schedule may also spell them out itself.
struct Dims {
    Halide::Var hidden{"hidden"};  // feature index within H (or the output feature of a projection)
    Halide::Var seq{"seq"};        // token position
    Halide::Var batch{"batch"};
    Halide::Var head{"head"};
    Halide::Var head_dim{"head_dim"};  // feature index within one head, [0, d)
    Halide::Var key{"key"};            // j, the attended-to position
    Halide::Var query{"query"};        // i, the attending position
    // The flash core's blocks (FlashAttention below): i = query_block · Q + query_in_block,
    // and j = key_block · K + key_chunk · C + key_in_chunk, for Q, K and C the sizes of a
    // query block, a key block and a chunk of keys.
    Halide::Var query_block{"query_block"}, query_in_block{"query_in_block"};
    Halide::Var key_block{"key_block"}, key_chunk{"key_chunk"}, key_in_chunk{"key_in_chunk"};
};

// How a weight arrives: as nn.Linear's [out, in], (in, out) in Halide's order; or prepared
// once by its caller as the transpose, [in, out] = (out, in), the layout a GPU's kernels
// read, so that no call transposes it again (the runtime's Attention prepares it for a
// GPU variant's fused layer: runtime/src/pipeline_call.cpp, PreparedWeights); or, for a
// CPU's fp32 layer, prepared once in panels of `panel` output features (the target's vector of
// floats), each panel's rows one after another: (out % panel + panel·in, out / panel) =
// W[out, in] (the runtime's Attention: PreparedWeights), so that a register tile reads its
// weights as a few sequential streams (rows of the transpose, 3 KiB apart at H=768, left the
// Zen 3 VM's GEMMs at 63-81 GFLOP/s of a core's 100; these panels 94-96: docs/measurements.md,
// "The weights in panels"). Or, for a reduced precision's products (bf16 pairs, int8 quads of
// input features), prepared once in those groups as the products read them, and in the same
// panels, as rows of a panel's group·panel elements, grouped_rows(in, group) rows a panel:
// (group·(out % panel) + lane, in_group + grouped_rows·(out / panel)) = W[out,
// group·in_group + lane], zero past the input and output features (the runtime's Attention:
// ReducedWeights), so that a call reads each panel's group as one load, in place, and an AMX
// tile's operand is 16 of those rows.
enum class WeightLayout { linear, transposed, grouped, panels };

// The operands of the projections' GEMMs (DESIGN.md, "Reduced precision"): fp32; or bf16,
// where the weights arrive rounded to bf16 (once, by the layer's caller; the bf16 stages
// round their f32 weights as they read them), the activations are
// rounded to bf16 (round to nearest even) as they enter, and the products, exact in f32,
// are summed in f32 a pair of input features at a time: the unit of AVX512_BF16's
// vdpbf16ps, which Halide emits for a vectorized sum over such a pair. int8: the weights
// arrive quantized once by their caller (int8, symmetric, one scale per output feature, with
// each output's sum of quantized weights), the activations are quantized per token row as
// they enter (u8, asymmetric: QuantizedRows), and the products are summed in i32 four input
// features at a time: the unit of AVX512_VNNI's vpdpbusd (u8 × i8). The softmax, the residual
// and LayerNorm stay f32; the attention core's products are in the layer's core precision
// (LayerInputs::core_precision: manifest.json's core_precision, bf16 in the bf16 and int8 layers).
enum class Precision { fp32, bf16, int8 };
// The input features a product takes at a time, one 4-byte group: 1 in fp32, a pair in bf16, a
// quad in int8 (WeightLayout::grouped's groups).
inline int features_a_group(Precision precision) {
    return precision == Precision::int8 ? 4 : precision == Precision::bf16 ? 2 : 1;
}

// How an int8 GEMM sums its u8 × i8 products, exactly either way: in i32 a quad of input
// features at a time, the unit of AVX512_VNNI's vpdpbusd; or, on a CPU without VNNI, each pair
// of products first in i16 with a saturating add that never saturates (the weights are in
// [-63, 63], attn::kInt8WeightLimit, so |a·w + a'·w'| <= 2·255·63 = 32130 < 32767), AVX2's
// vpmaddubsw, then two pairs into i32 (vpmaddwd by ones): about twice the products of an FMA
// an instruction, where the pairs widened to i16 (vpmaddwd alone) ran at fp32's speed.
enum class Int8Sum { quads, pairs_in_i16 };

// Rows of activations quantized to u8 per token row (DESIGN.md, "Reduced precision"): the
// row's range [low, high] = [min(0, min x), max(0, max x)] in 255 steps of `step`, zero at
// `zero`; value = clamp(round(x · inverse_step) + zero, 0, 255), round to nearest even, so
// x ≈ step · (value − zero). A row of zeros (or of a range too small to invert) has step 1;
// one holding NaN or ±Inf has step NaN. All in f32, in this order, so that the reference
// (attn::quantize_row_u8) finds the same values.
struct QuantizedRows {
    Halide::Func stats;        // (seq, batch): Tuple(low, high, sum), one reduction over the row
    Halide::Func low, high;    // (seq, batch)
    Halide::Func sum;          // (seq, batch): Σ x, finite unless the row holds NaN or ±Inf
    Halide::Func inverse_step; // (seq, batch): 255 / (high − low), or 1
    Halide::Func step;         // (seq, batch): (high − low) / 255, or 1
    Halide::Func zero;         // (seq, batch) int32: round(−low · inverse_step)
    Halide::Func values;       // (feature, seq, batch) uint8; past the row, its last feature's
    Halide::RDom feature;      // over the row, for low and high
};
QuantizedRows quantized_to_u8(const std::string &name, Halide::Func in, Halide::Expr features);

// An int8 projection's dequantization: per output feature, the weight's scale and the sum of
// its quantized weights over the input features (which the row's zero point multiplies).
struct WeightScales {
    Halide::Func scale;  // (out) f32
    Halide::Func sum;    // (out) int32
};

// y = x · Wᵀ + b with nn.Linear's weight [out, in]: out(o, s, b) = bias(o) + Σ_k in(k, s, b) · weight(k, o).
// Square weights (H × H), `tokens` rows of `in` per batch. Given `rows` (rows(b): how many
// leading rows of batch b are used), only those are computed: `out` is then undefined
// past them and computed by an update over `row`, whose loop stops there. In bf16, `in`
// and `weight` are bf16 (the caller rounds the activations: rounded_to_bf16, read up to the
// next even feature). In int8, `in` is the caller's QuantizedRows' values (read up to the
// next multiple of 4 features),
// `weight` int8, and out = step · scale ·
// (product − zero · sum) + bias, the integer part exact. `out` is stored as `out_type`
// (bf16 for the Q, K and V a bf16 flash core reads: rounded once, where computed).
struct Linear {
    Halide::Func input;  // (in, seq, batch): what is projected
    // fp32: (out, in), which lets a schedule vectorize over output features. bf16:
    // (pair, out, in_pair), W[out, 2·in_pair + pair], zero past the input features, so that
    // a schedule vectorizes over (pair, out) for vdpbf16ps; int8 likewise in quads,
    // (quad, out, in_quad), for vpdpbusd.
    Halide::Func weight_transposed;
    // bf16: the operands the product multiplies, widened exactly to f32. A target with
    // vdpbf16ps inlines them (it takes the pairs as they are); elsewhere a schedule computes
    // them once, a panel of weights and the rows, so that its register tiles load ready
    // operands and run the fp32 loop: weight_widened(pair, out, in_pair), as weight_transposed.
    Halide::Func weight_widened, input_widened;
    // int8 summed in pairs (Int8Sum::pairs_in_i16): pair_sums(out_pair, seq, batch, in_quad),
    // out_pair = 2·out + pair_in_quad, the i16 sum of the pair's two products (an update over
    // its two features), which the product sums into i32 two at a time.
    Halide::Func pair_sums;
    WeightLayout weight_layout;  // transposed, grouped: weight_transposed only reads the weight
    Precision precision;
    Halide::Func product;  // (out, seq, batch): Σ_k in · Wᵀ, the GEMM (int8: in i32)
    Halide::Func out;      // (out, seq, batch): product + bias (int8: dequantized first), in out_type
    Halide::RDom k;        // fp32: (k); bf16: (pair, in_pair), the feature 2·in_pair + pair; int8: (quad, in_quad),
                           // or in pairs (pair_in_quad, in_quad)
    Halide::RDom row;      // the rows computed, when only some are; else undefined
    // AMX tiles (amx_tiles: bf16 and int8 on a target with AMX): the product is
    // amx_tile(out % 16, out / 16, seq, batch), one 16 × 16 tile of outputs a panel of 16 by 16
    // rows, summed over k (its features padded to a tile's, zero weights past them) from
    // amx_rows, the rows of `input` copied, zero past the features (rows_for_amx_tiles: their
    // reads clamped, as a tile's 16 rows run past the last; possibly shared with another
    // projection of the same input), each tile's operands as Halide's AMX lowering (ExtractTileOperations)
    // matches them: rows of the activations and rows of the grouped weight (grouped_at). k is
    // then one dimension over the padded features, and weight_transposed is undefined.
    Halide::Func amx_rows, amx_tile;
};
// int8 only: the rows' quantization and the weight's scales.
struct Int8Operands {
    QuantizedRows rows;
    WeightScales weight;
    Int8Sum sum = Int8Sum::quads;
};
Linear linear(const std::string &name, Halide::Func in, Halide::Func weight, Halide::Func bias, Halide::Expr features,
              Halide::Expr tokens, Halide::Func rows = Halide::Func(), WeightLayout layout = WeightLayout::linear,
              Precision precision = Precision::fp32, const Int8Operands &int8 = Int8Operands(),
              Halide::Type out_type = Halide::Float(32), int panel = 0,  // panel: WeightLayout::panels, ::grouped
              bool amx_tiles = false, Halide::Func shared_amx_rows = Halide::Func());
// What a projection's AMX tiles read (Linear::amx_rows): in's rows (hidden, seq, batch) clamped
// to the tokens, zero past the features. linear() makes its own, unless given shared_amx_rows:
// rows_for_amx_tiles(..., in, features, tokens) made by the caller for projections of the same
// input, which then share one copy (the fused layer's Q, and K with V).
Halide::Func rows_for_amx_tiles(const std::string &name, Halide::Func in, Halide::Expr features, Halide::Expr tokens);

// The outputs of an AMX tile (16 f32 or i32 columns), and the input features (or keys) one tile
// product sums here: 32, a bf16 tile's 16 rows of pairs, and an int8 tile's 8 rows of quads
// (half the 64 it could: Halide 21's AMX lowering takes one tile shape a pipeline, and the
// int8 layers' flash core sums bf16 tiles; with it they ran 1.13-1.53x as fast as with their
// 64-feature tiles and the core in f32 vectors on an Intel Xeon VM, docs/measurements.md).
constexpr int kAmxTileColumns = 16;
constexpr int kAmxTileRows = 16;  // rows of activations (or queries) a tile holds
constexpr int kAmxTileStep = 2 * kAmxTileColumns;
// The rows a panel of a grouped weight (WeightLayout::grouped) holds: its input features'
// groups, rounded up to an AMX tile's 16 rows (zeros past the features), so that every panel
// holds whole tiles (the runtime's ReducedWeights lays them out so).
Halide::Expr grouped_rows(Halide::Expr features, int group);

// in rounded to bf16 (to nearest even), as the bf16 GEMMs take their activations:
// (feature, seq, batch) of a (feature, seq, batch) Func of `features` features; past them,
// the last feature's (a GEMM reads whole pairs).
Halide::Func rounded_to_bf16(const std::string &name, Halide::Func in, Halide::Expr features);

// Head view of a [B, S, H] tensor: (head_dim, head, seq, batch), the transpose_for_scores view.
Halide::Func split_heads(const std::string &name, Halide::Func tensor, Halide::Expr head_dim);

// The operands of a bf16 QKᵀ or P·V (the flash core's, and the bf16 stages'), rounded to bf16
// (to nearest even) and laid out as their products read them: QKᵀ sums pairs of head
// features, P·V pairs of keys, each pair one 4-byte load (vdpbf16ps's unit). Stored as
// `operand_type`: bf16, or f32 holding the very values they round to (the flash core's, for a
// target without bf16 products: its loops then load them as fp32's do; the bf16 stages keep
// bf16 and widen in their tiles).
// Q: (head_dim, head, query, batch), zero past d (so that d may be odd).
Halide::Func queries_bf16(const std::string &name, Halide::Func q_heads, Halide::Expr head_dim, Halide::Expr s_q,
                          Halide::Type operand_type = Halide::BFloat(16));
// exp(t) for t in [-87, 0] (the flash core's weights): t = k·ln 2 + r with k = round(t / ln 2)
// and |r| <= ln 2 / 2, e^r a degree-5 polynomial (near-minimax for the relative error there,
// 7.5e-8), 2^k built in the exponent bits (k in [-126, 0]: a normal float, no clamp needed).
// Over every float of [-87, 0] (one run; tests/test_algorithm.cpp checks every 16th): at most
// 4.3e-7 relative error with fused multiply-adds (AVX2, AVX-512, NEON, CUDA), 4.3e-6 without
// (SSE4.1, where k·ln 2 is rounded), 1.8e-7 absolutely either way; Halide's fast_exp, which it
// replaced: 1.7e-6, 5.3e-6 and 9.9e-7. 14 vector instructions on AVX2 against fast_exp's 16
// (docs/measurements.md, "An exponential of our own"); 14 on AVX-512 too, where Halide's
// rounding of 16 lanes in two 8-lane halves had made 17 ("The exponentials' loop, shorter").
Halide::Expr exp_nonpositive(Halide::Expr t);
// f32 x rounded to bf16 (to nearest, ties to even), as `type` (bf16, or the f32 value it
// rounds to); bf16 x as it is. Every rounding to bf16 of the algorithm's. Written out as Halide's
// cast writes it, with two differences: not inside strict_float, which also denied x's own
// arithmetic its fused multiply-adds (the exponentials' polynomial: 4.2e-6 relative error
// instead of 4.3e-7, exp_nonpositive), and a NaN stays NaN, its quiet bit set (Halide's
// rounding of the bits makes 0x7fffffff -0 and 0xffffffff, memset 0xff's pattern, +0), as
// the reference's round_to_bf16 keeps it. With `instruction`, vcvtne2ps2bf16 (Bf16Core).
Halide::Expr rounded_as(Halide::Type type, Halide::Expr x, bool instruction = false);
// x as `type`: rounded_as for bf16, a plain cast otherwise.
Halide::Expr converted(Halide::Type type, Halide::Expr x);
// fp32's K packed per head, keys innermost, for QKᵀ's vectors of keys: (key, head_dim, head, batch).
Halide::Func keys_transposed(const std::string &name, Halide::Func k_heads, Halide::Expr head_dim, Halide::Expr s_k);
// K: (pair, key, head_dim_pair, head, batch), K[key, 2·head_dim_pair + pair], zero past d.
Halide::Func keys_in_pairs(const std::string &name, Halide::Func k_heads, Halide::Expr head_dim, Halide::Expr s_k,
                           Halide::Type operand_type = Halide::BFloat(16));
// V: (pair, head_dim, key_pair, head, batch), V[2·key_pair + pair, head_dim]; past s_k, the
// last key's (its weight is zero).
Halide::Func values_in_pairs(const std::string &name, Halide::Func v_heads, Halide::Expr head_dim, Halide::Expr s_k,
                             Halide::Type operand_type = Halide::BFloat(16));

// A Func of pairs, (pair, along, outer, head, batch), as rows of pairs: (2·along + pair, outer,
// head, batch), one dimension (AMX tiles' operand: Halide 21's lowering matches a row stride
// that is one factor, which the two dimensions' 2·extent is not).
Halide::Func pair_rows(const std::string &name, Halide::Func pairs);

// scores(j, i, h, b) = Q[b,i,h,:]·K[b,j,h,:] / √d + bias(j, i, h, b). In bf16 (precision), Q
// and K are rounded to bf16 and the products summed in f32 a pair of head features at a time.
struct Scores {
    Precision precision = Precision::fp32;
    // (head_dim, head, query, batch): Q's head view; bf16: rounded (queries_bf16)
    Halide::Func query_heads;
    // fp32: (key, head_dim, head, batch), K with keys innermost. bf16: keys_in_pairs.
    Halide::Func key_transposed;
    Halide::Func dot;  // unscaled Q·Kᵀ
    Halide::Func scores;
    Halide::RDom e;  // fp32: (head_dim); bf16: (pair, head_dim_pair)
};
Scores scaled_scores(Halide::Func q_heads, Halide::Func k_heads, Halide::Func bias, Halide::Expr head_dim,
                     Halide::Expr s_q, Halide::Expr s_k, Precision precision = Precision::fp32);

// A key j is kept for query i unless key_padding_mask(j, b) == 0, or causal and
// j > i + (S_k − S_q) (bottom-right aligned). Excluded keys get probability 0; a row
// with no kept key is all zeros. The row max is subtracted for stability.
struct MaskedSoftmax {
    Halide::Func keep;        // (key, query, head, batch) bool
    Halide::Func row_max;     // (query, head, batch)
    Halide::Func exp_scores;  // (key, query, head, batch)
    Halide::Func row_sum;     // (query, head, batch)
    Halide::Func probs;       // (key, query, head, batch)
    Halide::RDom j;
};
MaskedSoftmax masked_softmax(Halide::Func scores, Halide::Func key_padding_mask, Halide::Expr causal, Halide::Expr s_q,
                             Halide::Expr s_k);

// ctx(e, h, i, b) = Σ_j probs(j, i, h, b) · V[b, j, h, e]. In bf16 (precision), the
// probabilities and V are rounded to bf16 and the products summed in f32 a pair of keys at a time.
struct WeightedSum {
    Precision precision = Precision::fp32;
    // (key, query, head, batch): what weights the values; bf16: rounded, zero past s_k
    Halide::Func probs;
    // fp32: (head_dim, head, key, batch), V's head view. bf16: values_in_pairs.
    Halide::Func values;
    Halide::Func ctx_sum;  // (head_dim, head, query, batch): the reduction over keys
    Halide::Func ctx;      // (head_dim, head, query, batch): its result
    Halide::RDom j;        // fp32: (key); bf16: (pair, key_pair)
};
WeightedSum weighted_sum(Halide::Func probs, Halide::Func v_heads, Halide::Expr head_dim, Halide::Expr s_q,
                         Halide::Expr s_k, Precision precision = Precision::fp32);

// y = LayerNorm(x + ctx · W_oᵀ + b_o), population variance, eps inside the root.
struct OutputLayerNorm {
    Halide::Func context_heads;      // (head_dim, head, seq, batch): what is projected
    Halide::Func weight_transposed;  // W_o as (out, in); bf16: as Linear's
    WeightLayout weight_layout;      // transposed: weight_transposed only reads W_o
    // bf16: the context rounded to bf16, by feature (hidden, seq, batch), and the GEMM as a
    // Linear over it (bias zero), whose product is `projection`; undefined in fp32. int8:
    // context_rounded is the context by feature in f32, quantized as `context_quantized`.
    // Zeros, then an update over context_features, (head_dim, head), writing h·d + e.
    Halide::Func context_rounded;
    Halide::RDom context_features;
    QuantizedRows context_quantized;
    Linear rounded;
    Halide::Func projection;         // (hidden, seq, batch): ctx · W_oᵀ, the GEMM
    Halide::Func dense;              // (hidden, seq, batch): residual + projection + bias
    Halide::Func sum;                // (seq, batch): Σ dense over the row
    Halide::Func sum_sq_dev;         // (seq, batch): Σ (dense − mean)² over the row (two-pass: accurate)
    Halide::Func mean, variance;     // (seq, batch), pure: sum / H and sum_sq_dev / H
    Halide::Func y;                  // (hidden, seq, batch)
    Halide::RDom in_feature;         // (head_dim, head) over the context's head view (fp32)
    Halide::RDom row;                // over the H output features
};
OutputLayerNorm output_layernorm(Halide::Func ctx_heads, Halide::Func residual, Halide::Func w_o, Halide::Func b_o,
                                 Halide::Func gamma, Halide::Func beta, Halide::Expr eps, Halide::Expr head_dim,
                                 Halide::Expr heads, Halide::Expr hidden, Halide::Expr tokens,
                                 WeightLayout layout = WeightLayout::linear, Precision precision = Precision::fp32,
                                 WeightScales w_o_scales = WeightScales(), Int8Sum int8_sum = Int8Sum::quads,
                                 int panel = 0, bool amx_tiles = false);

// The block sizes of the flash core (generator parameters query_block, key_block and
// key_chunk). They belong to the algorithm: the online softmax folds in one key block at a
// time, and the keys of a block are computed a chunk at a time.
struct Blocking {
    int query_block;
    int key_block;  // rounded up to whole chunks
    int key_chunk;
    // The running state undefined until the first key block sets it, and the context divided by
    // its sum by the last (FlashAttention::running): for the hand-written CPU schedule, which
    // schedules its second update; the autoschedulers' frozen schedules and the GPU schedule
    // name the stages of the state initialized to (0, lowest, 0).
    bool state_from_first_block = false;
    int chunks() const { return (key_block + key_chunk - 1) / key_chunk; }
};

// One past the last real key of each batch (0 if none): key_end(b).
Halide::Func last_real_key(Halide::Func key_padding_mask, Halide::Expr s_k);

// How a bf16 flash core is written for the target's instructions (the generator derives it
// from the target: AttentionGenerator::bf16_core). The same products, sums and roundings in each.
struct Bf16Core {
    // Q, K, V and the exponentials held as the f32 values they round to, for a target without
    // vdpbf16ps: it then runs fp32's loops (widening bf16 in them took 1.4-1.5x the fp32
    // core's time on AVX2).
    bool widened = false;
    // QKᵀ and P·V in AMX tiles: key_chunk kAmxTileStep, query_block a multiple of 16.
    bool amx_tiles = false;
    // The exponentials rounded by vcvtne2ps2bf16 (avx512bf16), through the wrapper in Halide 21's
    // x86 runtime (Halide itself emulates the rounding in 5 instructions: halide#7219). Halide
    // finds the wrapper for vectors of more than 8 f32 lanes (padded or split to 32; the
    // hand-written schedule's are 16): narrower vectors or scalars would leave an undefined
    // symbol, vcvtne2ps2bf16, at link time.
    bool rounding_instruction = false;
};

// The attention core without an S_q × S_k buffer (flash-style), for the fused layer when
// the probabilities are not an output: the queries in blocks of Q = query_block, the keys
// in blocks of K = key_block. For each query block, the key blocks are folded in one at
// a time with an online softmax: a block's scores, their max m_b, the exponentials
// exp(s − m_b), their sum l_b and their weighted sum of V c_b are merged into a running
// (context, max, sum) = (c, m, l) as m' = max(m, m_b), c' = c·exp(m − m') + c_b·exp(m_b − m')
// and l' = l·exp(m − m') + l_b·exp(m_b − m'); the context is c / l at the end (zeros where
// l = 0: no key kept). Keys that no query of the block may see are never visited: the
// loop over key blocks, and within the last block visited the loop over its chunks of
// key_chunk keys, stop at the causal diagonal of the block's last query and at the
// batch's last real key; a query block wholly past query_end(b), when given (the end of
// a packed sequence), visits none. Masks and the bias apply per score as in MaskedSoftmax.
//
// In bf16 (precision), Q, K and V are rounded to bf16 as the core reads them (the fused bf16
// and int8 layers' projections store them already rounded: the casts are then no-ops), and so are
// the exponentials, which P·V and the sums take as rounded: QKᵀ sums pairs of head
// features and P·V pairs of keys, bf16 products summed in f32 (vdpbf16ps where the target
// has it, AMX tiles where it has those: amx_tiles). The exponentials are taken from the
// block's max rounded up to a multiple of ln 2 (block_offset), so that each weight is
// exp(score) times a power of 2 and rounds to bf16 the same whatever the blocking (DESIGN.md,
// "Reduced precision").
struct FlashAttention {
    Precision precision;       // fp32 or bf16
    // fp32: (key, head_dim, head, batch), K packed per head, keys innermost. bf16:
    // (pair, key, head_dim_pair, head, batch), K[key, 2·head_dim_pair + pair] rounded, zero past d;
    // with AMX tiles, those as rows of pairs (pair_rows): (2·key + pair, head_dim_pair, head, batch).
    Halide::Func keys;
    // fp32: (head_dim, key, head, batch), V packed per head. bf16: (pair, head_dim, key_pair,
    // head, batch), V[2·key_pair + pair, head_dim] rounded; with AMX tiles, as rows of pairs
    // (2·head_dim + pair, key_pair, head, batch).
    Halide::Func values;
    Halide::Func queries;      // bf16: (head_dim, head, query, batch), Q rounded; undefined in fp32
    Halide::Func key_is_real;  // (key, batch): 1 for a real token within s_k, else 0 (int32), for whole blocks
    Halide::Expr head_dim;     // d
    Halide::Expr causal;       // the causal mask's switch, which a schedule may specialize on
    Halide::Expr one_key_block;  // s_k <= key_block: no query block visits a second key block (likewise)
    // Per (key_in_chunk, key_chunk, query_in_block, query_block, key_block, head, batch):
    Halide::Func dot;        // Q·Kᵀ
    Halide::Func scores;     // dot / √d + bias; an update over the chunks visited, undefined elsewhere
    Halide::Func block_exp;  // exp(score − block_offset), 0 where excluded (bf16: rounded); an update like scores
    // Per (query_in_block, query_block, key_block, head, batch):
    Halide::Func block_max, block_sum;
    Halide::Func block_offset;   // bf16: what the exponentials subtract, block_max rounded up to a multiple of ln 2 (fp32: block_max)
    Halide::Func block_context;  // (head_dim, query_in_block, ...): Σ exp · V over the block
    // (head_dim, query_in_block, query_block, head, batch): Tuple(context, max or offset, sum).
    // Blocking::state_from_first_block: undefined until the first block visited, and the context
    // divided by the sum by the last (the one block's merge, or a second update), which
    // block_result then copies.
    Halide::Func running;
    Halide::Func block_result;   // (head_dim, query_in_block, query_block, head, batch): context / sum
    Halide::Func ctx;            // (head_dim, head, query, batch): block_result by query, as WeightedSum's ctx
    Halide::RDom e;              // the head dimension, for Q·Kᵀ (bf16: (pair, head_dim_pair); AMX tiles: d
                                 // padded to whole steps of kAmxTileStep)
    Halide::RDom key_in_block;   // (key_in_chunk, key_chunk): the chunks of a block a query block may see
    Halide::RDom key_pairs;      // bf16: (pair, key pair in chunk, key_chunk), key_in_block's keys in pairs, for P·V
    Halide::RDom chunk_keys;     // AMX tiles: (key in chunk, key_chunk), the chunks visited, for P·V
    Halide::RDom key_blocks;     // the key blocks visited
    Blocking blocking;
    // AMX tiles (amx_tiles: a bf16 core on a target with AMX): dot is dot_tile(key % 16,
    // key / 16, query_in_block, key_chunk, ...), 16 × 16 tiles of scores summed over the head
    // features (e, padded to whole steps of kAmxTileStep), and block_context is
    // context_tile(e % 16, e / 16, query_in_block, ...), 16 × 16 tiles of the context summed over
    // each visited chunk of kAmxTileStep keys (chunk_keys). The
    // operands are rows as they lie: Q's and the exponentials' rows, and K's and V's rows of
    // pairs (keys, values), as Halide's AMX lowering matches them.
    Halide::Func dot_tile, context_tile;
};
// bias_keys: the bias buffer's extent along keys, S_k or more (an absent bias's row of zeros
// reaches past S_k, so that the last chunk of keys reads it without clamping).
FlashAttention flash_attention(Halide::Func q_heads, Halide::Func k_heads, Halide::Func v_heads,
                               Halide::Func key_padding_mask, Halide::Func key_end, Halide::Func bias,
                               Halide::Expr bias_keys, Halide::Expr causal, Halide::Expr head_dim, Halide::Expr s_q,
                               Halide::Expr s_k, Blocking blocking, Halide::Func query_end = Halide::Func(),
                               Precision precision = Precision::fp32, Bf16Core bf16_core = {});

// Packed variable-length sequences (DESIGN.md): the tokens of B sequences one after
// another, sequence b being the token rows [offsets(b), offsets(b + 1)). The projections
// and the output run over the T token rows; the attention core runs on a view of them
// as a batch of B sequences padded to max_length, whose padded keys are masked and whose
// query blocks past a sequence's end visit no key, so the padding costs no work beyond
// the partial blocks. Tokens of different sequences never meet.
struct PackedSequences {
    Halide::Func offsets;       // (batch), B + 1 entries
    Halide::Func length;        // (batch): offsets(b + 1) - offsets(b)
    Halide::Func key_is_real;   // (key, batch) uint8: key < length(b), the core's key_padding_mask
    Halide::Func sequence;      // (seq): the sequence of a token row (how many of offsets(1..B-1) are <= it)
    Halide::RDom later_starts;  // offsets(1..B-1), for `sequence`
    Halide::Func ctx;           // (head_dim, head, seq, batch of 1): the core's ctx gathered back to token rows
    Halide::Expr sequences, tokens;
    // offsets(b), read at b clamped to [0, sequences]: a schedule may compute a sequence
    // past the last (a rounded-up split, a vector of sequences), which then reads as
    // empty instead of past the buffer. Every read of the offsets goes through it.
    Halide::Expr offset(Halide::Expr b) const;
    // (head_dim, head, position, sequence) view of a (head_dim, head, token, batch of 1) Func.
    Halide::Func by_sequence(const std::string &name, Halide::Func token_heads) const;
    bool defined() const { return offsets.defined(); }
};
PackedSequences packed_sequences(Halide::Func offsets, Halide::Expr sequences, Halide::Expr tokens);

// The whole layer, with every intermediate Func named so schedules can reach it.
struct AttentionLayer {
    // bf16: what the projections read (kv_rounded == x_rounded for self-attention); with AMX
    // tiles never stored on their own, but rounded as the tiles' rows are copied (Linear::amx_rows)
    Halide::Func x_rounded, kv_rounded;
    QuantizedRows x_quantized, kv_quantized;  // int8: likewise (their values are x_rounded and kv_rounded)
    Halide::Expr kv_is_x;                      // LayerInputs::kv_is_x: the K and V projections' specialization
    Linear q, k, v;
    Halide::Func q_heads, k_heads, v_heads;
    // With the probabilities as an output, the exact stages (scores, softmax, weighted
    // sum); otherwise the flash core, and these are left undefined.
    Scores scores;
    MaskedSoftmax softmax;
    WeightedSum context;
    Halide::Func key_end;    // the flash core's: last_real_key, or each packed sequence's length
    FlashAttention flash;    // defined when the probabilities are not an output
    PackedSequences packed;  // defined for packed sequences
    OutputLayerNorm output;
};

struct LayerInputs {
    Halide::Func x, kv;  // (hidden, seq, batch); kv == x for self-attention
    // Dense reduced precision: a bool, true at run time for self-attention (kv is x); K and V then
    // read x's rounding or quantization, and kv's is skipped. Undefined: kv's is always computed.
    Halide::Expr kv_is_x;
    Halide::Func w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, gamma, beta;
    WeightLayout weight_layout = WeightLayout::linear;  // of w_q, w_k, w_v and w_o
    int weight_panel = 0;                               // WeightLayout::panels, ::grouped: outputs a panel
    Precision precision = Precision::fp32;              // of the projections; bf16: the four weights are bf16
    Precision core_precision = Precision::fp32;         // of the flash core's products: fp32 or bf16
    Bf16Core bf16_core;                                 // how a bf16 core is written (flash_attention)
    // int8: the four weights are int8, and weight_scales (out, quantity, projection) holds, for
    // the projections q, k, v, o (0-3), each output's scale (quantity 0) and quantized sum (1).
    Halide::Func weight_scales;
    Int8Sum int8_sum = Int8Sum::quads;  // int8: how the products are summed (the target's instructions)
    Halide::Func key_padding_mask;  // (key, batch)
    bool amx_tiles = false;         // bf16, int8: the four projections in AMX tiles (Linear::amx_tile)
    Halide::Func bias;              // (key, query, head, batch)
    Halide::Expr bias_keys;         // the bias's extent along keys, S_k or more (flash_attention)
    Halide::Expr causal, heads, eps, hidden, s_q, s_k;
    // Packed sequences instead of a batch: x (and kv) hold T = `tokens` token rows as a
    // batch of one, sequence_offsets (batch) has `sequences` + 1 entries, s_q = s_k is the
    // longest sequence and key_padding_mask is unused. Undefined for a dense batch.
    Halide::Func sequence_offsets;
    Halide::Expr sequences, tokens;
    bool output_probs = false;  // the exact stages, whose probabilities are an output; else the flash core
    Blocking blocking;          // the flash core's blocks
};
AttentionLayer attention_layer(const LayerInputs &in);

}  // namespace attn_gen
