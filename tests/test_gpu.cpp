// What only GPU variants do: run only where their device is, take device memory in
// place (CUDA) and synchronize, keep the weights on the device between calls. Their
// results against the reference are checked with every other variant's (test_layer,
// test_stages, test_properties); here, on the OpenCL variants (PoCL in CI) and, where
// a CUDA device is present, on the CUDA variants with device memory.
#include "attn/generated/manifest.h"
#include "attn/internal.h"  // detail::host_to_device_copies
#include "support/gpu_shared_memory_limit.h"
#include "support/variant_param.h"

#include <HalideBuffer.h>
#include <HalideRuntimeCuda.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace attn::testing {
namespace {

Problem small_gpu_problem() {
    Problem p;
    p.batch = 2, p.s_q = p.s_k = 37, p.hidden = 64, p.heads = 4, p.mask = Mask::padding;
    return p;
}

std::vector<VariantInfo> gpu_variants(const std::string &device) {
    std::vector<VariantInfo> found;
    for (const VariantInfo &v : variants()) {
        if (v.device == device) found.push_back(v);
    }
    return found;
}

// Why a test of the hand-written GPU variants (of `device`, or of every GPU device) ran none:
// those built cannot run here (their reasons), or none is built (a subset build, or a build
// for another device: the GPU machine's has CUDA variants and no OpenCL one).
std::string why_no_gpu_variant_ran(const std::string &device = "") {
    const std::string which = device.empty() ? "GPU" : device;
    std::string why;
    for (const VariantInfo &v : variants()) {
        if (v.device == "cpu" || (!device.empty() && v.device != device) || v.schedule != "manual") continue;
        why += (why.empty() ? "" : "; ") + v.name + ": " + v.not_runnable_reason;
    }
    return why.empty() ? "no hand-written " + which + " variant in this build (ATTN_ONLY_VARIANTS, or no " + which +
                             " ISA of the manifest is for this build's architecture)"
                       : "no hand-written " + which + " variant runs here (" + why + ")";
}

// Whether this build has every variant of the manifest's ISAs for its architecture (not a
// subset build) and one of them is for `device`.
bool builds_a_variant_for(const std::string &device) {
#ifdef ATTN_VARIANT_SUBSET
    return false;
#endif
    for (const manifest::Isa &isa : manifest::kIsas) {
        if (!isa.cross_compiled && device == isa.device && isa.variants.size()) return true;
    }
    return false;
}

TEST(Gpu, RunnableOnlyWithADriverAndADevice) {
    for (const VariantInfo &v : variants()) {
        if (v.device == "cpu") continue;
        if (!v.runnable) {
            EXPECT_FALSE(v.not_runnable_reason.empty()) << v.name;
            std::cout << "[   INFO   ] " << v.name << " does not run here: " << v.not_runnable_reason << "\n";
        }
    }
}

TEST(Gpu, NotChosenUnlessNamed) { EXPECT_EQ(select_variant().device, "cpu"); }

TEST(Gpu, DeviceMemoryNeedsACudaVariant) {
    const LayerData data(small_gpu_problem());
    const Problem &p = data.problem;
    std::vector<const VariantInfo *> candidates{&select_variant()};
    for (const VariantInfo &v : variants()) {
        if (v.device == "opencl" && v.runnable && v.provides("attention_layer")) candidates.push_back(&v);
    }
    for (const VariantInfo *v : candidates) {
        Attention layer(p.config(), data.weights(), v->name);
        AttentionInputs in = data.inputs();
        in.x = device_view<const float>(0x1000, data.x.size(), {p.batch, p.s_q, p.hidden});
        GuardedOutput y({p.batch, p.s_q, p.hidden});
        try {
            layer.forward(in, y.view());
            ADD_FAILURE() << v->name << " accepted device memory";
        } catch (const Error &e) {
            EXPECT_EQ(e.argument(), "x") << e.what();
            EXPECT_NE(std::string(e.what()).find("is CUDA device memory, but variant '" + v->name + "' runs on"),
                      std::string::npos)
                << e.what();
        }
        for (std::size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y.data()[i], -12345.0f) << "y written despite the error";
        EXPECT_TRUE(y.guards_intact());
    }
}

TEST(Gpu, SynchronizeWithNothingQueuedReturns) {
    EXPECT_NO_THROW(synchronize(select_variant()));
    for (const VariantInfo &v : variants()) {
        if (v.device != "cpu" && v.runnable) EXPECT_NO_THROW(synchronize(v)) << v.name;
    }
}

// The weights go to the device once, in the constructor: later calls, with other
// inputs, use them as they are.
TEST(Gpu, RepeatedCallsReuseTheWeightsOnTheDevice) {
    bool ran = false;
    for (const VariantInfo &v : variants()) {
        if (v.device == "cpu" || !v.runnable || v.schedule != "manual") continue;
        ran = true;
        Problem p = small_gpu_problem();
        const LayerData first(p, 1), second(p, 2);
        const Attention layer(p.config(), first.weights(), v.name);
        for (const LayerData *data : {&first, &second, &first}) {
            GuardedOutput y({p.batch, p.s_q, p.hidden});
            layer.forward(data->inputs(), y.view());
            // The first data's weights, this call's inputs.
            const auto exact = reference::attention_layer<double>(p.config(), first.weights(), data->inputs());
            const auto plain = reference::attention_layer<float>(p.config(), first.weights(), data->inputs());
            expect_matches_reference(v.name.c_str(), y, exact.y, plain.y);
        }
    }
    if (!ran) GTEST_SKIP() << why_no_gpu_variant_ran();
}

// After the first call, a call uploads only the inputs it was given in host memory: the
// weights went up with the constructor, and an absent mask's ones and bias's zeros stay
// on the device (Halide would otherwise copy their broadcast views one row at a time).
TEST(Gpu, LaterCallsUploadOnlyTheHostInputsGiven) {
    bool ran = false;
    for (const VariantInfo &v : variants()) {
        if (v.device == "cpu" || !v.runnable || v.schedule != "manual") continue;
        ran = true;
        Problem p = small_gpu_problem();
        p.mask = Mask::none;
        const LayerData data(p);
        const Attention layer(p.config(), data.weights(), v.name);
        GuardedOutput y({p.batch, p.s_q, p.hidden});
        layer.forward(data.inputs(), y.view());
        const std::size_t before = detail::host_to_device_copies();
        layer.forward(data.inputs(), y.view());
        EXPECT_EQ(detail::host_to_device_copies() - before, 1u) << v.name << ": x alone is new";
    }
    if (!ran) GTEST_SKIP() << why_no_gpu_variant_ran();
}

// The OpenCL device of these tests refuses a launch asking for more shared memory than a
// GPU block gets (support/gpu_shared_memory_limit.cpp), through the hook Halide's runtime
// calls; and the hand-written fused layer stays within it at a large head dimension (a
// block keeps the context of at most 64 of its features, the rest go to more blocks).
TEST(Gpu, OpenCLLaunchesGetOnlyTheSharedMemoryOfAGpuBlock) {
    using SetKernelArg = int32_t (*)(void *, uint32_t, std::size_t, const void *);
    const auto set_kernel_arg = reinterpret_cast<SetKernelArg>(halide_opencl_get_symbol(nullptr, "clSetKernelArg"));
    if (!set_kernel_arg) GTEST_SKIP() << "no OpenCL loader here";
    const std::size_t limit = std::size_t(manifest::kGpuSharedMemoryPerBlock);
    EXPECT_EQ(set_kernel_arg(nullptr, 0, limit + 1, nullptr), -5) << "CL_OUT_OF_RESOURCES above the limit";
    EXPECT_NE(set_kernel_arg(nullptr, 0, limit, nullptr), -5) << "passed on to OpenCL at the limit";

    bool ran = false;
    for (const VariantInfo &v : gpu_variants("opencl")) {
        if (!v.runnable || v.schedule != "manual") continue;
        ran = true;
        Problem p = small_gpu_problem();
        p.hidden = 256, p.heads = 2;  // d = 128
        const LayerData data(p);
        const ReferenceRun &ref = reference_run(data);
        const SharedMemorySeen before = gpu_shared_memory_seen();
        GuardedOutput y({p.batch, p.s_q, p.hidden});
        Attention(p.config(), data.weights(), v.name).forward(data.inputs(), y.view());
        expect_matches_reference(v.name.c_str(), y, ref.exact.y, ref.float32.y);
        const SharedMemorySeen after = gpu_shared_memory_seen();
        EXPECT_GT(after.launches, before.launches) << "the launches did not go through the hook";
        std::cout << "[   INFO   ] " << v.name << ", d = 128: at most " << after.largest
                  << " bytes of shared memory per block, of " << limit << "\n";
    }
    if (!ran) GTEST_SKIP() << why_no_gpu_variant_ran("opencl");
}

// Halide's CUDA runtime JIT-compiles a pipeline's kernels at its first call with the cap in
// HL_CUDA_JIT_MAX_REGISTERS (64 when unset). Each schedule source has its own cap
// (manifest.json: gpu_max_registers): the hand-written and tuned kernels were checked at
// `count`; the autoscheduled ones launch blocks of up to 1024 threads, which fit an SM only
// at 64 (at 255 they failed to launch on an H200). Every compiled CUDA function carries its
// source's cap, whether or not a GPU is here.
TEST(Gpu, EachCudaFunctionCarriesItsSourcesRegisterCap) {
    const std::vector<VariantInfo> cuda = gpu_variants("cuda");
    if (cuda.empty()) GTEST_SKIP() << "this build has no CUDA variant";
    for (const VariantInfo &v : cuda) {
        const manifest::ScheduleSource *source = nullptr;
        for (const manifest::ScheduleSource &s : manifest::kScheduleSources) {
            if (v.schedule == s.name) source = &s;
        }
        ASSERT_NE(source, nullptr) << v.name;
        const bool checked = std::string(source->kind) == "hand-written" || std::string(source->kind) == "tuned";
        for (const auto &[function, compiled] : detail::compiled_functions(v)) {
            for (const detail::CompiledFunction &f : compiled) {
                EXPECT_EQ(f.gpu_max_registers, checked ? manifest::kGpuMaxRegisters : 64) << v.name << " " << function;
            }
        }
    }
}

// The runtime sets the cap around each pipeline's first call and clears it after: every CUDA
// variant's layer runs, and the environment is as the caller left it.
TEST(Gpu, CudaRegisterCapLeavesTheEnvironmentAsFound) {
    const std::vector<VariantInfo> cuda = gpu_variants("cuda");
    if (cuda.empty() || !cuda.front().runnable) {
        GTEST_SKIP() << "no CUDA device here" << (cuda.empty() ? "" : ": " + cuda.front().not_runnable_reason);
    }
    const char *before = std::getenv("HL_CUDA_JIT_MAX_REGISTERS");
    const std::string callers = before ? before : "";
    const LayerData data(small_gpu_problem());
    const Problem &p = data.problem;
    for (const VariantInfo &v : cuda) {
        if (!v.provides("attention_layer")) continue;
        const Attention layer(p.config(), data.weights(), v.name);
        GuardedOutput y({p.batch, p.s_q, p.hidden});
        EXPECT_NO_THROW(layer.forward(data.inputs(), y.view())) << v.name;
        const char *now = std::getenv("HL_CUDA_JIT_MAX_REGISTERS");
        EXPECT_EQ(now != nullptr, before != nullptr) << v.name;
        if (now && before) EXPECT_EQ(std::string(now), callers) << v.name;
    }
}

// CUDA device memory in place: weights, inputs and output on the device, the call queued,
// synchronize() before reading.
TEST(Gpu, CudaDeviceMemoryMatchesReference) {
    const std::vector<VariantInfo> cuda = gpu_variants("cuda");
    if (cuda.empty() && !builds_a_variant_for("cuda")) {
        GTEST_SKIP() << "no CUDA variant in this build (ATTN_ONLY_VARIANTS, or no CUDA ISA of the manifest is for "
                        "this build's architecture)";
    }
    ASSERT_FALSE(cuda.empty());
    if (!cuda.front().runnable) GTEST_SKIP() << "no CUDA device here: " << cuda.front().not_runnable_reason;
    const LayerData data(small_gpu_problem());
    const Problem &p = data.problem;
    const ReferenceRun &ref = reference_run(data);
    for (const VariantInfo &v : cuda) {
        Halide::Runtime::Buffer<float> x(const_cast<float *>(data.x.data()), int(data.x.size()));
        Halide::Runtime::Buffer<uint8_t> mask(const_cast<uint8_t *>(data.mask.data()), int(data.mask.size()));
        std::vector<float> y_host(data.x.size(), -1.0f);
        Halide::Runtime::Buffer<float> y(y_host.data(), int(y_host.size()));
        for (halide_buffer_t *b : {x.raw_buffer(), mask.raw_buffer(), y.raw_buffer()}) {
            b->set_host_dirty(true);
            ASSERT_EQ(halide_copy_to_device(nullptr, b, halide_cuda_device_interface()), 0);
        }
        // The weights in device memory too: the Attention brings its matrices to the host
        // once to prepare them, and reads its vectors in place.
        LayerWeights weights = data.weights();
        std::vector<Halide::Runtime::Buffer<float>> weights_on_device;
        for (ConstTensor LayerWeights::*member :
             {&LayerWeights::w_q, &LayerWeights::b_q, &LayerWeights::w_k, &LayerWeights::b_k, &LayerWeights::w_v,
              &LayerWeights::b_v, &LayerWeights::w_o, &LayerWeights::b_o, &LayerWeights::gamma, &LayerWeights::beta}) {
            ConstTensor &w = weights.*member;
            Halide::Runtime::Buffer<float> &b =
                weights_on_device.emplace_back(const_cast<float *>(w.data), int(w.size));
            b.set_host_dirty(true);
            ASSERT_EQ(b.copy_to_device(halide_cuda_device_interface()), 0);
            w = device_view<const float>(b.raw_buffer()->device, w.size, w.shape);
        }
        Attention layer(p.config(), weights, v.name);
        AttentionInputs in = data.inputs();
        in.x = device_view<const float>(x.raw_buffer()->device, data.x.size(), {p.batch, p.s_q, p.hidden});
        in.key_padding_mask = device_view<const uint8_t>(mask.raw_buffer()->device, data.mask.size(), {p.batch, p.s_k});
        const auto y_view = device_view<float>(y.raw_buffer()->device, y_host.size(), {p.batch, p.s_q, p.hidden});
        if (!ran_or_refused(v, "attention_layer", [&] { layer.forward(in, y_view); })) continue;
        // Everything is on the device now: a second call copies nothing there.
        const std::size_t before = detail::host_to_device_copies();
        layer.forward(in, y_view);
        EXPECT_EQ(detail::host_to_device_copies(), before) << v.name;
        layer.synchronize();
        y.set_device_dirty(true);
        ASSERT_EQ(y.copy_to_host(), 0);
        const Accuracy a = check_accuracy(y_host.data(), ref.exact.y, ref.float32.y);
        EXPECT_TRUE(a.ok) << a.report(v.name);
    }
}

}  // namespace
}  // namespace attn::testing
