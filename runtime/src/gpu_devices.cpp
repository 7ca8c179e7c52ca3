// GPU devices: whether this machine can run a GPU variant, and the device interface
// its buffers use. The driver libraries are opened at run time (as Halide's own
// runtime does), so the library links and runs on machines without them.
//
// CUDA: Halide's runtime would create a context of its own; the pipelines here use the
// device's primary context instead, the one the CUDA runtime API (cudaMalloc, PyTorch)
// uses, so device pointers from those are valid in the kernels.
#include "attn/internal.h"

#include <HalideRuntimeCuda.h>
#include <HalideRuntimeOpenCL.h>
#include <dlfcn.h>

#include <mutex>

namespace attn::detail {

namespace {

// The CUDA driver API, as far as used here.
using CUresult = int;
using CUdevice = int;
using CUcontext = void *;
struct CudaDriver {
    CUresult (*cuInit)(unsigned) = nullptr;
    CUresult (*cuDeviceGetCount)(int *) = nullptr;
    CUresult (*cuDeviceGet)(CUdevice *, int) = nullptr;
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = nullptr;
    CUresult (*cuGetErrorString)(CUresult, const char **) = nullptr;
    CUcontext primary_context = nullptr;
    std::string unavailable;  // empty when a device and its primary context are ready

    std::string error(const char *call, CUresult r) const {
        const char *text = nullptr;
        if (cuGetErrorString) cuGetErrorString(r, &text);
        return std::string(call) + " failed: " + (text ? text : "CUDA error " + std::to_string(r));
    }
};

template <typename F>
bool load(void *library, const char *name, F &function) {
    function = reinterpret_cast<F>(dlsym(library, name));
    return function != nullptr;
}

const CudaDriver &cuda_driver() {
    static const CudaDriver driver = [] {
        CudaDriver d;
        // RTLD_GLOBAL: Halide's CUDA runtime first looks its driver symbols up in the
        // whole process and otherwise opens "libcuda.so", which machines with only the
        // driver (no toolkit) lack; loaded globally here, the lookup finds this copy.
        void *library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!library) {
            d.unavailable = "no CUDA driver (libcuda.so.1 cannot be loaded)";
            return d;
        }
        if (!load(library, "cuInit", d.cuInit) || !load(library, "cuDeviceGetCount", d.cuDeviceGetCount) ||
            !load(library, "cuDeviceGet", d.cuDeviceGet) ||
            !load(library, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain) ||
            !load(library, "cuGetErrorString", d.cuGetErrorString)) {
            d.unavailable = "the CUDA driver lacks the driver API functions used here";
            return d;
        }
        int count = 0;
        CUdevice device = 0;
        if (CUresult r = d.cuInit(0)) {
            d.unavailable = d.error("cuInit", r);
        } else if (CUresult r = d.cuDeviceGetCount(&count)) {
            d.unavailable = d.error("cuDeviceGetCount", r);
        } else if (count == 0) {
            d.unavailable = "the CUDA driver reports no device";
        } else if (CUresult r = d.cuDeviceGet(&device, 0)) {
            d.unavailable = d.error("cuDeviceGet", r);
        } else if (CUresult r = d.cuDevicePrimaryCtxRetain(&d.primary_context, device)) {
            d.unavailable = d.error("cuDevicePrimaryCtxRetain", r);
        }
        return d;
    }();
    return driver;
}

extern "C" int acquire_primary_context(void *, void **context, bool) {
    *context = cuda_driver().primary_context;
    return *context ? halide_error_code_success : halide_error_code_device_interface_no_device;
}
extern "C" int release_primary_context(void *) { return halide_error_code_success; }

std::string opencl_unavailable() {
    using cl_int = int32_t;
    using cl_uint = uint32_t;
    void *library = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) return "no OpenCL loader (libOpenCL.so.1 cannot be loaded)";
    cl_int (*clGetPlatformIDs)(cl_uint, void **, cl_uint *) = nullptr;
    cl_int (*clGetDeviceIDs)(void *, uint64_t, cl_uint, void **, cl_uint *) = nullptr;
    if (!load(library, "clGetPlatformIDs", clGetPlatformIDs) || !load(library, "clGetDeviceIDs", clGetDeviceIDs)) {
        return "the OpenCL loader lacks clGetPlatformIDs or clGetDeviceIDs";
    }
    cl_uint platforms = 0;
    void *platform[16];
    if (clGetPlatformIDs(16, platform, &platforms) != 0 || platforms == 0) return "no OpenCL platform is installed";
    constexpr uint64_t kAllDeviceTypes = 0xFFFFFFFF;  // CL_DEVICE_TYPE_ALL
    for (cl_uint p = 0; p < platforms && p < 16; ++p) {
        cl_uint devices = 0;
        if (clGetDeviceIDs(platform[p], kAllDeviceTypes, 0, nullptr, &devices) == 0 && devices > 0) return "";
    }
    return "no OpenCL device is present";
}

}  // namespace

bool device_available(const std::string &device, std::string *why) {
    std::string reason;
    if (device == "cuda") {
        reason = cuda_driver().unavailable;
        if (reason.empty()) {
            static std::once_flag hooks;
            std::call_once(hooks, [] {
                halide_set_cuda_acquire_context(acquire_primary_context);
                halide_set_cuda_release_context(release_primary_context);
            });
        }
    } else if (device == "opencl") {
        static const std::string opencl = opencl_unavailable();
        reason = opencl;
    } else if (device != "cpu") {
        reason = "unknown device '" + device + "'";
    }
    if (why) *why = reason;
    return reason.empty();
}

const halide_device_interface_t *device_interface(const std::string &device) {
    if (device == "cuda") return halide_cuda_device_interface();
    if (device == "opencl") return halide_opencl_device_interface();
    return nullptr;
}

}  // namespace attn::detail
