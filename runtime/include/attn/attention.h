// attn: BERT-style multi-head self-attention, compiled ahead of time with Halide.
//
// Tensors are views over the caller's memory in PyTorch's contiguous row-major
// order (shapes below are PyTorch shapes); a CPU variant copies none of a call's tensors
// (an Attention prepares its weight matrices once, see its constructor). Every entry
// point validates its arguments first and reports a problem by throwing attn::Error,
// whose message names the argument, the expected and the actual value.
//
// GPU variants (device "cuda"; "opencl" runs the same schedules on any OpenCL device)
// take host memory, which they copy to the device and back, results ready on return;
// or CUDA device memory the caller owns (attn::device_view, a CUdeviceptr of the
// device's primary context, as cudaMalloc and PyTorch give), used in place: the call
// then returns once the kernels are queued, and attn::synchronize() waits for them
// before the results are read. Driver failures come back as attn::Error("halide")
// carrying the driver's message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace attn {

class Error : public std::runtime_error {
public:
    Error(std::string argument, const std::string &message)
        : std::runtime_error(argument + ": " + message), argument_(std::move(argument)) {}
    // The argument at fault ("x", "key_padding_mask", "variant", ...), or "halide"
    // for a failure reported from inside a pipeline.
    const std::string &argument() const { return argument_; }

private:
    std::string argument_;
};

using Shape = std::vector<int64_t>;

// Where a tensor's elements are: host memory, or CUDA device memory (a CUdeviceptr).
enum class Memory { host, device };

// `size` is the number of elements available at `data`: a view whose shape needs
// more is rejected rather than read or written out of bounds.
template <typename T>
struct TensorView {
    T *data = nullptr;
    std::size_t size = 0;
    Shape shape;
    Memory memory = Memory::host;

    TensorView() = default;
    TensorView(T *data_, std::size_t size_, Shape shape_, Memory memory_ = Memory::host)
        : data(data_), size(size_), shape(std::move(shape_)), memory(memory_) {}
    // A mutable view converts to a read-only one.
    template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T> && !std::is_const_v<U>>>
    TensorView(const TensorView<U> &other)
        : data(other.data), size(other.size), shape(other.shape), memory(other.memory) {}

    bool empty() const { return data == nullptr && size == 0 && shape.empty(); }
};
using ConstTensor = TensorView<const float>;
using MutableTensor = TensorView<float>;
using MaskTensor = TensorView<const uint8_t>;    // 1 = real token, 0 = padding
using OffsetTensor = TensorView<const int32_t>;  // packed sequences' offsets (host memory)

// Views over a container's storage, e.g. attn::view(std::vector<float>&, {B, S, H}).
template <typename Container>
auto view(Container &c, Shape shape) -> TensorView<std::remove_reference_t<decltype(*c.data())>> {
    return {c.data(), c.size(), std::move(shape)};
}

// A view of CUDA device memory: `device_pointer` is a CUdeviceptr holding `size` elements.
template <typename T>
TensorView<T> device_view(uint64_t device_pointer, std::size_t size, Shape shape) {
    return {reinterpret_cast<T *>(static_cast<uintptr_t>(device_pointer)), size, std::move(shape), Memory::device};
}

// The precision of the layer's four projections (DESIGN.md, "Reduced precision"); the
// attention core's products (QKᵀ, P·V) are bf16 in bf16 and int8 (ReducedPrecision::bf16_core()),
// f32 in fp32; softmax, residual and LayerNorm are f32 in all three.
//   fp32: f32 weights and activations.
//   bf16: the weights rounded to bf16 once, when the Attention is made (to nearest even;
//         half the memory), the activations rounded to bf16 as they enter each projection,
//         products summed in f32: with AVX512_BF16's vdpbf16ps (variants of an ISA with
//         avx512bf16), or, where the CPU lacks it and Config::allow_storage_only says so,
//         widened to f32 (bf16 storage, f32 arithmetic: the same rounding, within the accuracy
//         rule, at about the fp32 layer's speed on AVX2).
//         Attention::forward and forward_packed, without the probabilities, and the stages
//         (attn::stages, which round their f32 weights on every call); attn::bf16_variants()
//         lists the variants that have it.
//   int8: each weight matrix quantized once, when the Attention is made, to 7-bit values
//         ([-63, 63], kInt8WeightLimit) in int8 with one scale per output feature
//         (attn::quantize_int8: a quarter of the memory); the activations quantized to u8 per
//         token row as they enter each projection (attn::quantize_row_u8); products summed
//         in i32 and dequantized in f32: with AVX512_VNNI's vpdpbusd (variants of an ISA with
//         avx512vnni), or, where the CPU lacks it and Config::allow_storage_only says so, with
//         the same integer products summed in pairs in 16 bits first (AVX2's vpmaddubsw, which
//         7-bit weights keep from saturating: the same integer sums, 1.5-1.9x the fp32
//         layer's speed on AVX2; results within the accuracy rule, not bit for bit, as the
//         core's f32 sums run in another order). Attention::forward
//         and forward_packed, without the probabilities; attn::precision_variants() lists
//         the variants that have it.
enum class Precision { fp32, bf16, int8 };
// "fp32", "bf16", "int8".
const char *precision_name(Precision precision);
// "fp32, bf16 or int8", for messages; and a name back to its Precision, or attn::Error(argument)
// naming the expected ones.
std::string precision_names();
Precision precision_from_name(const std::string &name, const std::string &argument);

struct Config {
    int64_t hidden_size = 768;
    int64_t num_heads = 12;
    float layer_norm_eps = 1e-12f;
    bool causal = false;  // decoder mask: key j excluded for query i when j > i + (S_k − S_q)
    Precision precision = Precision::fp32;
    // bf16 on a CPU without avx512bf16, or int8 on one without avx512vnni: run the variant
    // that computes the same rounding without the instructions (bf16 storage with f32
    // arithmetic; int8 products summed in pairs by vpmaddubsw), within the accuracy rule, rather than refuse.
    bool allow_storage_only = false;

    int64_t head_dim() const { return num_heads > 0 ? hidden_size / num_heads : 0; }
};

// nn.Linear convention: weights [H_out, H_in], biases [H].
struct LayerWeights {
    ConstTensor w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o;
    ConstTensor gamma, beta;  // LayerNorm scale and shift, [H]
};

struct AttentionInputs {
    ConstTensor x;                // [B, S_q, H]: queries and the residual
    ConstTensor kv;               // [B, S_k, H]: keys and values; empty for self-attention (kv = x)
    MaskTensor key_padding_mask;  // [B, S_k]; empty: every key is real
    ConstTensor bias;             // [B or 1, heads or 1, S_q, S_k] added to the scores; empty: none
};

// Packed variable-length sequences (DESIGN.md), as FlashAttention's varlen API takes
// them: only the real tokens, so no work is spent on padding. Each sequence is computed
// exactly as forward() computes a batch of one of its length; tokens of different
// sequences never attend to each other. Causal (Config::causal) applies per sequence.
struct PackedInputs {
    ConstTensor x;                  // [T, H]: every sequence's tokens, one sequence after another
    OffsetTensor sequence_offsets;  // [B + 1], cu_seqlens: 0 = o_0 <= ... <= o_B = T; sequence b is rows
                                    // [o_b, o_{b+1}); empty sequences allowed; host memory
    ConstTensor bias;               // [heads or 1, S_max, S_max] added to the score of positions (i, j) within each
                                    // sequence, S_max >= the longest sequence (relative positions, ALiBi); empty: none
};

// A padded batch's real tokens, packed (attn::pack), as the vectors PackedInputs views.
struct PackedBatch {
    std::vector<float> x;                   // [T, H]
    std::vector<int32_t> sequence_offsets;  // [B + 1]
    int64_t hidden = 0;
    int64_t tokens() const { return hidden > 0 ? int64_t(x.size()) / hidden : 0; }
    PackedInputs inputs() const {
        return {{x.data(), x.size(), {tokens(), hidden}},
                {sequence_offsets.data(), sequence_offsets.size(), {int64_t(sequence_offsets.size())}},
                {}};
    }
};
// The elements of forward_packed's probabilities for these sequences: the sum over them
// of heads·L_b² (the offsets are validated as forward_packed does, but for T).
int64_t packed_probs_size(OffsetTensor sequence_offsets, int64_t heads);
// Keeps the tokens of x [B, S, H] whose key_padding_mask [B, S] is 1, which must be right
// padding (each row: ones, then zeros); an empty mask keeps every token.
PackedBatch pack(ConstTensor x, MaskTensor key_padding_mask);
// Writes packed rows [T, H] back to padded [B, S, H] (S >= the longest sequence), zeros
// at padded positions.
void unpack(ConstTensor packed, OffsetTensor sequence_offsets, MutableTensor padded);

// The extents of one call: B (packed: the sequences), S_q and S_k (packed: the longest
// sequence), the heads, the head dimension d and the hidden size H = heads·d.
struct ProblemExtents {
    int64_t batch = 1, seq_q = 1, seq_k = 1, heads = 1, head_dim = 1, hidden = 1;
};
// Its dimensions by name, as manifest.json's min_shapes names them, in this order.
struct ProblemDimension {
    const char *name;
    int64_t ProblemExtents::*extent;
};
inline constexpr ProblemDimension kProblemDimensions[] = {
    {"batch", &ProblemExtents::batch}, {"seq_q", &ProblemExtents::seq_q},       {"seq_k", &ProblemExtents::seq_k},
    {"heads", &ProblemExtents::heads}, {"head_dim", &ProblemExtents::head_dim}, {"hidden", &ProblemExtents::hidden}};

// A variant: one ISA's build with one schedule source (the project's manifest.json).
struct VariantInfo {
    std::string name;      // "<schedule>_<isa>", e.g. "manual_avx2"
    std::string schedule;  // schedule source: autotuned, manual, mullapudi2016, adams2019, li2018, anderson2021
    std::string isa;       // sse41, avx2, avx512_zen4, ...; cuda and opencl for GPU variants
    std::string target;    // the Halide target it was compiled for
    std::string device;    // "cpu", "cuda" or "opencl"
    // The AOT functions it provides: qkv_projection, attention_scores, masked_softmax,
    // weighted_sum, output_layernorm (the stages), attention_core (scores, softmax and
    // weighted sum fused), attention_layer and
    // attention_layer_probs (the fused layer, without and with the probabilities), and
    // attention_layer_packed and attention_layer_packed_probs (the same over packed sequences).
    std::vector<std::string> functions;
    bool provides(const std::string &function) const;  // `function` is one of `functions`
    bool bitwise_reproducible = true;  // the same input gives the same bits on every run
    // Every variant runs every valid shape. Most do it with their own kernels; a few
    // (manifest.json: min_shapes, the GPU autoscheduled ones) have kernels whose tiles
    // need extents of at least min_shapes[function], for the reason in
    // min_shapes_because. A call with any extent below them runs the kernels of
    // `fallback`, the same device's hand-written variant, instead: same results contract,
    // its speed. runs_own_kernels() says which kernels a call gets; the benchmarks skip
    // such calls rather than time the fallback under this variant's name.
    std::map<std::string, ProblemExtents> min_shapes;
    std::string min_shapes_because;
    std::string fallback;  // "manual_<isa>" where min_shapes is not empty
    bool runs_own_kernels(const std::string &function, const ProblemExtents &call) const;
    bool runnable = false;            // this machine can run it
    std::string not_runnable_reason;  // why not, when it cannot
};

// Every compiled variant, by ISA then schedule source, in manifest order.
const std::vector<VariantInfo> &variants();
// bf16 values as the bf16 projections take them: f rounded to the nearest bf16 (ties to
// even; NaN stays NaN), as its bits, and as the float it stands for.
uint16_t bf16_bits(float f);
float round_to_bf16(float f);

// int8 weights as the int8 projections take them (Precision::int8): per output feature o,
// scale_o = max_i |W[o, i]| / L (1 for a row of zeros) and W[o, i] ≈ scale_o · values[o, i],
// values = round(W / scale_o) (to nearest even) in [-L, L], L = kInt8WeightLimit; sums[o] =
// Σ_i values[o, i]. L is 63, 7 bits, on every CPU: then a pair of u8 × int8 products fits 16
// bits (2·255·63 < 2^15), which AVX2's vpmaddubsw needs, so a CPU without VNNI sums the same
// products as one with it, 1.5-1.9x the fp32 layer's speed (ONNX Runtime's reduce_range likewise).
inline constexpr int kInt8WeightLimit = 63;
static_assert(2 * 255 * kInt8WeightLimit <= 32767, "a pair of u8 × int8 products must fit 16 bits");
struct Int8Weight {
    std::vector<int8_t> values;  // [H_out, H_in], as the weight
    std::vector<float> scales;   // [H_out]
    std::vector<int32_t> sums;   // [H_out]
};
// Throws attn::Error(name) for a value that is NaN or infinite.
Int8Weight quantize_int8(const ConstTensor &weight, const char *name = "weight");
// One row of activations as the int8 projections take it: with low = min(0, min x) and
// high = max(0, max x), step = (high − low) / 255 (1 when high == low), zero =
// round(−low · 255 / (high − low)) and values[i] = clamp(round(x[i] · 255 / (high − low)) + zero,
// 0, 255), all in f32, rounding to nearest even; x[i] ≈ step · (values[i] − zero). A row
// holding NaN or ±Inf has step NaN (its projection NaN, as in fp32).
struct QuantizedRow {
    float step = 1;
    int32_t zero = 0;
};
QuantizedRow quantize_row_u8(const float *x, int64_t size, uint8_t *values);

// The variants with a layer in `precision` (manifest.json: attention_layer_bf16,
// attention_layer_int8; in fp32 attention_layer, which an ISA built for reduced precisions
// only lacks), and whether one computes in it natively
// (its ISA has avx512bf16 for bf16, avx512vnni for int8) or only gives its results
// without the instructions.
std::vector<const VariantInfo *> precision_variants(Precision precision);
bool computes_natively(const VariantInfo &variant, Precision precision);
// A reduced precision's fused-layer functions (manifest.json), which
// attn::precision_variants() have: over a padded batch, and over packed sequences; and the
// CPU feature of the ISAs that compute it natively, and what the others do instead; and
// whether the attention core's products (QKᵀ, P·V) are in bf16 too (DESIGN.md, "Reduced
// precision"): manifest.json's core_precision of its layer, the one place that says so.
struct ReducedPrecision {
    Precision precision;
    const char *name, *layer, *packed_layer, *cpu_feature, *without_feature;
    bool bf16_core() const;
};
inline constexpr ReducedPrecision kReducedPrecisions[] = {
    {Precision::bf16, "bf16", "attention_layer_bf16", "attention_layer_packed_bf16", "avx512bf16",
     "store bf16 and compute in f32"},
    {Precision::int8, "int8", "attention_layer_int8", "attention_layer_packed_int8", "avx512vnni",
     "sum the int8 products without vpdpbusd"},
};
// Throws attn::Error("precision") for fp32 (or a value out of range).
const ReducedPrecision &reduced_precision(Precision precision);
// bf16's (precision_variants(Precision::bf16), computes_natively(variant, Precision::bf16)).
std::vector<const VariantInfo *> bf16_variants();
bool computes_bf16(const VariantInfo &variant);

// The variant to use on this machine, when `name` is empty: on a CPU measured here
// (generated/dispatch.json, written by tools/dispatch.py from interleaved comparisons) whose
// widest instruction set the measurement covered, the variant closest to the fastest on
// every problem; elsewhere, of the CPU variants it can run, the one of the widest ISA, then
// of the preferred schedule source (autotuned, then hand-written). Otherwise the named one
// (GPU and autoscheduled variants are chosen by name), which must exist and be runnable here.
const VariantInfo &select_variant(const std::string &name = "");
// The default's name and why it was picked: the measurement it follows, or the rule.
std::string default_variant_reason();
// The variant an Attention made without naming one runs an fp32 call with, max(S_q, S_k) =
// `seq`: where the measurement of this CPU (generated/dispatch.json) ranked that call's
// shape class (manifest.json: short, long), the first of that class's ranking that runs;
// otherwise select_variant().
const VariantInfo &default_variant_for(int64_t seq);
// The variant an Attention of `config` runs (its constructor says how): select_variant(name)
// in fp32; in bf16 or int8 the named one, which must have the precision (and its
// instructions, unless config.allow_storage_only), or with no name the widest that computes
// natively and has the layer in that precision or, given `stage` (a stage's fp32 function:
// "attention_core"), that stage's twin (an ISA built for the layers alone has no stages:
// manifest.json's avx512_sapphirerapids).
const VariantInfo &select_variant(const Config &config, const std::string &name = "", const std::string &stage = "");

// Host memory: Halide's large intermediates (1 MiB and more) are kept after a call for
// the next, up to 1 GiB, sparing the page faults of fresh memory on every call. Gives
// what is kept back to the system; returns how many bytes.
std::size_t release_scratch_memory();

// The most threads the kernels take (Halide's own limit, which the library keeps).
inline constexpr int kMaxThreads = 256;
// The CPU threads the kernels may use, for the whole process (the library's thread pool,
// which every CPU variant shares; its workers spin between a call's parallel loops and park
// 0.1 ms after the last call): 1 to kMaxThreads, or 0 for the default, one per CPU core (or
// $HL_NUM_THREADS). Returns the count it replaces (0: none yet). A call already running
// finishes with the threads it has.
int set_num_threads(int threads);
// The count in force (0 before set_num_threads and the first parallel kernel: the default).
int num_threads();

// Waits until the GPU work queued by the variant's calls has finished (a call given
// device memory returns before that); nothing to wait for on a CPU variant.
void synchronize(const VariantInfo &variant);

// One attention layer: validated weights bound to a variant.
namespace detail {
struct PreparedWeights;
struct ReducedWeights;
}  // namespace detail

class Attention {
public:
    // The weight matrices are prepared here, once: in fp32 each rearranged into the layout
    // the fused layer reads (panels of a vector of outputs for its register tiles on a CPU,
    // the transpose for its kernels on a GPU, which copies a device-memory one to the host
    // for it), and on a GPU every weight then copied to the
    // device (a device-memory vector is read in place). The object keeps that copy: later
    // changes to the caller's matrices are not seen. So do bf16 and int8
    // (config.precision), which round or quantize the four matrices here (host memory).
    // With a reduced precision and no variant named, the variant is the one of the
    // widest ISA this CPU runs that computes in it natively, or, if
    // config.allow_storage_only, one that gives its results without the instructions; a
    // variant without the precision, or one without its instructions when that is not
    // allowed, is refused (attn::Error naming config.precision or the variant, and what is
    // missing).
    Attention(Config config, LayerWeights weights, const std::string &variant = "");

    // y [B, S_q, H]. `probs`, if given, receives [B, heads, S_q, S_k].
    void forward(const AttentionInputs &inputs, MutableTensor y, MutableTensor probs = {}) const;

    // Packed sequences: y [T, H]. `probs`, if given (host memory), receives each sequence's
    // [heads, L_b, L_b], one after another: [sum of heads·L_b²].
    void forward_packed(const PackedInputs &inputs, MutableTensor y, MutableTensor probs = {}) const;

    // A padded batch (self-attention, right padding) computed without its padding: packs the
    // real tokens, runs forward_packed and writes y [B, S, H] with zeros at padded positions
    // (forward() computes those rows instead). A bias must be [1, heads or 1, S, S]. Host memory.
    void forward_unpadded(const AttentionInputs &inputs, MutableTensor y) const;

    // Waits for this layer's queued GPU work (see attn::synchronize).
    void synchronize() const;

    const Config &config() const { return config_; }
    // The variant named, or else the default (select_variant(config)). An fp32 Attention made
    // without naming a variant runs each call with variant_for() of its lengths: the
    // measured pick of their shape class where this CPU was measured (default_variant_for).
    const VariantInfo &variant() const { return *variant_; }
    const VariantInfo &variant_for(int64_t s_q, int64_t s_k) const;

private:
    Config config_;
    LayerWeights weights_;
    const VariantInfo *variant_;
    bool by_shape_class_ = false;  // fp32, no variant named: each call's shape class picks
    std::shared_ptr<detail::PreparedWeights> prepared_weights_;  // fp32: in panels (CPU) or transposed (GPU, on its device)
    std::shared_ptr<detail::ReducedWeights> reduced_weights_;    // bf16, int8: the matrices rounded or quantized
};

// The stages of the layer, each its own AOT pipeline; shapes as in DESIGN.md. In
// config.precision fp32, or bf16: the products' operands (activations, weights, Q, K, V, the
// probabilities; in attention_core its exponentials too) rounded to bf16, f32 sums, with
// vdpbf16ps on a variant whose ISA has avx512bf16 (attn::computes_natively), or, where
// config.allow_storage_only says so, widened to f32 on one without (the same results within the
// accuracy rule). The bf16 stages take f32 tensors, weights included, which they round as they
// read them (an Attention rounds its weights once instead). masked_softmax has no products: it
// is f32 in every precision. int8 is a precision of the whole layer only (attn::Attention).
// A variant without the stage in bf16 is refused (attn::Error("variant"), naming those with it).
namespace stages {
void qkv_projection(const VariantInfo &variant, const Config &config, ConstTensor x_q, ConstTensor x_kv,
                    const LayerWeights &weights, MutableTensor q, MutableTensor k, MutableTensor v);
void attention_scores(const VariantInfo &variant, const Config &config, ConstTensor q, ConstTensor k, ConstTensor bias,
                      MutableTensor scores);
void masked_softmax(const VariantInfo &variant, const Config &config, ConstTensor scores, MaskTensor key_padding_mask,
                    MutableTensor probs);
void weighted_sum(const VariantInfo &variant, const Config &config, ConstTensor probs, ConstTensor v,
                  MutableTensor ctx);
void output_layernorm(const VariantInfo &variant, const Config &config, ConstTensor ctx, ConstTensor x,
                      const LayerWeights &weights, MutableTensor y);

// The attention core alone: attention_scores, masked_softmax and weighted_sum fused into
// one pass over the keys (the fused layer's flash core: no [S_q, S_k] buffer, memory O(S)),
// what torch.nn.functional.scaled_dot_product_attention computes on the head views of q,
// k and v. q [B, S_q, H], k and v [B, S_k, H], heads interleaved as the projections write
// them; key_padding_mask [B, S_k] (empty: every key is real); bias as AttentionInputs::bias
// (empty: none); config.causal; ctx [B, S_q, H], which must not overlap the inputs.
void attention_core(const VariantInfo &variant, const Config &config, ConstTensor q, ConstTensor k, ConstTensor v,
                    MaskTensor key_padding_mask, ConstTensor bias, MutableTensor ctx);
}  // namespace stages

}  // namespace attn
