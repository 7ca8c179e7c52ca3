// Every manifest function called by its name (attn::internal): the outputs it writes on a
// call's extents, the call through the public API made ready on given inputs (views of
// host memory, or of device memory where the benchmarks place them), and its double and
// plain float32 references on host copies of the same inputs. Each function's entry sits
// beside its public function (runtime/src/stages.cpp, attention.cpp, packed.cpp), so a new
// function is callable here as soon as it has its API; the tests' checks and the
// benchmarks' cases derive from this (Manifest.EveryFunctionHasACall holds it to the manifest).
#pragma once

#include "attn/attention.h"
#include "attn/reference.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace attn::detail {

// The inputs a call may read, by the manifest's argument names; the caller fills those
// the function takes.
struct CallInputs {
    ConstTensor x, kv;    // [B, S_q, H] and [B, S_k, H] (the projections' x_q, x_kv; kv empty: x)
    ConstTensor q, k, v;  // the stages' inputs: [B, S_q, H], [B, S_k, H]
    ConstTensor scores;   // [B, heads, S_q, S_k]
    ConstTensor probs;    // [B, heads, S_q, S_k]
    ConstTensor ctx;      // [B, S_q, H]
    MaskTensor key_padding_mask;
    ConstTensor bias;  // [1, heads, S_q, S_k] (packed functions: viewed as [heads, S, S])
    LayerWeights weights;
    PackedInputs packed;  // the packed functions' tokens and offsets (their bias: from `bias`)
};

// A function's output: its name and shape.
struct CallOutput {
    std::string name;
    Shape shape;
};

// The work of one call: FLOPs (the GEMMs'; the softmax counts a nominal 5 FLOPs per
// score) and bytes (each input and output touched once).
struct CallWork {
    double flops = 0, bytes = 0;
};

// The references of a call's outputs, in the order of its outputs.
struct CallReference {
    std::vector<std::vector<double>> exact;
    std::vector<std::vector<float>> float32;
    // Per output, what the accuracy rule's tolerance adds to each element for a reduced
    // precision's rounding of an activation the function computes
    // (reference::context_allowance); empty in fp32.
    std::vector<std::vector<double>> allowance;
};

// The extents and options of a call: the config (hidden size, heads, causal) and B, S_q, S_k.
struct CallShape {
    Config config;
    int64_t batch = 1, s_q = 1, s_k = 1;
};

struct FunctionCall {
    // The outputs the function writes (inputs: for the packed functions' sizes).
    std::function<std::vector<CallOutput>(const CallShape &, const CallInputs &)> outputs;
    // Makes the call ready (an Attention made for the layer, its weights uploaded for a GPU
    // variant) and returns the call itself: it writes `outputs` (in the order of outputs())
    // and waits for the device.
    std::function<std::function<void()>(const VariantInfo &, const CallShape &, const CallInputs &,
                                        const std::vector<MutableTensor> &outputs)>
        prepare;
    // The double reference and the plain float32 one, on host inputs.
    std::function<CallReference(const CallShape &, const CallInputs &)> reference;
    // Its work on a dense call of these extents (a packed call: the sum over its sequences).
    std::function<CallWork(const CallShape &)> work;
    // Whether it reads the layer's intermediates (q, k, v, scores, probs or ctx), which a
    // caller must then fill in; else only the layer's own inputs.
    bool reads_intermediates = false;
};

// The call of a manifest function; throws attn::Error("function") for one without an entry.
const FunctionCall &function_call(const std::string &function);
bool has_function_call(const std::string &function);

// The entries of the fused layer's functions (attention.cpp, packed.cpp).
CallWork layer_work(const CallShape &c);
// The config a by-name call runs in `precision` (a layer's, or a stage's): a variant named for
// its bf16 or int8 function runs it as built (without the instructions on an ISA that lacks them).
inline Config call_config(const CallShape &c, Precision precision) {
    Config config = c.config;
    config.precision = precision;
    config.allow_storage_only = true;
    return config;
}
// precision: the layer's (a bf16 call allows a storage-only variant: it names the variant).
FunctionCall layer_call(bool with_probs, Precision precision = Precision::fp32);
FunctionCall packed_layer_call(bool with_probs, Precision precision = Precision::fp32);

// A layer's references (reference::LayerOutputs or PackedOutputs): y, and the probabilities.
template <typename Exact, typename Float32>
CallReference layer_reference(Exact exact, Float32 float32, bool with_probs) {
    CallReference r{{std::move(exact.y)}, {std::move(float32.y)}, {{}}};
    if (with_probs) {
        r.exact.push_back(std::move(exact.probs)), r.float32.push_back(std::move(float32.probs));
        r.allowance.emplace_back();
    }
    return r;
}

}  // namespace attn::detail
