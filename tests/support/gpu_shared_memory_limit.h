// The tests' OpenCL device refuses, as a GPU would, a launch asking for more shared memory
// per block than manifest.json's gpu_shared_memory_per_block (gpu_shared_memory_limit.cpp).
#pragma once

#include <cstddef>

// Halide's OpenCL runtime finds every OpenCL function through this (weak) symbol, which
// gpu_shared_memory_limit.cpp defines.
extern "C" void *halide_opencl_get_symbol(void *user_context, const char *name);

namespace attn::testing {

struct SharedMemorySeen {
    std::size_t launches;  // OpenCL kernel launches so far in this process
    std::size_t largest;   // the most shared memory one of them asked for, in bytes
};
SharedMemorySeen gpu_shared_memory_seen();

}  // namespace attn::testing
