// The kernels' CPU threads: Halide's default thread pool, shared by every CPU variant.
#include "attn/attention.h"

#include <HalideRuntime.h>

#include <string>

namespace attn {

int set_num_threads(int threads) {
    // Halide's pool takes at most 256 threads and would clamp more without a word.
    if (threads < 0 || threads > 256) {
        throw Error("threads", "expected 0 (one per CPU core) to 256, got " + std::to_string(threads));
    }
    return halide_set_num_threads(threads);
}

int num_threads() { return halide_get_num_threads(); }

}  // namespace attn
