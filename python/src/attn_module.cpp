// attn._attn: the C++ runtime (runtime/include/attn/attention.h) for Python, with nanobind.
//
// Arrays arrive as nanobind ndarrays (NumPy, torch and anything with DLPack or the buffer
// protocol), of any dtype, device and layout, and are checked here, so that a wrong one is a
// Python exception naming the argument instead of a nanobind overload error: a float32 (or
// mask: bool/uint8; offsets: int32) C-contiguous array in CPU memory, or in CUDA memory for
// a CUDA variant, is viewed in place, never copied. Outputs are arrays the caller allocated
// (attn/__init__.py allocates them in the inputs' framework).
//
// The GIL is released while the kernels run; attn::Attention is immutable after
// construction, so one layer may be called from several Python threads at once.
#include <attn/attention.h>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace nb = nanobind;

namespace {

using Array = nb::ndarray<nb::ro>;  // any dtype, device and strides, read-only view
using OutArray = nb::ndarray<>;
using MaybeArray = std::optional<Array>;

std::string shape_text(const Array &a) {
    std::string s = "[";
    for (std::size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
    return s + "]";
}

std::string dtype_name(nb::dlpack::dtype t) {
    using Code = nb::dlpack::dtype_code;
    switch (Code(t.code)) {
        case Code::Bool:
            return "bool";
        case Code::Float:
            return "float" + std::to_string(t.bits);
        case Code::Int:
            return "int" + std::to_string(t.bits);
        case Code::UInt:
            return "uint" + std::to_string(t.bits);
        case Code::Bfloat:
            return "bfloat" + std::to_string(t.bits);
        default:
            return "DLPack type code " + std::to_string(t.code) + " of " + std::to_string(t.bits) + " bits";
    }
}

// The memory an array is in, as the runtime names it: CPU, or CUDA device memory.
attn::Memory memory_of(const char *name, const Array &a) {
    if (a.device_type() == nb::device::cpu::value) return attn::Memory::host;
    if (a.device_type() == nb::device::cuda::value) return attn::Memory::device;
    throw nb::value_error(
        (std::string(name) + ": expected CPU or CUDA memory, got DLPack device type " + std::to_string(a.device_type()))
            .c_str());
}

// Elements in order, without gaps: the runtime reads row-major memory.
void check_contiguous(const char *name, const Array &a) {
    int64_t expected = 1;
    for (std::size_t i = a.ndim(); i-- > 0;) {
        if (a.shape(i) != 1 && a.stride(i) != expected) {
            throw nb::value_error((std::string(name) + ": expected a C-contiguous array, got shape " + shape_text(a) +
                                   " with strides not in row-major order (make it contiguous first)")
                                      .c_str());
        }
        expected *= int64_t(a.shape(i));
    }
}

template <typename T>
attn::TensorView<T> view_as(const char *name, const Array &a, std::initializer_list<nb::dlpack::dtype> accepted,
                            const char *expected) {
    bool ok = false;
    for (nb::dlpack::dtype t : accepted) ok = ok || a.dtype() == t;
    if (!ok) {
        throw nb::type_error(
            (std::string(name) + ": expected dtype " + expected + ", got " + dtype_name(a.dtype())).c_str());
    }
    check_contiguous(name, a);
    attn::Shape shape;
    for (std::size_t i = 0; i < a.ndim(); ++i) shape.push_back(int64_t(a.shape(i)));
    // size() is the elements the shape spans: exactly what a contiguous array holds.
    return {static_cast<T *>(const_cast<void *>(a.data())), a.size(), shape, memory_of(name, a)};
}

attn::ConstTensor floats(const char *name, const Array &a) {
    return view_as<const float>(name, a, {nb::dtype<float>()}, "float32");
}
attn::ConstTensor floats(const char *name, const MaybeArray &a) { return a ? floats(name, *a) : attn::ConstTensor{}; }
attn::MutableTensor out_floats(const char *name, const OutArray &a) {
    // A writable array: nanobind refuses read-only ones before this is reached.
    Array ro(a);
    attn::ConstTensor view = floats(name, ro);
    return {const_cast<float *>(view.data), view.size, view.shape, view.memory};
}
attn::MutableTensor out_floats(const char *name, const std::optional<OutArray> &a) {
    return a ? out_floats(name, *a) : attn::MutableTensor{};
}
attn::MaskTensor mask(const char *name, const MaybeArray &a) {
    if (!a) return {};
    return view_as<const uint8_t>(name, *a, {nb::dtype<bool>(), nb::dtype<uint8_t>()}, "bool or uint8");
}
attn::OffsetTensor offsets(const char *name, const Array &a) {
    return view_as<const int32_t>(name, a, {nb::dtype<int32_t>()}, "int32");
}

// A layer's weights with their arrays, kept alive as long as the layer that views them.
class Layer {
public:
    Layer(int64_t hidden_size, int64_t num_heads, float layer_norm_eps, bool causal, const nb::dict &weights,
          const std::string &variant, const std::string &precision, bool allow_storage_only) {
        attn::Config config{hidden_size, num_heads, layer_norm_eps, causal};
        config.precision = attn::precision_from_name(precision, "precision");
        config.allow_storage_only = allow_storage_only;
        attn::LayerWeights w;
        const std::pair<const char *, attn::ConstTensor attn::LayerWeights::*> named[] = {
            {"w_q", &attn::LayerWeights::w_q},     {"b_q", &attn::LayerWeights::b_q},
            {"w_k", &attn::LayerWeights::w_k},     {"b_k", &attn::LayerWeights::b_k},
            {"w_v", &attn::LayerWeights::w_v},     {"b_v", &attn::LayerWeights::b_v},
            {"w_o", &attn::LayerWeights::w_o},     {"b_o", &attn::LayerWeights::b_o},
            {"gamma", &attn::LayerWeights::gamma}, {"beta", &attn::LayerWeights::beta}};
        for (const auto &[name, member] : named) {
            if (!weights.contains(name)) throw nb::value_error((std::string(name) + ": missing weight").c_str());
            arrays_.push_back(nb::cast<Array>(weights[name]));
            w.*member = floats(name, arrays_.back());
        }
        nb::gil_scoped_release release;  // the weight matrices are prepared (and uploaded to a GPU) here
        attention_ = std::make_unique<attn::Attention>(config, w, variant);
    }

    void forward(const Array &x, OutArray y, const MaybeArray &kv, const MaybeArray &key_padding_mask,
                 const MaybeArray &bias, std::optional<OutArray> probs) const {
        attn::AttentionInputs in{floats("x", x), floats("kv", kv), mask("key_padding_mask", key_padding_mask),
                                 floats("bias", bias)};
        attn::MutableTensor out = out_floats("y", y), p = out_floats("probs", probs);
        nb::gil_scoped_release release;
        attention_->forward(in, out, p);
    }

    void forward_packed(const Array &x, const Array &sequence_offsets, OutArray y, const MaybeArray &bias,
                        std::optional<OutArray> probs) const {
        attn::PackedInputs in{floats("x", x), offsets("cu_seqlens", sequence_offsets), floats("bias", bias)};
        attn::MutableTensor out = out_floats("y", y), p = out_floats("probs", probs);
        nb::gil_scoped_release release;
        attention_->forward_packed(in, out, p);
    }

    void forward_unpadded(const Array &x, const Array &key_padding_mask, OutArray y, const MaybeArray &bias) const {
        attn::AttentionInputs in{floats("x", x), {}, mask("key_padding_mask", key_padding_mask), floats("bias", bias)};
        attn::MutableTensor out = out_floats("y", y);
        nb::gil_scoped_release release;
        attention_->forward_unpadded(in, out);
    }

    void synchronize() const {
        nb::gil_scoped_release release;
        attention_->synchronize();
    }

    const attn::VariantInfo &variant() const { return attention_->variant(); }

private:
    std::vector<Array> arrays_;
    std::unique_ptr<attn::Attention> attention_;
};

nb::dict variant_dict(const attn::VariantInfo &v) {
    nb::dict d;
    d["name"] = v.name;
    d["schedule"] = v.schedule;
    d["isa"] = v.isa;
    d["target"] = v.target;
    d["device"] = v.device;
    d["functions"] = v.functions;
    d["bitwise_reproducible"] = v.bitwise_reproducible;
    d["runnable"] = v.runnable;
    d["not_runnable_reason"] = v.not_runnable_reason;
    return d;
}

}  // namespace

NB_MODULE(_attn, m) {
    m.doc() = "attn's C++ runtime: Halide-compiled BERT self-attention (use the attn package, not this module)";

    // attn.Error: a ValueError whose `argument` names the argument at fault.
    // Never released: the translator may run until the interpreter is gone.
    static PyObject *error_type = PyErr_NewExceptionWithDoc(
        "attn.Error", "An invalid argument (ValueError); .argument names it.", PyExc_ValueError, nullptr);
    m.attr("Error") = nb::handle(error_type);
    nb::register_exception_translator(
        [](const std::exception_ptr &p, void *) {
            try {
                std::rethrow_exception(p);
            } catch (const attn::Error &e) {
                nb::object error = nb::handle(error_type)(nb::str(e.what()));
                error.attr("argument") = nb::str(e.argument().c_str());
                PyErr_SetObject(error_type, error.ptr());
            }
        },
        nullptr);

    m.def(
        "variants",
        [] {
            nb::list out;
            for (const attn::VariantInfo &v : attn::variants()) out.append(variant_dict(v));
            return out;
        },
        "Every compiled variant, as dicts, by ISA then schedule source.");
    m.def(
        "select", [](const std::string &name) { return variant_dict(attn::select_variant(name)); },
        nb::arg("name") = "", "The variant a call with this name (empty: the default for this CPU) would use.");
    m.def("default_variant_reason", &attn::default_variant_reason,
          "The default variant's name and why it was picked: the measurement it follows, or the rule.");
    m.attr("MAX_THREADS") = attn::kMaxThreads;
    m.def("set_num_threads", &attn::set_num_threads, nb::arg("threads"),
          "The CPU threads the kernels may use (0: one per core); returns the previous count.");
    m.def("num_threads", &attn::num_threads);
    m.def("release_scratch_memory", &attn::release_scratch_memory);

    m.def(
        "attention_core",
        [](const std::string &variant, int64_t hidden_size, int64_t num_heads, bool causal, const Array &q,
           const Array &k, const Array &v, OutArray ctx, const MaybeArray &key_padding_mask, const MaybeArray &bias,
           const std::string &precision, bool allow_storage_only) {
            attn::Config config{hidden_size, num_heads, 1e-12f, causal};
            config.precision = attn::precision_from_name(precision, "precision");
            config.allow_storage_only = allow_storage_only;
            // Named: that one (the stage says what it lacks); else the core's pick in this precision.
            const attn::VariantInfo &info =
                variant.empty() ? attn::select_variant(config, "", "attention_core") : attn::select_variant(variant);
            attn::ConstTensor tq = floats("q", q), tk = floats("k", k), tv = floats("v", v), tb = floats("bias", bias);
            attn::MaskTensor mk = mask("key_padding_mask", key_padding_mask);
            attn::MutableTensor out = out_floats("out", ctx);
            nb::gil_scoped_release release;
            attn::stages::attention_core(info, config, tq, tk, tv, mk, tb, out);
        },
        nb::arg("variant"), nb::arg("hidden_size"), nb::arg("num_heads"), nb::arg("causal"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("out"), nb::arg("key_padding_mask").none(), nb::arg("bias").none(),
        nb::arg("precision") = "fp32", nb::arg("allow_storage_only") = false,
        "The attention core on [B, S, heads·d] arrays (heads interleaved), into `out` [B, S_q, heads·d], "
        "in `precision` (fp32 or bf16: attn::stages::attention_core).");
    m.def(
        "synchronize",
        [](const std::string &variant) {
            const attn::VariantInfo &info = attn::select_variant(variant);
            nb::gil_scoped_release release;
            attn::synchronize(info);
        },
        nb::arg("variant"));

    nb::class_<Layer>(m, "Layer")
        .def(nb::init<int64_t, int64_t, float, bool, const nb::dict &, const std::string &, const std::string &, bool>(),
             nb::arg("hidden_size"), nb::arg("num_heads"), nb::arg("layer_norm_eps"), nb::arg("causal"),
             nb::arg("weights"), nb::arg("variant"), nb::arg("precision") = "fp32",
             nb::arg("allow_storage_only") = false)
        .def("forward", &Layer::forward, nb::arg("x"), nb::arg("y"), nb::arg("kv").none(),
             nb::arg("key_padding_mask").none(), nb::arg("bias").none(), nb::arg("probs").none())
        .def("forward_packed", &Layer::forward_packed, nb::arg("x"), nb::arg("cu_seqlens"), nb::arg("y"),
             nb::arg("bias").none(), nb::arg("probs").none())
        .def("forward_unpadded", &Layer::forward_unpadded, nb::arg("x"), nb::arg("key_padding_mask"), nb::arg("y"),
             nb::arg("bias").none())
        .def("synchronize", &Layer::synchronize)
        .def_prop_ro("variant", [](const Layer &l) { return variant_dict(l.variant()); });
}
