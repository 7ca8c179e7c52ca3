// The runtime's internals that the benchmarks and tests reach (CMake target
// attn::internal; not installed): the compiled AOT functions of each variant, calling one
// by argument name, registering candidates, and the device helpers.
#pragma once

#include "attn/attention.h"

#include <HalideRuntime.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace attn::manifest {
struct MeasuredOrder;  // attn/generated/dispatch.h
}

namespace attn::detail {

// One compiled AOT function: Halide's entry point that takes its arguments as an array
// in the order of its metadata, and that metadata (argument names, kinds and types).
struct CompiledFunction {
    int max_seq = 0;  // the largest max(S_q, S_k) it serves (its shape class); 0: no bound
    int (*argv)(void **) = nullptr;
    const halide_filter_metadata_t *(*metadata)() = nullptr;
    // CUDA's JIT register cap for its kernels: its schedule source's (manifest.json:
    // gpu_max_registers); 0: the hand-written schedule's (a tuning candidate's).
    int gpu_max_registers = 0;
};
// A variant's functions by manifest name; one function per shape class, by increasing max_seq.
using FunctionTable = std::map<std::string, std::vector<CompiledFunction>>;

// The arguments of one call, by name. Calls bind them to the function's own argument
// list (its metadata), so no call depends on the order a generator declares them in.
class Arguments {
public:
    Arguments &buffer(const std::string &name, halide_buffer_t *buffer);
    Arguments &scalar(const std::string &name, bool value);
    Arguments &scalar(const std::string &name, int32_t value);
    Arguments &scalar(const std::string &name, float value);

    struct Value {
        std::string name;
        halide_buffer_t *buffer = nullptr;  // null for a scalar
        halide_type_t type;                 // a scalar's
        halide_scalar_value_t scalar;
    };
    const Value *find(const char *name) const;
    const std::vector<Value> &values() const { return values_; }

private:
    Arguments &add(const std::string &name, halide_buffer_t *buffer, halide_type_t type, halide_scalar_value_t scalar);
    std::vector<Value> values_;
};

// Calls `function` with `arguments` bound by name; returns Halide's status. A function
// argument that `arguments` lacks, or holds with another kind or type, and an argument the
// function does not take, are mismatches between manifest.json, the runtime and a
// generator: attn::Error("variant") naming it, before any call.
int call(const CompiledFunction &function, const Arguments &arguments, const std::string &what);


// The variant's compiled functions, whether or not it runs here (their metadata can be read).
const FunctionTable &compiled_functions(const VariantInfo &variant);
// The same; throws attn::Error("variant") if it cannot run here.
const FunctionTable &runnable_functions(const VariantInfo &variant);
// The compiled function that serves `call`: the variant's own, of the shape class of
// max(S_q, S_k), or its fallback's below its min_shapes. Throws attn::Error("variant")
// when the variant does not provide it (manifest.json, not_provided).
const CompiledFunction &function_for(const VariantInfo &variant, const std::string &function,
                                     const ProblemExtents &call);

// Adds a variant whose functions were loaded at run time (tools/autotune.py's candidates,
// from attn_bench --candidate). Of `info`, the name, schedule, ISA and target are kept;
// whether it runs here is derived from the ISA, as for the compiled ones.
// select_variant(info.name) finds it; variants() keeps listing the compiled ones only.
// Not thread-safe: register before any other thread uses the library.
const VariantInfo &register_variant(VariantInfo info, FunctionTable functions);
// LIBRARY:SUFFIX:ISA: the functions attn_<function>_<SUFFIX> of a shared library (a tuning
// candidate's, tools/autotune.py), registered as the variant candidate_<SUFFIX> of ISA.
// Throws attn::Error("--candidate") for a malformed spec, a library that does not load, or
// one without such a function. (Target attn::candidate_library.)
const VariantInfo &load_candidate(const std::string &spec);
// Loads every --candidate=LIBRARY:SUFFIX:ISA of a command line (load_candidate) and removes
// it from argv; returns the variants, in order.
std::vector<VariantInfo> take_candidates(int &argc, char **argv);
// The compiled variants in manifest order, then those registered at run time.
std::vector<const VariantInfo *> compiled_and_registered_variants();

// Whether this CPU has the features the ISA's code uses (manifest.json); `missing` names them.
bool cpu_supports(const std::string &isa, std::string *missing);
// The CPU's model name as Linux reports it (/proc/cpuinfo), "unknown" where it does not.
std::string cpu_model();
// What the model name may not tell: a VM's "AMD EPYC" is any Zen, from Zen 1's two 128-bit FMA
// pipes to Zen 4's AVX-512. x86's "family F model M" (/proc/cpuinfo), "" where not reported.
std::string cpu_id();
// The measurements of this CPU (generated/dispatch.json) that covered `widest`, its widest
// instruction set, in the order dispatch tries them: those of its model name and id, then
// those of its model name made before ids were recorded (an entry without one).
std::vector<const manifest::MeasuredOrder *> measurements_of_this_cpu(const std::string &widest);
// The shape classes' measured picks on this CPU, those there are (default_variant_for gives
// them; a class without one runs select_variant()'s).
std::vector<const VariantInfo *> default_class_picks();

// Whether `device` ("cpu", "cuda", "opencl") can run here: for a GPU, its driver loads
// and reports a device; `why` says what is missing.
bool device_available(const std::string &device, std::string *why);
// How many host-to-device copies this process's calls have asked Halide for (inputs in
// host memory, the weights, absent inputs' constants), for tests.
std::size_t host_to_device_copies();

// The Halide device interface of a GPU device; null for "cpu".
const halide_device_interface_t *device_interface(const std::string &device);

// The host scratch cache (runtime/src/host_scratch.cpp): Halide's large host
// allocations, kept after a call for the next one. Installed by the first call, unless
// the application installed its own Halide allocator first.
void install_scratch_cache();
struct ScratchStats {
    std::size_t allocated = 0;   // large blocks taken from the C allocator
    std::size_t reused = 0;      // large blocks served from the cache
    std::size_t kept_bytes = 0;  // bytes kept now
};
ScratchStats scratch_stats();

// Installs one of Halide's runtime hooks (`set`: halide_set_custom_free, ..._do_par_for)
// unless the application installed its own first, which it keeps; whether ours is in.
template <typename Hook>
bool install_hook(Hook (*set)(Hook), Hook ours, Hook halide_default) {
    const Hook previous = set(ours);
    if (previous == halide_default) return true;
    set(previous);
    return false;
}

// A CPU kernel call (pipeline::Call::run): its start installs the kernels' thread pool
// (runtime/src/threads.cpp; unless the application installed its own do_par_for first) and
// sizes it to Halide's thread count; while one runs, the pool's workers spin between its
// parallel loops instead of parking, and its start wakes those parked.
struct KernelCall {
    KernelCall();
    ~KernelCall();
    KernelCall(const KernelCall &) = delete;
    KernelCall &operator=(const KernelCall &) = delete;
};

}  // namespace attn::detail
