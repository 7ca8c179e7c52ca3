// The thin runtime: validate, view caller memory as Halide buffers (no copies),
// call the AOT function, turn any failure into attn::Error.
#include "attn/attention.h"
#include "attn/internal.h"

#include <HalideBuffer.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>

namespace attn {

namespace {

std::string str(const Shape &shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

int64_t element_count(const Shape &shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

// Null data, rank and positive extents; returns the shape for deducing sizes.
template <typename T>
const Shape &check_rank(const char *name, const TensorView<T> &t, std::size_t rank, const char *layout) {
    if (t.data == nullptr) throw Error(name, std::string("data is null (expected a ") + layout + " tensor)");
    if (t.shape.size() != rank) {
        throw Error(name, "expected rank " + std::to_string(rank) + " " + layout + ", got shape " + str(t.shape));
    }
    for (int64_t d : t.shape) {
        if (d <= 0)
            throw Error(name, std::string("expected positive extents ") + layout + ", got shape " + str(t.shape));
    }
    return t.shape;
}

template <typename T>
void check_tensor(const char *name, const TensorView<T> &t, const Shape &expected, const char *layout) {
    if (t.data == nullptr) throw Error(name, "data is null (expected shape " + str(expected) + " " + layout + ")");
    if (t.shape != expected) {
        throw Error(name, "expected shape " + str(expected) + " " + layout + ", got " + str(t.shape));
    }
    const int64_t needed = element_count(expected);
    if (t.size < std::size_t(needed)) {
        throw Error(name, "shape " + str(expected) + " needs " + std::to_string(needed) +
                              " elements, but the buffer holds " + std::to_string(t.size));
    }
    // Halide indexes with 32-bit integers.
    if (needed > std::numeric_limits<int32_t>::max()) {
        throw Error(name, "shape " + str(expected) + " has " + std::to_string(needed) +
                              " elements, more than the 2^31 - 1 a Halide buffer can index");
    }
}

template <typename T, typename U>
bool overlaps(const TensorView<T> &a, const TensorView<U> &b) {
    if (a.empty() || b.empty() || !a.data || !b.data) return false;
    auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
    auto a1 = a0 + element_count(a.shape) * sizeof(T), b1 = b0 + element_count(b.shape) * sizeof(U);
    return a0 < b1 && b0 < a1;
}

void check_config(const Config &c) {
    if (c.hidden_size <= 0) throw Error("hidden_size", "expected > 0, got " + std::to_string(c.hidden_size));
    if (c.num_heads <= 0) throw Error("num_heads", "expected > 0, got " + std::to_string(c.num_heads));
    if (c.hidden_size % c.num_heads != 0) {
        throw Error("num_heads", "expected a divisor of hidden_size " + std::to_string(c.hidden_size) + ", got " +
                                     std::to_string(c.num_heads));
    }
    if (!std::isfinite(c.layer_norm_eps) || c.layer_norm_eps < 0) {
        throw Error("layer_norm_eps", "expected a finite value >= 0, got " + std::to_string(c.layer_norm_eps));
    }
}

void check_weights(const Config &c, const LayerWeights &w, bool projections_in, bool output_in) {
    const Shape square{c.hidden_size, c.hidden_size}, vec{c.hidden_size};
    if (projections_in) {
        check_tensor("w_q", w.w_q, square, "[H_out, H_in]");
        check_tensor("w_k", w.w_k, square, "[H_out, H_in]");
        check_tensor("w_v", w.w_v, square, "[H_out, H_in]");
        check_tensor("b_q", w.b_q, vec, "[H]");
        check_tensor("b_k", w.b_k, vec, "[H]");
        check_tensor("b_v", w.b_v, vec, "[H]");
    }
    if (output_in) {
        check_tensor("w_o", w.w_o, square, "[H_out, H_in]");
        check_tensor("b_o", w.b_o, vec, "[H]");
        check_tensor("gamma", w.gamma, vec, "[H]");
        check_tensor("beta", w.beta, vec, "[H]");
    }
}

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
Halide::Runtime::Buffer<float> head_view(const MutableTensor &t, int64_t heads) {
    const int32_t batch = int32_t(t.shape[0]), seq = int32_t(t.shape[1]), hidden = int32_t(t.shape[2]);
    const int32_t head_dim = int32_t(hidden / heads);
    halide_dimension_t dims[4] = {
        {0, head_dim, 1}, {0, int32_t(heads), head_dim}, {0, seq, hidden}, {0, batch, seq * hidden}};
    return Halide::Runtime::Buffer<float>(t.data, 4, dims);
}

void check_halide(int status, const std::string &argument, const std::string &what);
void prepare_halide(const VariantInfo &variant);

// The host-to-device copies this process has asked Halide for (detail::host_to_device_copies).
std::atomic<std::size_t> uploads{0};

// An absent mask (ones) or bias (zeros): one row of S_k values broadcast over the other
// dimensions by stride 0. For a GPU variant (`gpu` not null) the row goes to the device
// as one copy and the view shares that allocation: Halide 21 copies a host buffer one
// contiguous run at a time, so a broadcast view marked for upload would cost
// B·heads·S_q copies of the same row per call. `cache`, when given, keeps the row on
// the device for the next call (an Attention's DeviceWeights).
template <typename T>
struct RowCache {
    std::mutex mutex;
    Halide::Runtime::Buffer<T> row;
};
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

// The key padding mask as (key, batch); all ones when absent (batch stride 0).
struct MaskArgument {
    Halide::Runtime::Buffer<const uint8_t> buffer;
    Memory memory = Memory::host;
    bool placed = false;  // already where the variant reads it (an absent mask's ones)
};
void make_mask(MaskArgument &m, const MaskTensor &mask, int64_t batch, int64_t s_k,
               const halide_device_interface_t *gpu, RowCache<uint8_t> *ones = nullptr) {
    if (mask.empty()) {
        m.buffer = broadcast_row<uint8_t>(int32_t(s_k), 1, {int32_t(batch)}, gpu, ones);
        m.placed = true;
        return;
    }
    check_tensor("key_padding_mask", mask, {batch, s_k}, "[B, S_k]");
    m.buffer = halide_view(mask);
    m.memory = mask.memory;
}

// The additive bias as (key, query, head, batch), broadcast over batch or heads by
// stride 0; zeros when absent.
struct BiasArgument {
    Halide::Runtime::Buffer<const float> buffer;
    Memory memory = Memory::host;
    bool placed = false;  // already where the variant reads it (an absent bias's zeros)
};
void make_bias(BiasArgument &b, const ConstTensor &bias, int64_t batch, int64_t heads, int64_t s_q, int64_t s_k,
               const halide_device_interface_t *gpu, RowCache<float> *zeros = nullptr) {
    const int32_t sk = int32_t(s_k), sq = int32_t(s_q), h = int32_t(heads), bt = int32_t(batch);
    if (bias.empty()) {
        b.buffer = broadcast_row<float>(sk, 0.0f, {sq, h, bt}, gpu, zeros);
        b.placed = true;
        return;
    }
    const char *layout = "[B or 1, heads or 1, S_q, S_k]";
    const Shape &shape = check_rank("bias", bias, 4, layout);
    const bool ok = (shape[0] == batch || shape[0] == 1) && (shape[1] == heads || shape[1] == 1) && shape[2] == s_q &&
                    shape[3] == s_k;
    if (!ok) {
        throw Error("bias", std::string("expected shape ") + layout + " = [" + std::to_string(batch) + " or 1, " +
                                std::to_string(heads) + " or 1, " + std::to_string(s_q) + ", " + std::to_string(s_k) +
                                "], got " + str(shape));
    }
    check_tensor("bias", bias, shape, layout);
    const int32_t head_stride = shape[1] == 1 ? 0 : sq * sk;
    const int32_t batch_stride = shape[0] == 1 ? 0 : int32_t(shape[1]) * sq * sk;
    halide_dimension_t dims[4] = {{0, sk, 1}, {0, sq, sk}, {0, h, head_stride}, {0, bt, batch_stride}};
    b.buffer = Halide::Runtime::Buffer<const float>(bias.data, 4, dims);
    b.memory = bias.memory;
}

// Halide reports pipeline and driver failures through its error handler; keep the
// message for the exception instead of printing it.
thread_local std::string last_halide_error;
extern "C" void capture_halide_error(void *, const char *message) { last_halide_error = message; }

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

// The buffers of one pipeline call, placed for the variant's device (see attention.h):
// on a GPU, host inputs are marked for upload and CUDA device memory is wrapped in
// place; host outputs are copied back after the call.
class CallBuffers {
public:
    explicit CallBuffers(const VariantInfo &variant)
        : variant_(variant), gpu_(detail::device_interface(variant.device)) {}

    template <typename T>
    halide_buffer_t *input(const char *name, Halide::Runtime::Buffer<T> &buffer, Memory memory) {
        place(name, buffer, memory);
        if (gpu_ && memory == Memory::host) buffer.set_host_dirty(), ++uploads;
        return buffer.raw_buffer();
    }
    template <typename T>
    halide_buffer_t *output(const char *name, Halide::Runtime::Buffer<T> &buffer, Memory memory) {
        place(name, buffer, memory);
        if (gpu_ && memory == Memory::host) host_outputs_.push_back({name, buffer.raw_buffer()});
        return buffer.raw_buffer();
    }
    // After the pipeline: results in host memory are complete on return.
    void copy_outputs_to_host() {
        for (auto &[name, buffer] : host_outputs_) {
            check_halide(halide_copy_to_host(nullptr, buffer), name, "copying the result to the host");
        }
    }

private:
    template <typename T>
    void place(const char *name, Halide::Runtime::Buffer<T> &buffer, Memory memory) {
        if (memory == Memory::host) return;
        if (variant_.device != "cuda") {
            throw Error(name, "is CUDA device memory, but variant '" + variant_.name + "' runs on " +
                                  (gpu_ ? variant_.device : std::string("the CPU")) +
                                  "; pass host memory or choose a CUDA variant");
        }
        const auto pointer = uint64_t(reinterpret_cast<uintptr_t>(buffer.data()));
        buffer.raw_buffer()->host = nullptr;
        check_halide(buffer.device_wrap_native(gpu_, pointer), name, "wrapping the device pointer");
    }

    const VariantInfo &variant_;
    const halide_device_interface_t *gpu_;
    std::vector<std::pair<const char *, halide_buffer_t *>> host_outputs_;
};

// Runs the variant's `function` on a call of these extents (its fallback's below its
// min_shapes: the same device, so the buffers are placed alike): `bind` names its
// arguments (placing buffers with the CallBuffers); a failure becomes attn::Error.
template <typename Bind>
void run_pipeline(const std::string &function, const VariantInfo &variant, const ProblemExtents &call, Bind bind) {
    const detail::CompiledFunction &compiled = detail::function_for(variant, function, call);
    prepare_halide(variant);
    CallBuffers buffers(variant);
    detail::Arguments arguments;
    bind(buffers, arguments);
    const std::string what = function + " (" + variant.name +
                             (variant.runs_own_kernels(function, call) ? "" : ", " + variant.fallback + "'s kernels") +
                             ")";
    check_halide(detail::call(compiled, arguments, what), "halide", what);
    buffers.copy_outputs_to_host();
}

// The extents of a call with `heads` heads over `hidden` features.
ProblemExtents extents(int64_t batch, int64_t s_q, int64_t s_k, int64_t heads, int64_t hidden) {
    return {batch, s_q, s_k, heads, heads > 0 ? hidden / heads : 0, hidden};
}

// A mask or bias argument: an absent one's constants are already placed (broadcast_row).
template <typename Argument>
halide_buffer_t *placed_or_input(CallBuffers &c, const char *name, Argument &a) {
    return a.placed ? a.buffer.raw_buffer() : c.input(name, a.buffer, a.memory);
}

// The weights as Halide buffers.
struct WeightViews {
    Halide::Runtime::Buffer<const float> w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, gamma, beta;
    explicit WeightViews(const LayerWeights &w)
        : w_q(halide_view(w.w_q)),
          w_k(halide_view(w.w_k)),
          w_v(halide_view(w.w_v)),
          w_o(halide_view(w.w_o)),
          b_q(halide_view(w.b_q)),
          b_k(halide_view(w.b_k)),
          b_v(halide_view(w.b_v)),
          b_o(halide_view(w.b_o)),
          gamma(halide_view(w.gamma)),
          beta(halide_view(w.beta)) {}
};

// Binds the layer's weights to a call; `uploaded`: a GPU variant's, placed by the
// Attention constructor, are passed as they are.
void bind_weights(CallBuffers &c, detail::Arguments &a, WeightViews &w, const LayerWeights &t, bool uploaded) {
    auto weight = [&](const char *name, Halide::Runtime::Buffer<const float> &b, const ConstTensor &view) {
        a.buffer(name, uploaded ? b.raw_buffer() : c.input(name, b, view.memory));
    };
    weight("w_q", w.w_q, t.w_q), weight("w_k", w.w_k, t.w_k), weight("w_v", w.w_v, t.w_v);
    weight("w_o", w.w_o, t.w_o), weight("b_q", w.b_q, t.b_q), weight("b_k", w.b_k, t.b_k);
    weight("b_v", w.b_v, t.b_v), weight("b_o", w.b_o, t.b_o);
    weight("gamma", w.gamma, t.gamma), weight("beta", w.beta, t.beta);
}

template <typename T>
void check_host(const char *name, const TensorView<T> &t, const std::string &why) {
    if (!t.empty() && t.memory != Memory::host) throw Error(name, "expected host memory (" + why + "), got device memory");
}

// Packed sequences' offsets against T = `tokens` token rows (any T where `tokens` < 0):
// each sequence's length, or the error naming sequence_offsets (o_0 = 0, no decrease, o_B = T).
std::vector<int64_t> sequence_lengths(const OffsetTensor &offsets, int64_t tokens, const char *tokens_from) {
    const char *name = "sequence_offsets";
    if (offsets.data == nullptr) throw Error(name, "data is null (expected [B + 1] int32 offsets)");
    if (offsets.shape.size() != 1 || offsets.shape[0] < 1) {
        throw Error(name, "expected shape [B + 1] with B >= 0, got " + str(offsets.shape));
    }
    check_host(name, offsets, "the offsets are validated on the host");
    const int64_t count = offsets.shape[0];
    if (offsets.size < std::size_t(count)) {
        throw Error(name, "shape " + str(offsets.shape) + " needs " + std::to_string(count) +
                              " elements, but the buffer holds " + std::to_string(offsets.size));
    }
    if (offsets.data[0] != 0) throw Error(name, "expected o_0 = 0, got " + std::to_string(offsets.data[0]));
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b + 1 < count; ++b) {
        const int32_t from = offsets.data[b], to = offsets.data[b + 1];
        if (to < from) {
            throw Error(name, "expected non-decreasing offsets, got o_" + std::to_string(b + 1) + " = " +
                                  std::to_string(to) + " < o_" + std::to_string(b) + " = " + std::to_string(from));
        }
        lengths.push_back(to - from);
    }
    if (tokens >= 0 && offsets.data[count - 1] != tokens) {
        throw Error(name, "expected the last offset o_" + std::to_string(count - 1) + " = T = " +
                              std::to_string(tokens) + " (" + tokens_from + "), got " +
                              std::to_string(offsets.data[count - 1]));
    }
    return lengths;
}

// The sum of heads·L² over validated lengths.
int64_t probs_elements(const std::vector<int64_t> &lengths, int64_t heads) {
    int64_t total = 0;
    for (int64_t length : lengths) total += heads * length * length;
    return total;
}

}  // namespace

int64_t packed_probs_size(OffsetTensor sequence_offsets, int64_t heads) {
    if (heads < 1) throw Error("heads", "expected at least 1, got " + std::to_string(heads));
    return probs_elements(sequence_lengths(sequence_offsets, -1, nullptr), heads);
}

PackedBatch pack(ConstTensor x, MaskTensor key_padding_mask) {
    const char *layout = "[B, S, H]";
    const Shape &shape = check_rank("x", x, 3, layout);
    check_tensor("x", x, shape, layout);
    check_host("x", x, "packing copies on the host");
    const int64_t batch = shape[0], seq = shape[1], hidden = shape[2];
    if (!key_padding_mask.empty()) {
        check_tensor("key_padding_mask", key_padding_mask, {batch, seq}, "[B, S]");
        check_host("key_padding_mask", key_padding_mask, "packing reads it on the host");
    }
    PackedBatch packed;
    packed.hidden = hidden;
    packed.sequence_offsets.push_back(0);
    for (int64_t b = 0; b < batch; ++b) {
        int64_t length = seq;
        if (!key_padding_mask.empty()) {
            const uint8_t *row = key_padding_mask.data + b * seq;
            length = std::find(row, row + seq, uint8_t(0)) - row;
            const uint8_t *late = std::find_if(row + length, row + seq, [](uint8_t m) { return m != 0; });
            if (late != row + seq) {
                throw Error("key_padding_mask", "expected right padding (each row: ones, then zeros); row " +
                                                    std::to_string(b) + " has a real token at position " +
                                                    std::to_string(late - row) + " after padding at position " +
                                                    std::to_string(length));
            }
        }
        const float *rows = x.data + b * seq * hidden;
        packed.x.insert(packed.x.end(), rows, rows + length * hidden);
        packed.sequence_offsets.push_back(int32_t(packed.sequence_offsets.back() + length));
    }
    return packed;
}

void unpack(ConstTensor packed, OffsetTensor sequence_offsets, MutableTensor padded) {
    const Shape &ps = packed.shape;
    if (ps.size() != 2 || ps[0] < 0 || ps[1] <= 0) throw Error("packed", "expected shape [T, H], got " + str(ps));
    if (ps[0] > 0) check_tensor("packed", packed, ps, "[T, H]");
    check_host("packed", packed, "unpacking copies on the host");
    const std::vector<int64_t> lengths = sequence_lengths(sequence_offsets, ps[0], "packed's rows");
    const int64_t batch = int64_t(lengths.size()), hidden = ps[1];
    const int64_t longest = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
    const Shape &out = padded.shape;
    if (out.size() != 3 || out[0] != batch || out[1] < longest || out[2] != hidden) {
        throw Error("padded", "expected shape [B, S, H] = [" + std::to_string(batch) + ", S >= " +
                                  std::to_string(longest) + ", " + std::to_string(hidden) + "], got " + str(out));
    }
    if (element_count(out) > 0) check_tensor("padded", padded, out, "[B, S, H]");
    check_host("padded", padded, "unpacking copies on the host");
    if (overlaps(padded, packed)) throw Error("padded", "must not overlap packed");
    std::fill(padded.data, padded.data + element_count(out), 0.0f);
    for (int64_t b = 0; b < batch; ++b) {
        const float *from = packed.data + int64_t(sequence_offsets.data[b]) * hidden;
        std::copy(from, from + lengths[std::size_t(b)] * hidden, padded.data + b * out[1] * hidden);
    }
}

namespace detail {
// A GPU variant's weights, uploaded once by the Attention constructor (host memory) or
// wrapped in place (device memory); forward() passes them as they are.
struct DeviceWeights {
    WeightViews views;
    RowCache<uint8_t> ones;  // an absent mask's, for the next call
    RowCache<float> zeros;   // an absent bias's
    DeviceWeights(const LayerWeights &weights, const VariantInfo &variant) : views(weights) {
        prepare_halide(variant);
        CallBuffers place(variant);
        const halide_device_interface_t *gpu = device_interface(variant.device);
        auto upload = [&](const char *name, Halide::Runtime::Buffer<const float> &b, const ConstTensor &t) {
            place.input(name, b, t.memory);
            if (t.memory == Memory::host) check_halide(b.copy_to_device(gpu), name, "copying the weight to the device");
        };
        upload("w_q", views.w_q, weights.w_q);
        upload("w_k", views.w_k, weights.w_k);
        upload("w_v", views.w_v, weights.w_v);
        upload("w_o", views.w_o, weights.w_o);
        upload("b_q", views.b_q, weights.b_q);
        upload("b_k", views.b_k, weights.b_k);
        upload("b_v", views.b_v, weights.b_v);
        upload("b_o", views.b_o, weights.b_o);
        upload("gamma", views.gamma, weights.gamma);
        upload("beta", views.beta, weights.beta);
    }
};
}  // namespace detail

std::size_t detail::host_to_device_copies() { return uploads.load(); }

void synchronize(const VariantInfo &variant) {
    const halide_device_interface_t *gpu = detail::device_interface(variant.device);
    if (!gpu) return;
    detail::runnable_functions(variant);  // a variant that cannot run here has nothing queued
    prepare_halide(variant);
    check_halide(halide_device_sync_global(nullptr, gpu), "halide", "synchronizing " + variant.name);
}

Attention::Attention(Config config, LayerWeights weights, const std::string &variant)
    : config_(config), weights_(weights), variant_(nullptr) {
    check_config(config_);
    check_weights(config_, weights_, true, true);
    variant_ = &select_variant(variant);
    if (variant_->device != "cpu") device_weights_ = std::make_shared<detail::DeviceWeights>(weights_, *variant_);
}

void Attention::synchronize() const { attn::synchronize(*variant_); }

void Attention::forward(const AttentionInputs &in, MutableTensor y, MutableTensor probs) const {
    detail::runnable_functions(*variant_);  // a variant that cannot run here is refused first
    const int64_t hidden = config_.hidden_size, heads = config_.num_heads;
    const char *x_layout = "[B, S_q, H]";
    const Shape &x_shape = check_rank("x", in.x, 3, x_layout);
    const int64_t batch = x_shape[0], s_q = x_shape[1];
    check_tensor("x", in.x, {batch, s_q, hidden}, x_layout);
    const bool cross = !in.kv.empty();
    int64_t s_k = s_q;
    if (cross) {
        const char *kv_layout = "[B, S_k, H]";
        s_k = check_rank("kv", in.kv, 3, kv_layout)[1];
        check_tensor("kv", in.kv, {batch, s_k, hidden}, kv_layout);
    }
    check_tensor("y", y, {batch, s_q, hidden}, "[B, S_q, H]");
    const bool want_probs = !probs.empty();
    if (want_probs) check_tensor("probs", probs, {batch, heads, s_q, s_k}, "[B, heads, S_q, S_k]");
    for (const ConstTensor *input : {&in.x, &in.kv, &in.bias}) {
        if (overlaps(y, *input)) throw Error("y", "must not overlap an input buffer");
        if (want_probs && overlaps(probs, *input)) throw Error("probs", "must not overlap an input buffer");
    }
    if (want_probs && overlaps(y, probs)) throw Error("probs", "must not overlap y");

    prepare_halide(*variant_);
    const halide_device_interface_t *gpu = detail::device_interface(variant_->device);
    MaskArgument mask;
    make_mask(mask, in.key_padding_mask, batch, s_k, gpu, device_weights_ ? &device_weights_->ones : nullptr);
    BiasArgument bias;
    make_bias(bias, in.bias, batch, heads, s_q, s_k, gpu, device_weights_ ? &device_weights_->zeros : nullptr);
    std::unique_ptr<WeightViews> host_weights;
    WeightViews &w =
        device_weights_ ? device_weights_->views : *(host_weights = std::make_unique<WeightViews>(weights_));
    auto x = halide_view(in.x);
    auto y_buf = halide_view(y);
    Halide::Runtime::Buffer<float> probs_buf;
    if (want_probs) probs_buf = halide_view(probs);
    // Self-attention passes x as kv: the layer's one function takes both.
    auto kv = cross ? halide_view(in.kv) : x;
    const std::string function = want_probs ? "attention_layer_probs" : "attention_layer";
    const ProblemExtents call = extents(batch, s_q, s_k, heads, hidden);
    run_pipeline(function, *variant_, call, [&](CallBuffers &c, detail::Arguments &a) {
        bind_weights(c, a, w, weights_, device_weights_ != nullptr);
        a.buffer("key_padding_mask", placed_or_input(c, "key_padding_mask", mask));
        a.buffer("bias", placed_or_input(c, "bias", bias));
        halide_buffer_t *x_buffer = c.input("x", x, in.x.memory);
        a.buffer("x", x_buffer).buffer("kv", cross ? c.input("kv", kv, in.kv.memory) : x_buffer);
        a.scalar("causal", config_.causal).scalar("heads", int32_t(heads)).scalar("eps", config_.layer_norm_eps);
        a.buffer("y", c.output("y", y_buf, y.memory));
        if (want_probs) a.buffer("probs", c.output("probs", probs_buf, probs.memory));
    });
}

void Attention::forward_packed(const PackedInputs &in, MutableTensor y, MutableTensor probs) const {
    detail::runnable_functions(*variant_);  // a variant that cannot run here is refused first
    const int64_t hidden = config_.hidden_size, heads = config_.num_heads;
    const Shape &xs = in.x.shape;
    if (xs.size() != 2 || xs[0] < 0 || xs[1] != hidden) {
        throw Error("x", "expected shape [T, H] with H = " + std::to_string(hidden) + ", got " + str(xs));
    }
    const int64_t tokens = xs[0];
    if (tokens > 0) check_tensor("x", in.x, xs, "[T, H]");
    const std::vector<int64_t> lengths = sequence_lengths(in.sequence_offsets, tokens, "x's rows");
    const int64_t batch = int64_t(lengths.size());
    const int64_t longest = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
    if (y.shape != xs) throw Error("y", "expected shape [T, H] = " + str(xs) + ", got " + str(y.shape));
    if (tokens > 0) check_tensor("y", y, xs, "[T, H]");
    const bool want_probs = !probs.empty();
    if (want_probs) {
        check_tensor("probs", probs, {probs_elements(lengths, heads)}, "[sum over sequences of heads * L_b^2]");
        check_host("probs", probs, "each sequence's probabilities are gathered on the host");
    }
    const char *bias_layout = "[heads or 1, S_max, S_max]";
    if (!in.bias.empty()) {
        const Shape &bs = check_rank("bias", in.bias, 3, bias_layout);
        if ((bs[0] != heads && bs[0] != 1) || bs[1] != bs[2] || bs[1] < longest) {
            throw Error("bias", std::string("expected shape ") + bias_layout + " = [" + std::to_string(heads) +
                                    " or 1, S_max, S_max] with S_max >= the longest sequence, " +
                                    std::to_string(longest) + ", got " + str(bs));
        }
        check_tensor("bias", in.bias, bs, bias_layout);
    }
    for (const ConstTensor *input : {&in.x, &in.bias}) {
        if (overlaps(y, *input)) throw Error("y", "must not overlap an input buffer");
        if (want_probs && overlaps(probs, *input)) throw Error("probs", "must not overlap an input buffer");
    }
    if (want_probs && overlaps(y, probs)) throw Error("probs", "must not overlap y");
    if (tokens == 0) return;  // no token, nothing to compute

    prepare_halide(*variant_);
    const halide_device_interface_t *gpu = detail::device_interface(variant_->device);
    const int32_t t = int32_t(tokens), h = int32_t(hidden), s_max = int32_t(longest), b = int32_t(batch);
    // The token rows as a batch of one: (hidden, token, 1).
    const halide_dimension_t rows[3] = {{0, h, 1}, {0, t, h}, {0, 1, t * h}};
    Halide::Runtime::Buffer<const float> x(in.x.data, 3, rows);
    Halide::Runtime::Buffer<float> y_buf(y.data, 3, rows);
    Halide::Runtime::Buffer<const int32_t> offsets(in.sequence_offsets.data, b + 1);
    // One bias for every sequence: (key, query, head, sequence), sequence stride 0.
    BiasArgument bias;
    if (in.bias.empty()) {
        make_bias(bias, in.bias, b, heads, s_max, s_max, gpu, device_weights_ ? &device_weights_->zeros : nullptr);
    } else {
        const int32_t side = int32_t(in.bias.shape[1]);
        const halide_dimension_t dims[4] = {
            {0, side, 1}, {0, side, side}, {0, int32_t(heads), in.bias.shape[0] == 1 ? 0 : side * side}, {0, b, 0}};
        bias.buffer = Halide::Runtime::Buffer<const float>(in.bias.data, 4, dims);
        bias.memory = in.bias.memory;
    }
    // The probabilities come as [B, heads, S_max, S_max], each sequence's at its top left.
    Halide::Runtime::Buffer<float> padded_probs;
    if (want_probs) padded_probs = Halide::Runtime::Buffer<float>(s_max, s_max, int32_t(heads), b);
    std::unique_ptr<WeightViews> host_weights;
    WeightViews &w =
        device_weights_ ? device_weights_->views : *(host_weights = std::make_unique<WeightViews>(weights_));
    const std::string function = want_probs ? "attention_layer_packed_probs" : "attention_layer_packed";
    const ProblemExtents call = extents(batch, longest, longest, heads, hidden);
    run_pipeline(function, *variant_, call, [&](CallBuffers &c, detail::Arguments &a) {
        bind_weights(c, a, w, weights_, device_weights_ != nullptr);
        a.buffer("x", c.input("x", x, in.x.memory));
        a.buffer("sequence_offsets", c.input("sequence_offsets", offsets, Memory::host));
        a.buffer("bias", placed_or_input(c, "bias", bias));
        a.scalar("max_length", s_max).scalar("causal", config_.causal).scalar("heads", int32_t(heads));
        a.scalar("eps", config_.layer_norm_eps);
        a.buffer("y", c.output("y", y_buf, y.memory));
        if (want_probs) a.buffer("probs", c.output("probs", padded_probs, Memory::host));
    });
    if (!want_probs) return;
    float *out = probs.data;
    for (int32_t sequence = 0; sequence < b; ++sequence) {
        const int32_t length = int32_t(lengths[std::size_t(sequence)]);
        for (int32_t head = 0; head < int32_t(heads); ++head) {
            for (int32_t i = 0; i < length; ++i) {
                for (int32_t j = 0; j < length; ++j) *out++ = padded_probs(j, i, head, sequence);
            }
        }
    }
}

void Attention::forward_unpadded(const AttentionInputs &in, MutableTensor y) const {
    if (!in.kv.empty()) throw Error("kv", "forward_unpadded computes self-attention: expected no kv, got shape " +
                                              str(in.kv.shape));
    const char *layout = "[B, S, H]";
    const Shape &xs = check_rank("x", in.x, 3, layout);
    check_tensor("x", in.x, {xs[0], xs[1], config_.hidden_size}, layout);
    check_tensor("y", y, xs, layout);
    check_host("y", y, "unpacking copies on the host");
    check_host("bias", in.bias, "the bias is passed on to forward_packed as a host view");
    PackedBatch packed = pack(in.x, in.key_padding_mask);
    PackedInputs inputs = packed.inputs();
    if (!in.bias.empty()) {
        const char *bias_layout = "[1, heads or 1, S, S]";
        const Shape &bs = check_rank("bias", in.bias, 4, bias_layout);
        if (bs[0] != 1 || (bs[1] != config_.num_heads && bs[1] != 1) || bs[2] != xs[1] || bs[3] != xs[1]) {
            throw Error("bias", std::string("expected shape ") + bias_layout + " = [1, " +
                                    std::to_string(config_.num_heads) + " or 1, " + std::to_string(xs[1]) + ", " +
                                    std::to_string(xs[1]) + "] (one bias for every sequence), got " + str(bs));
        }
        check_tensor("bias", in.bias, bs, bias_layout);
        inputs.bias = {in.bias.data, in.bias.size, {bs[1], bs[2], bs[3]}};
    }
    if (overlaps(y, in.x) || overlaps(y, in.bias)) throw Error("y", "must not overlap an input buffer");
    std::vector<float> y_packed(packed.x.size());
    forward_packed(inputs, view(y_packed, {packed.tokens(), config_.hidden_size}));
    unpack(view(y_packed, {packed.tokens(), config_.hidden_size}), inputs.sequence_offsets, y);
}

namespace stages {
namespace {

// The config, q [B, S_q, H] and k [B, S_k, H] of a stage that attends: q's shape, and S_k.
std::pair<Shape, int64_t> check_queries_and_keys(const Config &config, const ConstTensor &q, const ConstTensor &k) {
    check_config(config);
    const Shape &qs = check_rank("q", q, 3, "[B, S_q, H]");
    check_tensor("q", q, {qs[0], qs[1], config.hidden_size}, "[B, S_q, H]");
    const int64_t s_k = check_rank("k", k, 3, "[B, S_k, H]")[1];
    check_tensor("k", k, {qs[0], s_k, config.hidden_size}, "[B, S_k, H]");
    return {qs, s_k};
}

}  // namespace

void qkv_projection(const VariantInfo &variant, const Config &config, ConstTensor x_q, ConstTensor x_kv,
                    const LayerWeights &weights, MutableTensor q, MutableTensor k, MutableTensor v) {
    detail::runnable_functions(variant);
    check_config(config);
    check_weights(config, weights, true, false);
    const int64_t hidden = config.hidden_size;
    const Shape &xq = check_rank("x_q", x_q, 3, "[B, S_q, H]");
    check_tensor("x_q", x_q, {xq[0], xq[1], hidden}, "[B, S_q, H]");
    const int64_t s_k = check_rank("x_kv", x_kv, 3, "[B, S_k, H]")[1];
    check_tensor("x_kv", x_kv, {xq[0], s_k, hidden}, "[B, S_k, H]");
    check_tensor("q", q, {xq[0], xq[1], hidden}, "[B, S_q, H]");
    check_tensor("k", k, {xq[0], s_k, hidden}, "[B, S_k, H]");
    check_tensor("v", v, {xq[0], s_k, hidden}, "[B, S_k, H]");
    auto xq_buf = halide_view(x_q), xkv_buf = halide_view(x_kv);
    auto w_q = halide_view(weights.w_q), w_k = halide_view(weights.w_k), w_v = halide_view(weights.w_v);
    auto b_q = halide_view(weights.b_q), b_k = halide_view(weights.b_k), b_v = halide_view(weights.b_v);
    auto q_buf = halide_view(q), k_buf = halide_view(k), v_buf = halide_view(v);
    const ProblemExtents call = extents(xq[0], xq[1], s_k, config.num_heads, hidden);
    run_pipeline("qkv_projection", variant, call, [&](CallBuffers &c, detail::Arguments &a) {
        a.buffer("x_q", c.input("x_q", xq_buf, x_q.memory)).buffer("x_kv", c.input("x_kv", xkv_buf, x_kv.memory));
        a.buffer("w_q", c.input("w_q", w_q, weights.w_q.memory)).buffer("w_k", c.input("w_k", w_k, weights.w_k.memory));
        a.buffer("w_v", c.input("w_v", w_v, weights.w_v.memory)).buffer("b_q", c.input("b_q", b_q, weights.b_q.memory));
        a.buffer("b_k", c.input("b_k", b_k, weights.b_k.memory)).buffer("b_v", c.input("b_v", b_v, weights.b_v.memory));
        a.buffer("q", c.output("q", q_buf, q.memory)).buffer("k", c.output("k", k_buf, k.memory));
        a.buffer("v", c.output("v", v_buf, v.memory));
    });
}

void attention_scores(const VariantInfo &variant, const Config &config, ConstTensor q, ConstTensor k, ConstTensor bias,
                      MutableTensor scores) {
    detail::runnable_functions(variant);
    const int64_t hidden = config.hidden_size, heads = config.num_heads;
    const auto [qs, s_k] = check_queries_and_keys(config, q, k);
    check_tensor("scores", scores, {qs[0], heads, qs[1], s_k}, "[B, heads, S_q, S_k]");
    prepare_halide(variant);
    BiasArgument b;
    make_bias(b, bias, qs[0], heads, qs[1], s_k, detail::device_interface(variant.device));
    auto q_buf = halide_view(q), k_buf = halide_view(k);
    auto s_buf = halide_view(scores);
    const ProblemExtents call = extents(qs[0], qs[1], s_k, heads, hidden);
    run_pipeline("attention_scores", variant, call, [&](CallBuffers &c, detail::Arguments &a) {
        a.buffer("q", c.input("q", q_buf, q.memory)).buffer("k", c.input("k", k_buf, k.memory));
        a.buffer("bias", placed_or_input(c, "bias", b)).scalar("heads", int32_t(heads));
        a.buffer("scores", c.output("scores", s_buf, scores.memory));
    });
}

void masked_softmax(const VariantInfo &variant, const Config &config, ConstTensor scores, MaskTensor key_padding_mask,
                    MutableTensor probs) {
    detail::runnable_functions(variant);
    check_config(config);
    const char *layout = "[B, heads, S_q, S_k]";
    const Shape &s = check_rank("scores", scores, 4, layout);
    check_tensor("scores", scores, {s[0], config.num_heads, s[2], s[3]}, layout);
    check_tensor("probs", probs, s, layout);
    prepare_halide(variant);
    MaskArgument mask;
    make_mask(mask, key_padding_mask, s[0], s[3], detail::device_interface(variant.device));
    auto s_buf = halide_view(scores);
    auto p_buf = halide_view(probs);
    const ProblemExtents call = extents(s[0], s[2], s[3], s[1], config.hidden_size);
    run_pipeline("masked_softmax", variant, call, [&](CallBuffers &c, detail::Arguments &a) {
        a.buffer("scores", c.input("scores", s_buf, scores.memory));
        a.buffer("key_padding_mask", placed_or_input(c, "key_padding_mask", mask)).scalar("causal", config.causal);
        a.buffer("probs", c.output("probs", p_buf, probs.memory));
    });
}

void weighted_sum(const VariantInfo &variant, const Config &config, ConstTensor probs, ConstTensor v,
                  MutableTensor ctx) {
    detail::runnable_functions(variant);
    check_config(config);
    const int64_t hidden = config.hidden_size, heads = config.num_heads;
    const char *layout = "[B, heads, S_q, S_k]";
    const Shape &p = check_rank("probs", probs, 4, layout);
    check_tensor("probs", probs, {p[0], heads, p[2], p[3]}, layout);
    check_tensor("v", v, {p[0], p[3], hidden}, "[B, S_k, H]");
    check_tensor("ctx", ctx, {p[0], p[2], hidden}, "[B, S_q, H]");
    auto p_buf = halide_view(probs), v_buf = halide_view(v);
    auto ctx_buf = head_view(ctx, heads);
    const ProblemExtents call = extents(p[0], p[2], p[3], heads, hidden);
    run_pipeline("weighted_sum", variant, call, [&](CallBuffers &c, detail::Arguments &a) {
        a.buffer("probs", c.input("probs", p_buf, probs.memory)).buffer("v", c.input("v", v_buf, v.memory));
        a.buffer("ctx", c.output("ctx", ctx_buf, ctx.memory));
    });
}

void attention_core(const VariantInfo &variant, const Config &config, ConstTensor q, ConstTensor k, ConstTensor v,
                    MaskTensor key_padding_mask, ConstTensor bias, MutableTensor ctx) {
    detail::runnable_functions(variant);
    const int64_t hidden = config.hidden_size, heads = config.num_heads;
    const auto [qs, s_k] = check_queries_and_keys(config, q, k);
    check_tensor("v", v, {qs[0], s_k, hidden}, "[B, S_k, H]");
    check_tensor("ctx", ctx, {qs[0], qs[1], hidden}, "[B, S_q, H]");
    if (overlaps(ctx, q) || overlaps(ctx, k) || overlaps(ctx, v) || overlaps(ctx, bias) ||
        overlaps(ctx, key_padding_mask)) {
        throw Error("ctx", "must not overlap an input buffer");
    }
    prepare_halide(variant);
    const halide_device_interface_t *gpu = detail::device_interface(variant.device);
    MaskArgument mask;
    make_mask(mask, key_padding_mask, qs[0], s_k, gpu);
    BiasArgument b;
    make_bias(b, bias, qs[0], heads, qs[1], s_k, gpu);
    auto q_buf = halide_view(q), k_buf = halide_view(k), v_buf = halide_view(v);
    auto ctx_buf = head_view(ctx, heads);
    const ProblemExtents call = extents(qs[0], qs[1], s_k, heads, hidden);
    run_pipeline("attention_core", variant, call, [&](CallBuffers &c, detail::Arguments &a) {
        a.buffer("q", c.input("q", q_buf, q.memory)).buffer("k", c.input("k", k_buf, k.memory));
        a.buffer("v", c.input("v", v_buf, v.memory)).buffer("bias", placed_or_input(c, "bias", b));
        a.buffer("key_padding_mask", placed_or_input(c, "key_padding_mask", mask));
        a.scalar("causal", config.causal).scalar("heads", int32_t(heads));
        a.buffer("ctx", c.output("ctx", ctx_buf, ctx.memory));
    });
}

void output_layernorm(const VariantInfo &variant, const Config &config, ConstTensor ctx, ConstTensor x,
                      const LayerWeights &weights, MutableTensor y) {
    detail::runnable_functions(variant);
    check_config(config);
    check_weights(config, weights, false, true);
    const int64_t hidden = config.hidden_size;
    const Shape &xs = check_rank("x", x, 3, "[B, S, H]");
    const Shape shape{xs[0], xs[1], hidden};
    check_tensor("x", x, shape, "[B, S, H]");
    check_tensor("ctx", ctx, shape, "[B, S, H]");
    check_tensor("y", y, shape, "[B, S, H]");
    auto ctx_buf = halide_view(ctx), x_buf = halide_view(x);
    auto y_buf = halide_view(y);
    auto w_o = halide_view(weights.w_o), b_o = halide_view(weights.b_o);
    auto gamma = halide_view(weights.gamma), beta = halide_view(weights.beta);
    const ProblemExtents call = extents(xs[0], xs[1], xs[1], config.num_heads, hidden);
    run_pipeline("output_layernorm", variant, call, [&](CallBuffers &c, detail::Arguments &a) {
        a.buffer("ctx", c.input("ctx", ctx_buf, ctx.memory)).buffer("x", c.input("x", x_buf, x.memory));
        a.buffer("w_o", c.input("w_o", w_o, weights.w_o.memory)).buffer("b_o", c.input("b_o", b_o, weights.b_o.memory));
        a.buffer("gamma", c.input("gamma", gamma, weights.gamma.memory));
        a.buffer("beta", c.input("beta", beta, weights.beta.memory)).scalar("eps", config.layer_norm_eps);
        a.buffer("y", c.output("y", y_buf, y.memory));
    });
}

}  // namespace stages
}  // namespace attn
