// Peak heap use for Google Benchmark's memory report (max_bytes_used in the JSON):
// everything allocated through operator new (the runtime, the peers' scratch) and
// through Halide's allocator (every buffer a pipeline allocates on the heap).
// Stack allocations and OpenBLAS's own mmap'd buffers are not counted.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>

namespace attn::bench {

class PeakMemory : public benchmark::MemoryManager {
public:
    PeakMemory();  // routes Halide's allocations through the counter
    void Start() override;
    void Stop(Result &result) override;
    void Stop(Result *result) override { Stop(*result); }
    // The peak heap of one call of `run`, beyond what was live before it.
    int64_t measure(const std::function<void()> &run);
};

}  // namespace attn::bench
