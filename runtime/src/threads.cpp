// The kernels' CPU threads: Halide's default thread pool, shared by every CPU variant.
#include "attn/attention.h"

#include <HalideRuntime.h>

#include <string>

namespace attn {

int set_num_threads(int threads) {
    if (threads < 0 || threads > kMaxThreads) {
        throw Error("threads", "expected 0 (one per CPU core) to " + std::to_string(kMaxThreads) + ", got " +
                                   std::to_string(threads));
    }
    return halide_set_num_threads(threads);
}

int num_threads() { return halide_get_num_threads(); }

}  // namespace attn
