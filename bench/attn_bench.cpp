// The schedule comparison (Google Benchmark): every variant of the variant list, by
// stage and for the fused layer, on the shared problem list, beside the OpenBLAS
// peers. Names are <stage>/<variant>/<problem>, e.g.
// self_attention/manual_avx2/b1_s128_h768_n12. Counters: GFLOP/s (the layer's GEMM
// FLOPs; the softmax counts a nominal 5 FLOPs per score) and bytes (each input and
// output touched once: the minimum traffic). The fused layer is checked against the
// reference (DESIGN.md's accuracy rule) before it is timed, for every problem small
// enough for the double reference; a wrong variant is reported as an error, not timed.
//
// Stage outputs are checked the same way against the reference of that stage.
//
// Extra flags: --problems_json=PATH writes the problem list (with each sequence's real
// length) for the out-of-process peers (bench/peers.py) and exits.
// --candidate=LIBRARY:SUFFIX:ISA loads a shared library holding some of the functions
// attn_<stage>_<SUFFIX> (tools/autotune.py's candidates), registers it as the variant
// candidate_<SUFFIX> and benchmarks only it.
#include "kernels.h"  // the runtime's variant registration, for --candidate
#include "openblas_peers.h"
#include "peak_memory.h"

#include <HalideBuffer.h>
#include <HalideRuntimeCuda.h>
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>

namespace attn::bench {
namespace {

using testing::LayerData;
using testing::ListedProblem;
using testing::Problem;

// Long contexts are benchmarked as a fused layer only: each S×S stage buffer
// would be B·heads·S² floats (768 MiB at S=4096).
constexpr int64_t kLongestStageSeq = 512;

struct Work {
    double flops = 0, bytes = 0;
};

Work work(const std::string &stage, const Problem &p) {
    const double B = double(p.batch), Sq = double(p.s_q), Sk = double(p.s_k), H = double(p.hidden);
    const double heads = double(p.heads), f = 4;  // bytes per float
    const double qkv = 2 * B * (Sq + 2 * Sk) * H * H, attend = 2 * B * Sq * Sk * H, out = 2 * B * Sq * H * H;
    const double scores = B * heads * Sq * Sk;
    if (stage == "qkv_projection") return {qkv, f * (B * Sq * H + B * Sk * H + 3 * H * H + B * (Sq + 2 * Sk) * H)};
    if (stage == "attention_scores") return {attend, f * (B * Sq * H + B * Sk * H + scores)};
    if (stage == "masked_softmax") return {5 * scores, f * 2 * scores};
    if (stage == "weighted_sum") return {attend, f * (scores + B * Sk * H + B * Sq * H)};
    if (stage == "output_layernorm") return {out, f * (3 * B * Sq * H + H * H)};
    return {qkv + 2 * attend + out, f * (2 * B * Sq * H + 4 * H * H)};  // the fused layer
}

void set_counters(benchmark::State &state, const Work &w) {
    state.counters["GFLOP/s"] = benchmark::Counter(w.flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["bytes"] = w.bytes;
    state.SetBytesProcessed(int64_t(w.bytes) * int64_t(state.iterations()));
}

// Inputs, the reference, and stage buffers of one problem, built on first use.
struct Fixture {
    LayerData data;
    std::vector<double> exact_y;
    std::vector<float> float32_y;
    // Stage inputs of the S×S shape (short contexts only); the [B, S, H] stage inputs
    // (q, k, v, ctx) are all data.x, as only the time counts.
    std::vector<float> scores, probs;
    // Per stage: the double reference and the plain float32 result on these inputs.
    std::map<std::string, std::pair<std::vector<double>, std::vector<float>>> stage_reference;

    explicit Fixture(const ListedProblem &lp) : data(lp.problem) {
        const Problem &p = lp.problem;
        if (lp.reference_checked) {
            const Config c = p.config();
            exact_y = reference::attention_layer<double>(c, data.weights(), data.inputs()).y;
            float32_y = reference::attention_layer<float>(c, data.weights(), data.inputs()).y;
        }
        if (p.s_q <= kLongestStageSeq) {
            std::mt19937 rng(7);
            std::uniform_real_distribution<float> score(-4.0f, 4.0f), prob(0.0f, 2.0f / float(p.s_k));
            scores.resize(std::size_t(p.batch * p.heads * p.s_q * p.s_k));
            for (float &s : scores) s = score(rng);
            probs.resize(scores.size());
            for (float &s : probs) s = prob(rng);
        }
    }
};

Fixture &fixture(const ListedProblem &lp) {
    static std::mutex mutex;
    static std::map<std::string, std::unique_ptr<Fixture>> cache;
    std::lock_guard<std::mutex> lock(mutex);
    auto &slot = cache[lp.problem.name()];
    if (!slot) slot = std::make_unique<Fixture>(lp);
    return *slot;
}

// The reference of one stage on the fixture's stage inputs (q = k = v = ctx = x).
template <typename T>
std::vector<T> stage_reference(const std::string &name, const Fixture &f, const Problem &p) {
    const Config c = p.config();
    const reference::Sizes sizes{p.batch, p.s_q, p.s_k};
    const LayerWeights w = f.data.weights();
    const std::vector<T> x(f.data.x.begin(), f.data.x.end());
    if (name == "qkv_projection") {
        std::vector<T> qkv;
        for (auto [weight, bias] : {std::pair{w.w_q, w.b_q}, std::pair{w.w_k, w.b_k}, std::pair{w.w_v, w.b_v}}) {
            const std::vector<T> out = reference::linear<T>(x, p.batch * p.s_q, weight, bias);
            qkv.insert(qkv.end(), out.begin(), out.end());
        }
        return qkv;
    }
    if (name == "attention_scores") return reference::attention_scores<T>(c, sizes, x, x, {});
    if (name == "masked_softmax") {
        return reference::masked_softmax<T>(c, sizes, std::vector<T>(f.scores.begin(), f.scores.end()),
                                            f.data.inputs().key_padding_mask);
    }
    if (name == "weighted_sum") {
        return reference::weighted_sum<T>(c, sizes, std::vector<T>(f.probs.begin(), f.probs.end()), x);
    }
    return reference::output_layernorm<T>(c, sizes, x, x, w);
}

// Where a benchmark's tensors live. A CUDA variant is timed as a GPU user runs it:
// inputs copied to the device once, outputs left there, attn::synchronize() inside the
// timed loop. Everything else reads and writes host memory.
class Placement {
public:
    explicit Placement(const VariantInfo &variant) : on_device_(variant.device == "cuda") {}

    // A read-only view of `host`, or of its copy on the device.
    template <typename T>
    TensorView<const T> in(const std::vector<T> &host, Shape shape) {
        const T *data = on_device_ ? reinterpret_cast<const T *>(upload(host)) : host.data();
        return {data, host.size(), std::move(shape), memory()};
    }
    // A view of `host` for an output, or of a device buffer that copy_outputs_to_host() copies into it.
    template <typename T>
    TensorView<T> out(std::vector<T> &host, Shape shape) {
        T *data = host.data();
        if (on_device_) {
            data = reinterpret_cast<T *>(upload(host));
            outputs_.push_back(placed_.back().second);
        }
        return {data, host.size(), std::move(shape), memory()};
    }
    void copy_outputs_to_host() {
        for (halide_buffer_t *raw : outputs_) {
            raw->set_device_dirty(true);
            if (halide_copy_to_host(nullptr, raw) != 0) throw Error("bench", "copy to the host failed");
        }
    }

private:
    Memory memory() const { return on_device_ ? Memory::device : Memory::host; }
    // Copies `host` to a new device buffer, kept until the Placement goes; its device address.
    template <typename T>
    uintptr_t upload(const std::vector<T> &host) {
        auto buffer = std::make_shared<Halide::Runtime::Buffer<const T>>(host.data(), int(host.size()));
        buffer->set_host_dirty();
        if (buffer->copy_to_device(halide_cuda_device_interface()) != 0) throw Error("bench", "copy to the device failed");
        placed_.push_back({buffer, buffer->raw_buffer()});
        return static_cast<uintptr_t>(buffer->raw_buffer()->device);
    }

    bool on_device_;
    std::vector<std::pair<std::shared_ptr<void>, halide_buffer_t *>> placed_;  // each buffer, kept alive
    std::vector<halide_buffer_t *> outputs_;
};

// Applies the accuracy rule when there is a reference (`exact` not empty); false (and
// the benchmark marked as an error) when the output is wrong.
bool output_is_correct(benchmark::State &state, const float *actual, const std::vector<double> &exact,
                       const std::vector<float> &plain, const std::string &who) {
    if (exact.empty()) return true;
    const testing::Accuracy a = testing::check_accuracy(actual, exact, plain);
    state.counters["max_error"] = a.max_error;
    if (!a.ok) state.SkipWithError(a.report(who).c_str());
    return a.ok;
}

void fused_layer(benchmark::State &state, const VariantInfo &variant, const ListedProblem &lp) {
    if (!variant.runnable) return state.SkipWithError(("cannot run here: " + variant.not_runnable_reason).c_str());
    const Fixture &f = fixture(lp);
    const Problem &p = lp.problem;
    Attention layer(p.config(), f.data.weights(), variant.name);
    Placement place(variant);
    std::vector<float> y(f.data.x.size());
    AttentionInputs inputs = f.data.inputs();
    inputs.x = place.in(f.data.x, {p.batch, p.s_q, p.hidden});
    if (!f.data.mask.empty()) inputs.key_padding_mask = place.in(f.data.mask, {p.batch, p.s_k});
    MutableTensor y_view = place.out(y, {p.batch, p.s_q, p.hidden});
    layer.forward(inputs, y_view);
    layer.synchronize();
    place.copy_outputs_to_host();
    if (!output_is_correct(state, y.data(), f.exact_y, f.float32_y, variant.name)) return;
    for (auto _ : state) {
        layer.forward(inputs, y_view);
        layer.synchronize();
    }
    set_counters(state, work("self_attention", p));
}

void stage(benchmark::State &state, const std::string &name, const VariantInfo &variant, const ListedProblem &lp) {
    if (!variant.runnable) return state.SkipWithError(("cannot run here: " + variant.not_runnable_reason).c_str());
    Fixture &f = fixture(lp);
    const Problem &p = lp.problem;
    const Config c = p.config();
    const LayerWeights w = f.data.weights();
    const Shape bsh{p.batch, p.s_q, p.hidden}, sc{p.batch, p.heads, p.s_q, p.s_k};
    const std::vector<float> &x = f.data.x;
    std::vector<float> k(x.size()), v(x.size());
    Placement place(variant);
    const ConstTensor x_in = place.in(x, bsh);
    const MaskTensor mask = f.data.mask.empty() ? MaskTensor{} : place.in(f.data.mask, {p.batch, p.s_k});
    ConstTensor scores_in, probs_in;
    if (name == "masked_softmax") scores_in = place.in(f.scores, sc);
    if (name == "weighted_sum") probs_in = place.in(f.probs, sc);
    const bool scores_out = name == "attention_scores" || name == "masked_softmax";
    std::vector<float> out(scores_out ? f.scores.size() : x.size());
    const MutableTensor out_view = place.out(out, scores_out ? sc : bsh);
    MutableTensor k_view, v_view;
    if (name == "qkv_projection") k_view = place.out(k, bsh), v_view = place.out(v, bsh);
    auto run = [&] {
        if (name == "qkv_projection") {
            stages::qkv_projection(variant, c, x_in, x_in, w, out_view, k_view, v_view);
        } else if (name == "attention_scores") {
            stages::attention_scores(variant, c, x_in, x_in, {}, out_view);
        } else if (name == "masked_softmax") {
            stages::masked_softmax(variant, c, scores_in, mask, out_view);
        } else if (name == "weighted_sum") {
            stages::weighted_sum(variant, c, probs_in, x_in, out_view);
        } else {
            stages::output_layernorm(variant, c, x_in, x_in, w, out_view);
        }
        synchronize(variant);
    };
    run();
    place.copy_outputs_to_host();
    if (lp.reference_checked) {
        auto &[exact, plain] = f.stage_reference[name];  // Fixture is shared; benchmarks run one at a time
        if (exact.empty()) {
            exact = stage_reference<double>(name, f, p);
            plain = stage_reference<float>(name, f, p);
        }
        std::vector<float> actual = out;  // q, then k and v
        if (name == "qkv_projection") {
            actual.insert(actual.end(), k.begin(), k.end());
            actual.insert(actual.end(), v.begin(), v.end());
        }
        if (!output_is_correct(state, actual.data(), exact, plain, name + " " + variant.name)) return;
    }
    for (auto _ : state) run();
    set_counters(state, work(name, p));
}

void openblas_layer(benchmark::State &state, bool roofline, const ListedProblem &lp) {
    const Fixture &f = fixture(lp);
    BlasWorkspace ws(lp.problem);
    std::vector<float> y(f.data.x.size());
    if (roofline) {
        for (auto _ : state) openblas_roofline(Gemms::layer, f.data, ws);
    } else {
        openblas_unfused(f.data, ws, y.data());
        if (!output_is_correct(state, y.data(), f.exact_y, f.float32_y, "openblas_unfused")) return;
        for (auto _ : state) openblas_unfused(f.data, ws, y.data());
    }
    set_counters(state, work("self_attention", lp.problem));
}

void openblas_stage(benchmark::State &state, Gemms gemms, const std::string &name, const ListedProblem &lp) {
    const Fixture &f = fixture(lp);
    BlasWorkspace ws(lp.problem);
    for (auto _ : state) openblas_roofline(gemms, f.data, ws);
    set_counters(state, work(name, lp.problem));
}

benchmark::internal::Benchmark *configure(benchmark::internal::Benchmark *b) {
    return b->Unit(benchmark::kMillisecond);  // the report reads real_time (wall clock)
}

void register_all(const std::vector<VariantInfo> &variant_list, bool peers) {
    const char *stage_names[] = {"qkv_projection", "attention_scores", "masked_softmax", "weighted_sum",
                                 "output_layernorm"};
    const std::pair<const char *, Gemms> stage_peers[] = {{"qkv_projection", Gemms::qkv_projection},
                                                          {"attention_scores", Gemms::attention_scores},
                                                          {"weighted_sum", Gemms::weighted_sum},
                                                          {"output_layernorm", Gemms::output_projection}};
    // OpenCL variants run the GPU schedules on PoCL in CI, to check them; as a CPU
    // OpenCL's timings say nothing about a GPU, they are not benchmarked.
    std::vector<VariantInfo> timed;
    for (const VariantInfo &v : variant_list) {
        if (v.device != "opencl") timed.push_back(v);
    }
    for (const ListedProblem &lp : testing::problem_list()) {
        const std::string problem = lp.problem.name();
        for (const VariantInfo &v : timed) {
            configure(benchmark::RegisterBenchmark(("self_attention/" + v.name + "/" + problem).c_str(), fused_layer,
                                                   v, lp));
        }
        if (peers) {
            configure(benchmark::RegisterBenchmark(("self_attention/openblas_roofline/" + problem).c_str(),
                                                   openblas_layer, true, lp));
            configure(benchmark::RegisterBenchmark(("self_attention/openblas_unfused/" + problem).c_str(),
                                                   openblas_layer, false, lp));
        }
        if (lp.problem.s_q > kLongestStageSeq) continue;
        for (const char *name : stage_names) {
            for (const VariantInfo &v : timed) {
                configure(benchmark::RegisterBenchmark((std::string(name) + "/" + v.name + "/" + problem).c_str(),
                                                       stage, std::string(name), v, lp));
            }
        }
        for (const auto &[name, gemms] : stage_peers) {
            if (peers) {
                configure(benchmark::RegisterBenchmark((std::string(name) + "/openblas_roofline/" + problem).c_str(),
                                                       openblas_stage, gemms, std::string(name), lp));
            }
        }
    }
}

// --candidate=LIBRARY:SUFFIX:ISA: the functions attn_<stage>_<SUFFIX> the library has.
VariantInfo load_candidate(const std::string &spec) {
    const std::size_t first = spec.find(':'), last = spec.rfind(':');
    if (first == std::string::npos || first == last) {
        throw Error("--candidate", "expected LIBRARY:SUFFIX:ISA, got '" + spec + "'");
    }
    const std::string library = spec.substr(0, first), suffix = spec.substr(first + 1, last - first - 1);
    void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) throw Error("--candidate", std::string("cannot load ") + library + ": " + dlerror());
    detail::Kernels k{};
    int found = 0;
    auto bind = [&](auto &function, const char *stage) {
        using Function = std::remove_reference_t<decltype(function)>;
        function = reinterpret_cast<Function>(dlsym(handle, ("attn_" + std::string(stage) + "_" + suffix).c_str()));
        found += function != nullptr;
    };
    bind(k.qkv_projection, "qkv_projection");
    bind(k.attention_scores, "attention_scores");
    bind(k.masked_softmax, "masked_softmax");
    bind(k.weighted_sum, "weighted_sum");
    bind(k.output_layernorm, "output_layernorm");
    bind(k.self_attention, "self_attention");
    bind(k.self_attention_probs, "self_attention_probs");
    bind(k.cross_attention, "cross_attention");
    bind(k.cross_attention_probs, "cross_attention_probs");
    if (!found) throw Error("--candidate", library + " has no function attn_<stage>_" + suffix);
    VariantInfo info;
    info.name = "candidate_" + suffix;
    info.schedule = "candidate";
    info.isa = spec.substr(last + 1);
    info.target = library;
    return detail::register_variant(info, k);
}

std::string cpu_model() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    }
    return "unknown";
}

void write_problems_json(const std::string &path) {
    std::ofstream out(path);
    out << "[\n";
    const auto &list = testing::problem_list();
    for (std::size_t i = 0; i < list.size(); ++i) {
        const Problem &p = list[i].problem;
        const LayerData data(p);
        out << "  {\"name\": \"" << p.name() << "\", \"model\": \"" << list[i].model << "\", \"batch\": " << p.batch
            << ", \"s_q\": " << p.s_q << ", \"s_k\": " << p.s_k << ", \"hidden\": " << p.hidden
            << ", \"heads\": " << p.heads << ", \"causal\": " << (p.causal ? "true" : "false")
            << ", \"reference_checked\": " << (list[i].reference_checked ? "true" : "false") << ", \"lengths\": [";
        for (int64_t b = 0; b < p.batch; ++b) {
            int64_t real = p.s_k;
            if (!data.mask.empty()) {
                real = 0;
                for (int64_t j = 0; j < p.s_k; ++j) real += data.mask[std::size_t(b * p.s_k + j)];
            }
            out << (b ? ", " : "") << real;
        }
        out << "]}" << (i + 1 < list.size() ? "," : "") << "\n";
    }
    out << "]\n";
}

}  // namespace
}  // namespace attn::bench

int main(int argc, char **argv) {
    const char *problems_flag = "--problems_json=", *candidate_flag = "--candidate=";
    std::vector<attn::VariantInfo> variant_list = attn::variants();
    bool peers = true;
    for (int i = 1; i < argc; ++i) {
        if (std::strncmp(argv[i], problems_flag, std::strlen(problems_flag)) == 0) {
            attn::bench::write_problems_json(argv[i] + std::strlen(problems_flag));
            return 0;
        }
        if (std::strncmp(argv[i], candidate_flag, std::strlen(candidate_flag)) == 0) {
            try {
                variant_list = {attn::bench::load_candidate(argv[i] + std::strlen(candidate_flag))};
            } catch (const attn::Error &e) {
                std::fprintf(stderr, "attn_bench: %s\n", e.what());
                return 1;
            }
            peers = false;
            std::copy(argv + i + 1, argv + argc + 1, argv + i);  // argv[argc] is null
            --argc;
            --i;
        }
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::AddCustomContext("cpu_model", attn::bench::cpu_model());
    benchmark::AddCustomContext("halide", "21.0.0");
    benchmark::AddCustomContext("openblas", openblas_get_config());
    benchmark::AddCustomContext("selected_variant", attn::select_variant().name);
    static attn::bench::PeakMemory peak_memory;
    benchmark::RegisterMemoryManager(&peak_memory);
    attn::bench::register_all(variant_list, peers);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
