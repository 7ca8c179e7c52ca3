// One call of a variant's AOT function: the caller's memory viewed as Halide buffers (no
// copies on a CPU), each argument bound once by its name (manifest.json's), buffers placed
// for the variant's device, and any failure turned into attn::Error.
#pragma once

#include "attn/attention.h"
#include "attn/internal.h"

#include <HalideBuffer.h>

#include <atomic>
#include <initializer_list>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace attn::detail {
struct ReducedWeights;
}

namespace attn::pipeline {

// Dense row-major view, dims reversed into Halide's innermost-first order.
template <typename T>
Halide::Runtime::Buffer<T> halide_view(const TensorView<T> &t) {
    std::vector<halide_dimension_t> dims(t.shape.size());
    int32_t stride = 1;
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
        const int32_t extent = int32_t(t.shape[t.shape.size() - 1 - i]);
        dims[i] = halide_dimension_t(0, extent, stride);
        stride *= extent;
    }
    return Halide::Runtime::Buffer<T>(t.data, int(dims.size()), dims.data());
}

// Head view (head_dim, head, seq, batch) of a [B, S, H] tensor.
Halide::Runtime::Buffer<float> head_view(const MutableTensor &t, int64_t heads);

// Throws attn::Error(argument) with Halide's message when `status` is a failure.
void check_halide(int status, const std::string &argument, const std::string &what);
// Before any Halide call: the error handler, the scratch cache, device allocation reuse.
void prepare_halide(const VariantInfo &variant);
// Counts host-to-device copies (detail::host_to_device_copies).
extern std::atomic<std::size_t> uploads;

// The extents of a call with `heads` heads over `hidden` features.
ProblemExtents extents(int64_t batch, int64_t s_q, int64_t s_k, int64_t heads, int64_t hidden);

// An absent mask (ones) or bias (zeros): one row of S_k values broadcast over the other
// dimensions by stride 0. For a GPU variant (`gpu` not null) the row goes to the device
// as one copy and the view shares that allocation: Halide 21 copies a host buffer one
// contiguous run at a time, so a broadcast view marked for upload would cost
// B·heads·S_q copies of the same row per call. `cache`, when given, keeps the row on
// the device for the next call (an Attention's PreparedWeights on a GPU).
template <typename T>
struct RowCache {
    std::mutex mutex;
    Halide::Runtime::Buffer<T> row;
};

// An input that may be absent (the mask, the bias): the caller's view, or constants
// already where the variant reads them.
template <typename T>
struct OptionalInput {
    Halide::Runtime::Buffer<const T> buffer;
    Memory memory = Memory::host;
    bool placed = false;  // an absent input's constants, already on the variant's device
};
using MaskInput = OptionalInput<uint8_t>;
using BiasInput = OptionalInput<float>;

// The key padding mask as (key, batch); all ones when absent (batch stride 0).
MaskInput mask_input(const MaskTensor &mask, int64_t batch, int64_t s_k, const halide_device_interface_t *gpu,
                     RowCache<uint8_t> *ones = nullptr);
// The additive bias [B or 1, heads or 1, S_q, S_k] as (key, query, head, batch), broadcast
// over batch or heads by stride 0; zeros when absent.
BiasInput bias_input(const ConstTensor &bias, int64_t batch, int64_t heads, int64_t s_q, int64_t s_k,
                     const halide_device_interface_t *gpu, RowCache<float> *zeros = nullptr);
// One bias [heads or 1, S, S] (S >= s_max) for every packed sequence: (key, query, head,
// sequence) with sequence stride 0; zeros when absent.
BiasInput packed_bias_input(const ConstTensor &bias, int64_t sequences, int64_t heads, int64_t s_max,
                            const halide_device_interface_t *gpu, RowCache<float> *zeros = nullptr);

// The layer's weights as Halide buffers, by argument name (validation::kWeightArguments):
// the projections' and/or the output's.
struct WeightBuffers {
    struct Weight {
        const char *name;
        Halide::Runtime::Buffer<const float> buffer;
        Memory memory;
    };
    std::vector<Weight> weights;
    WeightBuffers(const LayerWeights &w, bool projections, bool output);
    // Leaves out the matrices (a bf16 or int8 call binds its own: detail::ReducedWeights).
    void drop_matrices();
};

// CUDA device memory (a view's data is a CUdeviceptr) wrapped in place for a CUDA
// variant: the Buffer then detaches from it, never frees it. Any other variant refuses it.
void check_cuda_variant(const char *name, const VariantInfo &variant);
template <typename T>
void wrap_device_memory(const char *name, Halide::Runtime::Buffer<T> &buffer, const VariantInfo &variant) {
    check_cuda_variant(name, variant);
    const auto pointer = uint64_t(reinterpret_cast<uintptr_t>(buffer.data()));
    buffer.raw_buffer()->host = nullptr;
    check_halide(buffer.device_wrap_native(detail::device_interface(variant.device), pointer), name,
                 "wrapping the device pointer");
}

class Call {
public:
    // The variant's `function` for a call of these extents (its fallback's below its
    // min_shapes: the same device, so the buffers are placed alike); refused here
    // (attn::Error("variant")) when the variant cannot run here or does not provide it.
    Call(const std::string &function, const VariantInfo &variant, const ProblemExtents &extents);

    // Inputs: on a GPU, host memory is marked for upload and CUDA device memory wrapped in place.
    template <typename T>
    Call &input(const char *name, Halide::Runtime::Buffer<T> &buffer, Memory memory) {
        place(name, buffer, memory);
        if (gpu_ && memory == Memory::host) buffer.set_host_dirty(), ++uploads;
        return bind(name, buffer.raw_buffer());
    }
    template <typename T>
    Call &input(const char *name, OptionalInput<T> &in) {
        return in.placed ? bind(name, in.buffer.raw_buffer()) : input(name, in.buffer, in.memory);
    }
    // A buffer already where the variant reads it (a GPU variant's uploaded weights).
    Call &placed(const char *name, halide_buffer_t *buffer) { return bind(name, buffer); }
    // The weights; `uploaded` ones (an Attention's on a GPU) are passed as they are. A bf16
    // or int8 layer's matrices (and int8's weight_scales) are its ReducedWeights', the rest
    // the caller's.
    Call &weights(WeightBuffers &w, bool uploaded);
    Call &weights(WeightBuffers &w, detail::ReducedWeights &reduced);
    // Outputs in host memory are copied back when a GPU variant's call returns.
    template <typename T>
    Call &output(const char *name, Halide::Runtime::Buffer<T> &buffer, Memory memory) {
        place(name, buffer, memory);
        if (gpu_ && memory == Memory::host) host_outputs_.push_back({name, buffer.raw_buffer()});
        return bind(name, buffer.raw_buffer());
    }
    Call &scalar(const char *name, bool value) { return arguments_.scalar(name, value), *this; }
    Call &scalar(const char *name, int32_t value) { return arguments_.scalar(name, value), *this; }
    Call &scalar(const char *name, float value) { return arguments_.scalar(name, value), *this; }

    // Runs it; results in host memory are complete on return.
    void run();

private:
    Call &bind(const char *name, halide_buffer_t *buffer) { return arguments_.buffer(name, buffer), *this; }
    template <typename T>
    void place(const char *name, Halide::Runtime::Buffer<T> &buffer, Memory memory) {
        if (memory == Memory::device) wrap_device_memory(name, buffer, variant_);
    }

    std::string what_;  // "<function> (<variant>[, <fallback>'s kernels])", for errors
    const VariantInfo &variant_;
    const detail::CompiledFunction &compiled_;
    const halide_device_interface_t *gpu_;
    detail::Arguments arguments_;
    std::vector<std::pair<const char *, halide_buffer_t *>> host_outputs_;
};

}  // namespace attn::pipeline

namespace attn::detail {
// An fp32 layer's weights, prepared by the Attention constructor in the layout the fused
// layer reads (generators/layer_generator.cpp, layer_weights), once, on the host: for a CPU
// variant in panels of a vector of outputs (attn_gen::WeightLayout::panels), for a GPU
// variant each matrix transposed, [H_in, H_out]. A GPU variant's are then uploaded once, from host or
// device memory, and a vector uploaded once (host memory) or wrapped in place (device
// memory); its calls pass them as they are. A CPU variant's vectors are the caller's.
struct PreparedWeights {
    pipeline::WeightBuffers weights;
    bool uploaded;                     // on the variant's GPU
    int lanes;                         // a CPU variant's: the panels' width (its ISA's floats a vector)
    pipeline::RowCache<uint8_t> ones;  // a GPU's absent mask, for the next call
    pipeline::RowCache<float> zeros;   // a GPU's absent bias
    // An Attention made without a variant runs each shape class with its pick
    // (Attention::variant_for), which may be of another vector width: its panels too, once.
    std::vector<std::pair<int, pipeline::WeightBuffers>> other_widths;
    PreparedWeights(const LayerWeights &w, const VariantInfo &variant,
                    const std::vector<const VariantInfo *> &class_picks = {});
    // The weights `variant` (the Attention's, or one of its class picks) reads.
    pipeline::WeightBuffers &weights_for(const VariantInfo &variant);
};

// A bf16 or int8 Attention's four matrices (Precision::bf16, int8), rounded to bf16
// (attn::bf16_bits) or quantized to int8 (attn::quantize_int8) once, from host memory, and
// held here in the layout the reduced-precision layer reads, its groups of input features
// in panels of a vector of outputs (generators/layer_generator.cpp: layer_weights;
// attn_gen::WeightLayout::grouped), as Halide bfloat16 or int8 buffers;
// int8 adds weight_scales, [4, 2, H]: each matrix's (q, k, v, o) scales and sums.
struct ReducedWeights {
    struct Matrix {
        const char *name;
        std::vector<uint8_t> bytes;
        Halide::Runtime::Buffer<void> buffer;  // over bytes
    };
    std::vector<Matrix> matrices;
    std::vector<float> scales;                     // int8: weight_scales' data
    Halide::Runtime::Buffer<float> weight_scales;  // int8: over scales
    ReducedWeights(const LayerWeights &w, const VariantInfo &variant, Precision precision);
    ReducedWeights(const ReducedWeights &) = delete;
    ReducedWeights &operator=(const ReducedWeights &) = delete;
};
}  // namespace attn::detail
