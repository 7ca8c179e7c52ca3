// The schedule comparison's measuring side: every variant, for each stage's function
// and the fused layer, on the shared problem list, beside the OpenBLAS peers (the cases:
// cases.h; the peers: openblas_peers.h). Every case is checked against the reference
// (DESIGN.md's accuracy rule) before it is timed, for every problem small enough for the
// double reference; a wrong or refusing case is reported, not timed.
//
// Two ways to run it:
//   --serve  answers bench/compare.py, which times every case and peer of a problem in
//            interleaved rounds (serve.h): the comparison users read.
//   otherwise Google Benchmark runs the cases one after another (tools/autotune.py
//            uses this): counters GFLOP/s (the layer's GEMM FLOPs; the softmax counts a
//            nominal 5 FLOPs per score), bytes (each input and output touched once) and
//            the peak heap per iteration.
// --candidate=LIBRARY:SUFFIX:ISA (repeatable) loads a shared library holding some of the
// functions attn_<function>_<SUFFIX> (tools/autotune.py's candidates), registers it as the
// variant candidate_<SUFFIX> and offers it beside the compiled variants.
// --threads=N: our kernels (attn::set_num_threads) and OpenBLAS on N threads (default: one
// per CPU core each).
#include "attn/generated/manifest.h"
#include "attn/internal.h"  // the runtime's variant registration, for --candidate
#include "cases.h"
#include "peak_memory.h"
#include "serve.h"

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace attn::bench {
namespace {

void set_counters(benchmark::State &state, const Work &w) {
    state.counters["GFLOP/s"] = benchmark::Counter(w.flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["bytes"] = w.bytes;
    state.SetBytesProcessed(int64_t(w.bytes) * int64_t(state.iterations()));
}

void register_all(const std::vector<Case> &cases) {
    for (const Case &c : cases) {
        benchmark::RegisterBenchmark(c.name.c_str(), [&c](benchmark::State &state) {
            Prepared prepared = c.prepare();
            if (!prepared.error.empty()) return state.SkipWithError(prepared.error.c_str());
            if (prepared.max_error >= 0) state.counters["max_error"] = prepared.max_error;
            for (auto _ : state) prepared.run();
            set_counters(state, work(c.function, c.problem->problem));
        })->Unit(benchmark::kMillisecond);  // the report reads real_time (wall clock)
    }
}

}  // namespace
}  // namespace attn::bench

int main(int argc, char **argv) {
    const char *threads_flag = "--threads=";
    std::vector<attn::VariantInfo> variant_list = attn::variants();
    try {
        for (const attn::VariantInfo &v : attn::detail::take_candidates(argc, argv)) variant_list.push_back(v);
    } catch (const attn::Error &e) {
        std::fprintf(stderr, "attn_bench: %s\n", e.what());
        return 1;
    }
    bool serve = false;
    for (int i = 1; i < argc; ++i) {
        const bool is_threads = std::strncmp(argv[i], threads_flag, std::strlen(threads_flag)) == 0;
        const bool is_serve = std::strcmp(argv[i], "--serve") == 0;
        if (!is_serve && !is_threads) continue;
        if (is_threads) {
            // Our kernels and the OpenBLAS peers on the same count (bench/compare.py --threads).
            char *end = nullptr;
            const long threads = std::strtol(argv[i] + std::strlen(threads_flag), &end, 10);
            if (*end || threads < 1 || threads > attn::kMaxThreads) {
                std::fprintf(stderr, "attn_bench: --threads: expected 1 to %d, got '%s'\n", attn::kMaxThreads,
                             argv[i] + std::strlen(threads_flag));
                return 1;
            }
            attn::set_num_threads(int(threads));
            openblas_set_num_threads(int(threads));
        }
        serve = serve || is_serve;
        std::copy(argv + i + 1, argv + argc + 1, argv + i);  // argv[argc] is null
        --argc;
        --i;
    }
    const std::vector<attn::bench::Case> cases = attn::bench::all_cases(variant_list);
    if (serve) return attn::bench::serve(cases);
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    const nlohmann::json context = attn::bench::context_json();  // items() refers to it: keep it alive
    for (const auto &[key, value] : context.items()) {
        benchmark::AddCustomContext(key, value.is_string() ? value.get<std::string>() : value.dump());
    }
    static attn::bench::PeakMemory peak_memory;
    benchmark::RegisterMemoryManager(&peak_memory);
    attn::bench::register_all(cases);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
