// The tests' OpenCL device behaves like a CUDA GPU in one respect: a kernel launch that
// asks for more local (shared) memory per work-group than manifest.json's
// gpu_shared_memory_per_block fails. PoCL, which runs the GPU schedules in CI, allows far
// more, so without this a GPU kernel too large for a real GPU would pass every test. The
// build checks every kernel whose shared memory Halide bounds by a constant
// (generators/gpu_shared_memory.cpp); this covers the others, at every shape the tests run.
//
// Halide's OpenCL runtime looks up every OpenCL function through halide_opencl_get_symbol,
// a weak symbol this definition replaces; it passes a kernel's shared memory as its last
// argument, clSetKernelArg(kernel, i, bytes, nullptr), which is where the limit applies.
#include "gpu_shared_memory_limit.h"

#include "attn/generated/manifest.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

using cl_int = int32_t;
using cl_kernel = void *;
constexpr cl_int kOutOfResources = -5;            // CL_OUT_OF_RESOURCES
constexpr uint32_t kKernelFunctionName = 0x1190;  // CL_KERNEL_FUNCTION_NAME

void *opencl_library() {
    static void *library = [] {
        void *l = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
        return l ? l : dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
    }();
    return library;
}

using SetKernelArg = cl_int (*)(cl_kernel, uint32_t, std::size_t, const void *);
using GetKernelInfo = cl_int (*)(cl_kernel, uint32_t, std::size_t, void *, std::size_t *);
SetKernelArg set_kernel_arg = nullptr;
std::atomic<std::size_t> launches{0}, largest{0};

cl_int limited_set_kernel_arg(cl_kernel kernel, uint32_t index, std::size_t bytes, const void *value) {
    const std::size_t limit = std::size_t(attn::manifest::kGpuSharedMemoryPerBlock);
    if (value != nullptr) return set_kernel_arg(kernel, index, bytes, value);
    if (kernel != nullptr) {  // (the tests' own probe of the limit passes none)
        ++launches;
        for (std::size_t seen = largest.load(); bytes > seen && !largest.compare_exchange_weak(seen, bytes);) {
        }
    }
    if (bytes > limit) {
        char name[256] = "?";
        if (auto info = reinterpret_cast<GetKernelInfo>(dlsym(opencl_library(), "clGetKernelInfo"))) {
            info(kernel, kKernelFunctionName, sizeof name - 1, name, nullptr);
        }
        std::fprintf(stderr,
                     "[ GPU LIMIT ] kernel %s asks for %zu bytes of shared memory per block; a GPU launch gets %zu "
                     "(manifest.json: gpu_shared_memory_per_block): refused as a GPU would\n",
                     name, bytes, limit);
        return kOutOfResources;
    }
    return set_kernel_arg(kernel, index, bytes, value);
}

}  // namespace

namespace attn::testing {
SharedMemorySeen gpu_shared_memory_seen() { return {launches.load(), largest.load()}; }
}  // namespace attn::testing

extern "C" void *halide_opencl_get_symbol(void *, const char *name) {
    void *library = opencl_library();
    void *symbol = library ? dlsym(library, name) : nullptr;
    if (symbol && std::strcmp(name, "clSetKernelArg") == 0) {
        set_kernel_arg = reinterpret_cast<SetKernelArg>(symbol);
        return reinterpret_cast<void *>(&limited_set_kernel_arg);
    }
    return symbol;
}
