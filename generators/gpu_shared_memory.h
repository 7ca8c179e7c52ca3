// A build-time check of every GPU kernel's shared memory: a kernel that needs more than
// a launch gets fails on the GPU only, and CI runs the GPU schedules on PoCL, which
// allows more; so the build fails instead, naming the kernel.
#pragma once

#include "Halide.h"

#include <string>

namespace attn_gen {

// Adds the check to `pipeline`'s lowering on a GPU target (else does nothing): the build
// fails where a kernel is proven to need more than manifest.json's
// gpu_shared_memory_per_block. `build` names what is being built in the error.
void check_gpu_shared_memory(Halide::Pipeline pipeline, const Halide::Target &target, const std::string &build);

}  // namespace attn_gen
