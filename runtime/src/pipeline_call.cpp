#include "pipeline_call.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "attn/generated/manifest.h"
#include "validation.h"

namespace attn::pipeline {

using validation::str;

std::atomic<std::size_t> uploads{0};

Halide::Runtime::Buffer<float> head_view(const MutableTensor &t, int64_t heads) {
    const int32_t batch = int32_t(t.shape[0]), seq = int32_t(t.shape[1]), hidden = int32_t(t.shape[2]);
    const int32_t head_dim = int32_t(hidden / heads);
    halide_dimension_t dims[4] = {
        {0, head_dim, 1}, {0, int32_t(heads), head_dim}, {0, seq, hidden}, {0, batch, seq * hidden}};
    return Halide::Runtime::Buffer<float>(t.data, 4, dims);
}

namespace {
// Halide reports pipeline and driver failures through its error handler; keep the
// message for the exception instead of printing it.
thread_local std::string last_halide_error;
extern "C" void capture_halide_error(void *, const char *message) { last_halide_error = message; }

template <typename T>
Halide::Runtime::Buffer<const T> broadcast_row(int32_t s_k, T value, std::initializer_list<int32_t> extents,
                                               const halide_device_interface_t *gpu, RowCache<T> *cache) {
    Halide::Runtime::Buffer<T> row;
    {
        std::unique_lock<std::mutex> lock;
        if (cache) lock = std::unique_lock<std::mutex>(cache->mutex), row = cache->row;
        if (!row.data() || row.dim(0).extent() < s_k) {
            row = Halide::Runtime::Buffer<T>(s_k);
            row.fill(value);
            if (gpu) {
                check_halide(row.copy_to_device(gpu), "halide", "copying an absent input's constant row to the device");
                ++uploads;
            }
            if (cache) cache->row = row;
        }
    }
    Halide::Runtime::Buffer<const T> view = row;  // shares the host and device allocations
    view.raw_buffer()->dim[0].extent = s_k;       // a longer cached row serves too
    for (int32_t extent : extents) {
        view.add_dimension_with_stride(0);
        view.raw_buffer()->dim[view.dimensions() - 1].extent = extent;
    }
    return view;
}
}  // namespace

void check_halide(int status, const std::string &argument, const std::string &what) {
    if (status != 0) {
        throw Error(argument, what + " failed with code " + std::to_string(status) + ": " + last_halide_error);
    }
}

void prepare_halide(const VariantInfo &variant) {
    static const bool handler_installed = (halide_set_error_handler(capture_halide_error), true);
    (void)handler_installed;
    detail::install_scratch_cache();
    if (variant.device != "cpu") {
        // Keep freed device buffers for the next call instead of returning them to the driver.
        static const bool reuse = (halide_reuse_device_allocations(nullptr, true), true);
        (void)reuse;
    }
    last_halide_error.clear();
}

namespace {
// Halide 21's CUDA runtime JIT-compiles a pipeline's PTX at its first call in a CUDA context,
// with the register cap HL_CUDA_JIT_MAX_REGISTERS holds then (64 when unset). The cap differs
// by schedule source, so each pipeline's first call sets it, one first call at a time, and
// clears it after: a later recompile (another context) gets Halide's 64, at which every kernel
// launches. A cap the caller exported is left alone.
int call_cuda(const detail::CompiledFunction &function, const detail::Arguments &arguments, const std::string &what,
              int cap) {
    static const bool callers_cap = std::getenv("HL_CUDA_JIT_MAX_REGISTERS") != nullptr;
    if (callers_cap) return detail::call(function, arguments, what);
    static std::mutex mutex;
    static std::set<int (*)(void **)> compiled;
    std::unique_lock<std::mutex> lock(mutex);
    if (compiled.count(function.argv)) {
        lock.unlock();
        return detail::call(function, arguments, what);
    }
    setenv("HL_CUDA_JIT_MAX_REGISTERS", std::to_string(cap).c_str(), 1);
    struct Clear {
        ~Clear() { unsetenv("HL_CUDA_JIT_MAX_REGISTERS"); }
    } clear;
    const int status = detail::call(function, arguments, what);
    if (status == 0) compiled.insert(function.argv);
    return status;
}
}  // namespace

ProblemExtents extents(int64_t batch, int64_t s_q, int64_t s_k, int64_t heads, int64_t hidden) {
    return {batch, s_q, s_k, heads, heads > 0 ? hidden / heads : 0, hidden};
}

MaskInput mask_input(const MaskTensor &mask, int64_t batch, int64_t s_k, const halide_device_interface_t *gpu,
                     RowCache<uint8_t> *ones) {
    MaskInput m;
    if (mask.empty()) {
        m.buffer = broadcast_row<uint8_t>(int32_t(s_k), 1, {int32_t(batch)}, gpu, ones);
        m.placed = true;
        return m;
    }
    validation::check_key_padding_mask(mask, batch, s_k);
    m.buffer = halide_view(mask);
    m.memory = mask.memory;
    return m;
}

BiasInput bias_input(const ConstTensor &bias, int64_t batch, int64_t heads, int64_t s_q, int64_t s_k,
                     const halide_device_interface_t *gpu, RowCache<float> *zeros) {
    const int32_t sk = int32_t(s_k), sq = int32_t(s_q), h = int32_t(heads), bt = int32_t(batch);
    BiasInput b;
    if (bias.empty()) {
        // Zeros past S_k too, by more than the longest chunk of keys a flash core computes
        // (16 lanes × 6 vectors), so that its last chunk reads them as a vector, unclamped
        // (attn_gen::flash_attention's bias_keys).
        constexpr int32_t kPastLastKey = 128;
        b.buffer = broadcast_row<float>(sk + kPastLastKey, 0.0f, {sq, h, bt}, gpu, zeros);
        b.placed = true;
        return b;
    }
    const char *layout = "[B or 1, heads or 1, S_q, S_k]";
    const Shape &shape = validation::check_rank("bias", bias, 4, layout);
    const bool ok = (shape[0] == batch || shape[0] == 1) && (shape[1] == heads || shape[1] == 1) && shape[2] == s_q &&
                    shape[3] == s_k;
    if (!ok) {
        throw Error("bias", std::string("expected shape ") + layout + " = [" + std::to_string(batch) + " or 1, " +
                                std::to_string(heads) + " or 1, " + std::to_string(s_q) + ", " + std::to_string(s_k) +
                                "], got " + str(shape));
    }
    validation::check_tensor("bias", bias, shape, layout);
    const int32_t head_stride = shape[1] == 1 ? 0 : sq * sk;
    const int32_t batch_stride = shape[0] == 1 ? 0 : int32_t(shape[1]) * sq * sk;
    halide_dimension_t dims[4] = {{0, sk, 1}, {0, sq, sk}, {0, h, head_stride}, {0, bt, batch_stride}};
    b.buffer = Halide::Runtime::Buffer<const float>(bias.data, 4, dims);
    b.memory = bias.memory;
    return b;
}

BiasInput packed_bias_input(const ConstTensor &bias, int64_t sequences, int64_t heads, int64_t s_max,
                            const halide_device_interface_t *gpu, RowCache<float> *zeros) {
    if (bias.empty()) return bias_input(bias, sequences, heads, s_max, s_max, gpu, zeros);
    const int32_t side = int32_t(bias.shape[1]);  // validated by forward_packed
    const halide_dimension_t dims[4] = {{0, side, 1},
                                        {0, side, side},
                                        {0, int32_t(heads), bias.shape[0] == 1 ? 0 : side * side},
                                        {0, int32_t(sequences), 0}};
    BiasInput b;
    b.buffer = Halide::Runtime::Buffer<const float>(bias.data, 4, dims);
    b.memory = bias.memory;
    return b;
}

WeightBuffers::WeightBuffers(const LayerWeights &w, bool projections, bool output) {
    for (const validation::WeightArgument &a : validation::kWeightArguments) {
        if (a.output ? !output : !projections) continue;
        const ConstTensor &t = w.*a.tensor;
        weights.push_back({a.name, halide_view(t), t.memory});
    }
}

void WeightBuffers::drop_matrices() {
    weights.erase(
        std::remove_if(weights.begin(), weights.end(), [](const Weight &w) { return w.buffer.dimensions() == 2; }),
        weights.end());
}

Call::Call(const std::string &function, const VariantInfo &variant, const ProblemExtents &extents)
    : what_(function + " (" + variant.name +
            (variant.runs_own_kernels(function, extents) ? "" : ", " + variant.fallback + "'s kernels") + ")"),
      variant_(variant),
      compiled_(detail::function_for(variant, function, extents)),
      gpu_(detail::device_interface(variant.device)) {
    prepare_halide(variant);
}

Call &Call::weights(WeightBuffers &w, bool uploaded) {
    for (WeightBuffers::Weight &weight : w.weights) {
        if (uploaded) {
            placed(weight.name, weight.buffer.raw_buffer());
        } else {
            input(weight.name, weight.buffer, weight.memory);
        }
    }
    return *this;
}

Call &Call::weights(WeightBuffers &w, detail::ReducedWeights &reduced) {
    w.drop_matrices();
    weights(w, false);
    for (detail::ReducedWeights::Matrix &m : reduced.matrices) input(m.name, m.buffer, Memory::host);
    if (reduced.weight_scales.data()) input("weight_scales", reduced.weight_scales, Memory::host);
    return *this;
}

void check_cuda_variant(const char *name, const VariantInfo &variant) {
    if (variant.device != "cuda") {
        throw Error(name, "is CUDA device memory, but variant '" + variant.name + "' runs on " +
                              (variant.device != "cpu" ? variant.device : std::string("the CPU")) +
                              "; pass host memory or choose a CUDA variant");
    }
}

void Call::run() {
    // The cap of the kernels that run (a fallback's are the hand-written schedule's).
    const int cap = compiled_.gpu_max_registers ? compiled_.gpu_max_registers : manifest::kGpuMaxRegisters;
    std::optional<detail::KernelCall> on_cpu;
    if (variant_.device == "cpu") on_cpu.emplace();
    check_halide(variant_.device == "cuda" ? call_cuda(compiled_, arguments_, what_, cap)
                                           : detail::call(compiled_, arguments_, what_),
                 "halide", what_);
    for (auto &[name, buffer] : host_outputs_) {
        check_halide(halide_copy_to_host(nullptr, buffer), name, "copying the result to the host");
    }
}

}  // namespace attn::pipeline

namespace attn::detail {
namespace {
// The floats of a vector of the variant's ISA (manifest.json's, tools/manifest.py: f32_lanes).
int f32_lanes(const VariantInfo &variant) {
    for (const manifest::Isa &isa : manifest::kIsas)
        if (variant.isa == isa.name && isa.f32_lanes > 0) return isa.f32_lanes;
    throw Error("variant", "'" + variant.name + "' has no CPU ISA of manifest.json to prepare its weights for");
}

// Where W[o, i] lies in a CPU layer's prepared weight (attn_gen::WeightLayout::panels, and
// ::grouped for the reduced precisions' groups of `group` input features): panels of `lanes`
// outputs, each panel's groups one after another, group·lanes elements each, so that a
// register tile reads, for each group, one vector of each of its panels (a few sequential
// streams, not rows of the transpose 3 KiB apart). A panel holds group·lanes·in_groups
// elements; past the last output (and input) they are zero.
std::size_t panel_offset(int64_t o, int64_t i, int64_t group, int64_t lanes, int64_t in_groups) {
    return std::size_t((o / lanes) * group * lanes * in_groups + (i / group) * group * lanes + group * (o % lanes) +
                       i % group);
}

// W (in, out) = [H_out, H_in] in fp32's panels: (o % lanes + lanes·i, o / lanes) = W[o, i].
Halide::Runtime::Buffer<const float> in_panels(const Halide::Runtime::Buffer<const float> &w, int lanes) {
    const int h_in = w.dim(0).extent(), h_out = w.dim(1).extent();
    Halide::Runtime::Buffer<float> panels(lanes * h_in, (h_out + lanes - 1) / lanes);
    panels.fill(0.0f);
    for (int o = 0; o < h_out; ++o)
        for (int i = 0; i < h_in; ++i)
            panels.data()[panel_offset(o, i, 1, lanes, h_in)] = w(w.dim(0).min() + i, w.dim(1).min() + o);
    return panels;
}
}  // namespace

PreparedWeights::PreparedWeights(const LayerWeights &w, const VariantInfo &variant,
                                 const std::vector<const VariantInfo *> &class_picks)
    : weights(w, true, true), uploaded(variant.device != "cpu"), lanes(uploaded ? 0 : f32_lanes(variant)) {
    pipeline::prepare_halide(variant);
    const halide_device_interface_t *gpu = device_interface(variant.device);
    for (pipeline::WeightBuffers::Weight &weight : weights.weights) {
        Halide::Runtime::Buffer<const float> &given = weight.buffer;
        // (A CPU variant refuses device memory here, naming the weight.)
        if (weight.memory == Memory::device) pipeline::wrap_device_memory(weight.name, given, variant);
        if (given.dimensions() == 2) {
            // [H_out, H_in] prepared as its transpose, [H_in, H_out], the layout the fused
            // layer reads (attn_gen::WeightLayout: generators/layer_generator.cpp), once, on
            // the host: device memory is brought there for it.
            Halide::Runtime::Buffer<const float> source = given;
            if (weight.memory == Memory::device) {
                Halide::Runtime::Buffer<float> host(given.dim(0).extent(), given.dim(1).extent());
                pipeline::check_halide(halide_buffer_copy(nullptr, given.raw_buffer(), nullptr, host.raw_buffer()),
                                       weight.name, "copying the weight to the host to prepare it");
                source = host;
            }
            const int h_out = given.dim(1).extent(), h_in = given.dim(0).extent();
            if (gpu) {
                Halide::Runtime::Buffer<float> prepared(h_out, h_in);
                prepared.copy_from(source.transposed(0, 1));
                given = prepared;
            } else {
                given = in_panels(source, lanes);
            }
            weight.memory = Memory::host;
        } else if (weight.memory == Memory::device) {
            continue;  // a vector in device memory is read in place
        }
        if (!gpu) continue;
        given.set_host_dirty();  // copy_to_device copies only a buffer marked so
        pipeline::check_halide(given.copy_to_device(gpu), weight.name, "copying the weight to the device");
        ++pipeline::uploads;
    }
    if (gpu) return;  // (class picks are CPU variants: an Attention of a GPU variant names it)
    for (const VariantInfo *pick : class_picks) {
        const int width = f32_lanes(*pick);
        if (width == lanes || std::any_of(other_widths.begin(), other_widths.end(),
                                          [&](const auto &other) { return other.first == width; }))
            continue;
        pipeline::WeightBuffers &panels = other_widths.emplace_back(width, pipeline::WeightBuffers(w, true, true)).second;
        for (pipeline::WeightBuffers::Weight &weight : panels.weights)
            if (weight.buffer.dimensions() == 2) weight.buffer = in_panels(weight.buffer, width);
    }
}

pipeline::WeightBuffers &PreparedWeights::weights_for(const VariantInfo &variant) {
    const int width = variant.device == "cpu" ? f32_lanes(variant) : 0;
    if (width == lanes) return weights;
    for (auto &[other, buffers] : other_widths)
        if (other == width) return buffers;
    throw Error("variant", "'" + variant.name + "' reads its weights in panels of " + std::to_string(width) +
                               " floats, which this Attention did not prepare (an internal error)");
}
}  // namespace attn::detail

namespace attn::detail {

ReducedWeights::ReducedWeights(const LayerWeights &w, const VariantInfo &variant, Precision precision) {
    const bool int8 = precision == Precision::int8;
    matrices.reserve(4);
    int64_t hidden = 0;
    for (const validation::WeightArgument &a : validation::kWeightArguments) {
        const ConstTensor &t = w.*a.tensor;
        if (t.shape.size() != 2) continue;
        // refused: bf16 and int8 are a CPU's
        if (t.memory == Memory::device) pipeline::check_cuda_variant(a.name, variant);
        Matrix &m = matrices.emplace_back();
        m.name = a.name;
        const int64_t out = t.shape[0], in = t.shape[1];
        hidden = out;
        // In the groups of input features the products read, in fp32's panels of V outputs, V
        // the variant's floats a vector (attn_gen::WeightLayout::grouped, panel_offset), as
        // rows of group·V elements, a panel's groups rounded up to 16 rows (an AMX tile's; zeros
        // past the features): element (group·(o % V) + lane, i_group + rows·(o / V)) =
        // W[o, group·i_group + lane] (attn_gen::grouped_rows).
        const int64_t group = int8 ? 4 : 2, lanes = f32_lanes(variant);
        const int64_t in_groups = (in + 16 * group - 1) / (16 * group) * 16;                  // a panel's rows
        const int64_t panels = (out + lanes - 1) / lanes, panel = group * lanes * in_groups;  // a panel's elements
        const std::size_t size = int8 ? 1 : 2;
        m.bytes.assign(std::size_t(panel * panels) * size, 0);
        auto at = [&](int64_t o, int64_t i) { return panel_offset(o, i, group, lanes, in_groups); };
        if (int8) {
            const Int8Weight q = quantize_int8(t, a.name);
            for (int64_t o = 0; o < out; ++o)
                for (int64_t i = 0; i < in; ++i) m.bytes[at(o, i)] = uint8_t(q.values[std::size_t(o * in + i)]);
            // weight_scales (out, quantity, projection): this matrix's is projection matrices.size() - 1.
            scales.resize(std::size_t(out) * 2 * matrices.size());
            float *own = scales.data() + std::size_t(out) * 2 * (matrices.size() - 1);
            for (int64_t o = 0; o < out; ++o)
                own[o] = q.scales[std::size_t(o)], own[out + o] = float(q.sums[std::size_t(o)]);
        } else {
            auto *bits = reinterpret_cast<uint16_t *>(m.bytes.data());
            for (int64_t o = 0; o < out; ++o)
                for (int64_t i = 0; i < in; ++i) bits[at(o, i)] = bf16_bits(t.data[o * in + i]);
        }
        const int32_t row = int32_t(group * lanes);
        halide_dimension_t dims[2] = {{0, row, 1}, {0, int32_t(in_groups * panels), row}};
        const halide_type_t type = int8 ? halide_type_t(halide_type_int, 8) : halide_type_t(halide_type_bfloat, 16);
        m.buffer = Halide::Runtime::Buffer<void>(type, m.bytes.data(), 2, dims);
    }
    if (int8)
        weight_scales = Halide::Runtime::Buffer<float>(scales.data(), int32_t(hidden), 2, int32_t(matrices.size()));
}

}  // namespace attn::detail
