// The AOT functions of one variant, taken from the generated variant list.
#pragma once

#include "attn/attention.h"

#include <HalideRuntime.h>

namespace attn::detail {

using Buf = halide_buffer_t *;
struct Kernels {
    int (*qkv_projection)(Buf x_q, Buf x_kv, Buf w_q, Buf w_k, Buf w_v, Buf b_q, Buf b_k, Buf b_v, Buf q,
                          Buf k, Buf v);
    int (*attention_scores)(Buf q, Buf k, Buf bias, int32_t heads, Buf scores);
    int (*masked_softmax)(Buf scores, Buf key_padding_mask, bool causal, Buf probs);
    int (*weighted_sum)(Buf probs, Buf v, Buf ctx);
    int (*output_layernorm)(Buf ctx, Buf x, Buf w_o, Buf b_o, Buf gamma, Buf beta, float eps, Buf y);
    int (*self_attention)(Buf x, Buf w_q, Buf w_k, Buf w_v, Buf w_o, Buf b_q, Buf b_k, Buf b_v, Buf b_o,
                          Buf gamma, Buf beta, Buf key_padding_mask, Buf bias, bool causal, int32_t heads,
                          float eps, Buf y);
    int (*self_attention_probs)(Buf x, Buf w_q, Buf w_k, Buf w_v, Buf w_o, Buf b_q, Buf b_k, Buf b_v,
                                Buf b_o, Buf gamma, Buf beta, Buf key_padding_mask, Buf bias, bool causal,
                                int32_t heads, float eps, Buf y, Buf probs);
    int (*cross_attention)(Buf x, Buf w_q, Buf w_k, Buf w_v, Buf w_o, Buf b_q, Buf b_k, Buf b_v, Buf b_o,
                           Buf gamma, Buf beta, Buf key_padding_mask, Buf bias, bool causal, int32_t heads,
                           float eps, Buf kv, Buf y);
    int (*cross_attention_probs)(Buf x, Buf w_q, Buf w_k, Buf w_v, Buf w_o, Buf b_q, Buf b_k, Buf b_v,
                                 Buf b_o, Buf gamma, Buf beta, Buf key_padding_mask, Buf bias, bool causal,
                                 int32_t heads, float eps, Buf kv, Buf y, Buf probs);
};

// The kernels of a variant from variants(); throws attn::Error("variant") if it
// cannot run on this machine.
const Kernels &runnable_kernels(const VariantInfo &variant);

// Adds a variant whose kernels were loaded at run time (tools/autotune.py's
// candidates, dlopen'ed by attn_tune_probe). A null kernel is a function it lacks:
// calling it fails like a pipeline would, with attn::Error("halide", "... does not
// provide this function").
// Of `info`, the name, schedule, ISA and target are kept; whether it runs here is
// derived from the ISA, as for the compiled ones. select_variant(info.name) finds it;
// variants() keeps listing the compiled ones only.
// Not thread-safe: register before any other thread uses the library.
const VariantInfo &register_variant(VariantInfo info, Kernels kernels);

// Whether this CPU has the features the ISA's code uses; `missing` names them.
bool cpu_supports(const std::string &isa, std::string *missing);

// Whether `device` ("cpu", "cuda", "opencl") can run here: for a GPU, its driver loads
// and reports a device; `why` says what is missing.
bool device_available(const std::string &device, std::string *why);
// How many host-to-device copies this process's calls have asked Halide for (inputs in
// host memory, the weights, absent inputs' constants), for tests.
std::size_t host_to_device_copies();

// The Halide device interface of a GPU device; null for "cpu".
const halide_device_interface_t *device_interface(const std::string &device);

}  // namespace attn::detail
