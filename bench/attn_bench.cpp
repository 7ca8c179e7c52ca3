// The schedule comparison's measuring side: every variant, for each stage's function
// and the fused layer, on the shared problem list, beside the OpenBLAS peers. Case
// names are <function>/<implementation>/<problem> (functions of manifest.json), e.g.
// attention_layer/manual_avx2/b1_s128_h768_n12. Every case is checked against the
// reference (DESIGN.md's accuracy rule) before it is timed, for every problem small
// enough for the double reference; a wrong or refusing case is reported, not timed.
//
// Two ways to run it:
//   --serve  answers bench/compare.py, which times every case and peer of a problem in
//            interleaved rounds (see serve() below): the comparison users read.
//   otherwise Google Benchmark runs the cases one after another (tools/autotune.py
//            uses this): counters GFLOP/s (the layer's GEMM FLOPs; the softmax counts a
//            nominal 5 FLOPs per score), bytes (each input and output touched once) and
//            the peak heap per iteration.
// --candidate=LIBRARY:SUFFIX:ISA (repeatable) loads a shared library holding some of the
// functions attn_<function>_<SUFFIX> (tools/autotune.py's candidates), registers it as the
// variant candidate_<SUFFIX> and offers it beside the compiled variants.
#include "attn/generated/manifest.h"
#include "attn/internal.h"  // the runtime's variant registration, for --candidate
#include "openblas_peers.h"
#include "peak_memory.h"

#include <HalideBuffer.h>
#include <HalideRuntimeCuda.h>
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <dlfcn.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

namespace attn::bench {
namespace {

using testing::LayerData;
using testing::ListedProblem;
using testing::Problem;

// At long contexts the S×S stages are not timed alone: each S×S stage buffer would be
// B·heads·S² floats (768 MiB at S=4096). The projections and the attention core ([B, S, H]
// in and out) are, so the fused layer's time splits into its projections and its core.
constexpr int64_t kLongestStageSeq = 384;
bool timed_at_every_length(const std::string &function) {
    return function == "qkv_projection" || function == "output_layernorm" || function == "attention_core";
}

struct Work {
    double flops = 0, bytes = 0;
};

// Each sequence's real length, per problem (built once: LayerData draws the inputs).
const std::vector<int64_t> &lengths_of(const Problem &p) {
    static std::mutex mutex;
    static std::map<std::string, std::vector<int64_t>> cache;
    std::lock_guard<std::mutex> lock(mutex);
    auto found = cache.find(p.name());
    if (found == cache.end()) found = cache.emplace(p.name(), LayerData(p).lengths()).first;
    return found->second;
}

Work work(const std::string &function, const Problem &p) {
    if (p.packed) {  // the real work: each sequence's, as a batch of one of its length
        Work total;
        for (int64_t length : lengths_of(p)) {
            Problem one = p;
            one.packed = false, one.mask = testing::Mask::none, one.batch = 1, one.s_q = one.s_k = length;
            const Work w = work(function, one);
            total.flops += w.flops, total.bytes += w.bytes;
        }
        return total;
    }
    const double B = double(p.batch), Sq = double(p.s_q), Sk = double(p.s_k), H = double(p.hidden);
    const double heads = double(p.heads), f = 4;  // bytes per float
    const double qkv = 2 * B * (Sq + 2 * Sk) * H * H, attend = 2 * B * Sq * Sk * H, out = 2 * B * Sq * H * H;
    const double scores = B * heads * Sq * Sk;
    if (function == "qkv_projection") return {qkv, f * (B * Sq * H + B * Sk * H + 3 * H * H + B * (Sq + 2 * Sk) * H)};
    if (function == "attention_scores") return {attend, f * (B * Sq * H + B * Sk * H + scores)};
    if (function == "masked_softmax") return {5 * scores, f * 2 * scores};
    if (function == "weighted_sum") return {attend, f * (scores + B * Sk * H + B * Sq * H)};
    if (function == "output_layernorm") return {out, f * (3 * B * Sq * H + H * H)};
    if (function == "attention_core") return {2 * attend, f * (2 * B * Sq * H + 2 * B * Sk * H)};
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

    PackedBatch packed;  // a packed problem's real tokens

    explicit Fixture(const ListedProblem &lp) : data(lp.problem) {
        const Problem &p = lp.problem;
        if (p.packed) {
            packed = data.packed();
            if (lp.reference_checked) {
                const Config c = p.config();
                exact_y = reference::attention_layer_packed<double>(c, data.weights(), packed.inputs()).y;
                float32_y = reference::attention_layer_packed<float>(c, data.weights(), packed.inputs()).y;
            }
            return;
        }
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

std::mutex fixtures_mutex;
std::map<std::string, std::unique_ptr<Fixture>> fixtures;

Fixture &fixture(const ListedProblem &lp) {
    std::lock_guard<std::mutex> lock(fixtures_mutex);
    auto &slot = fixtures[lp.problem.name()];
    if (!slot) slot = std::make_unique<Fixture>(lp);
    return *slot;
}

// Frees every fixture; the cases prepared on them must be gone first.
void release_fixtures() {
    std::lock_guard<std::mutex> lock(fixtures_mutex);
    fixtures.clear();
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
    if (name == "attention_core")
        return reference::attention_core<T>(c, sizes, x, x, x, f.data.inputs().key_padding_mask, {});
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
        if (buffer->copy_to_device(halide_cuda_device_interface()) != 0)
            throw Error("bench", "copy to the device failed");
        placed_.push_back({buffer, buffer->raw_buffer()});
        return static_cast<uintptr_t>(buffer->raw_buffer()->device);
    }

    bool on_device_;
    std::vector<std::pair<std::shared_ptr<void>, halide_buffer_t *>> placed_;  // each buffer, kept alive
    std::vector<halide_buffer_t *> outputs_;
};

// One implementation made ready on one problem: `run` does the timed work once; `error`
// says why it is not timed (it refused the shape, or its output broke the accuracy rule).
struct Prepared {
    std::function<void()> run;
    std::string error;
    double max_error = -1;  // against the reference; -1 when the problem has none
};

// Applies the accuracy rule when there is a reference (`exact` not empty): an error
// message when the output is wrong, "" otherwise.
std::string accuracy_error(Prepared &prepared, const float *actual, const std::vector<double> &exact,
                           const std::vector<float> &plain, const std::string &who) {
    if (exact.empty()) return "";
    const testing::Accuracy a = testing::check_accuracy(actual, exact, plain);
    prepared.max_error = a.max_error;
    return a.ok ? "" : a.report(who);
}

// Runs `prepared.run` once, turning a refusal into its error.
bool first_run(Prepared &prepared) {
    try {
        prepared.run();
        return true;
    } catch (const std::exception &e) {
        prepared.error = e.what();
        return false;
    }
}

// The fused layer's function.
const char *const kLayerFunction = "attention_layer";

// Why a variant's own kernels do not run `function` on the problem, or empty. Below its
// min_shapes it runs its fallback's kernels: timing those under its name would mislead.
std::string below_min_shapes(const VariantInfo &variant, const std::string &function, const Problem &p) {
    if (variant.runs_own_kernels(function, p.extents())) return "";
    return "below " + variant.name + "'s min_shapes for " + function + " (manifest.json), where it runs " +
           variant.fallback + "'s kernels";
}

Prepared fused_layer(const VariantInfo &variant, const ListedProblem &lp) {
    Prepared prepared;
    if (!variant.runnable) return {{}, "cannot run here: " + variant.not_runnable_reason};
    if (std::string below = below_min_shapes(variant, kLayerFunction, lp.problem); !below.empty()) return {{}, below};
    const Fixture &f = fixture(lp);
    const Problem &p = lp.problem;
    struct State {
        Attention layer;
        Placement place;
        std::vector<float> y;
        AttentionInputs inputs;
        MutableTensor y_view;
    };
    auto s = std::make_shared<State>(State{Attention(p.config(), f.data.weights(), variant.name),
                                           Placement(variant),
                                           std::vector<float>(f.data.x.size()),
                                           f.data.inputs(),
                                           {}});
    s->inputs.x = s->place.in(f.data.x, {p.batch, p.s_q, p.hidden});
    if (!f.data.mask.empty()) s->inputs.key_padding_mask = s->place.in(f.data.mask, {p.batch, p.s_k});
    s->y_view = s->place.out(s->y, {p.batch, p.s_q, p.hidden});
    prepared.run = [s] {
        s->layer.forward(s->inputs, s->y_view);
        s->layer.synchronize();
    };
    if (!first_run(prepared)) return prepared;
    s->place.copy_outputs_to_host();
    prepared.error = accuracy_error(prepared, s->y.data(), f.exact_y, f.float32_y, variant.name);
    return prepared;
}

// A packed problem's real tokens through forward_packed, or (`per_sequence`) each
// sequence through forward as a batch of one of its length, one after another: what the
// packing is measured against.
Prepared packed_layer(const VariantInfo &variant, const ListedProblem &lp, bool per_sequence) {
    Prepared prepared;
    if (!variant.runnable) return {{}, "cannot run here: " + variant.not_runnable_reason};
    const Fixture &f = fixture(lp);
    const Problem &p = lp.problem;
    const int64_t tokens = f.packed.tokens(), H = p.hidden;
    struct State {
        Attention layer;
        Placement place;
        std::vector<float> y;
        PackedInputs inputs;
        MutableTensor y_view;
    };
    auto s = std::make_shared<State>(State{Attention(p.config(), f.data.weights(), variant.name), Placement(variant),
                                           std::vector<float>(f.packed.x.size()), f.packed.inputs(), {}});
    s->inputs.x = s->place.in(f.packed.x, {tokens, H});
    s->y_view = s->place.out(s->y, {tokens, H});
    if (per_sequence) {
        const std::vector<int32_t> &offsets = f.packed.sequence_offsets;
        prepared.run = [s, H, offsets] {
            for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
                const int64_t start = offsets[b], length = offsets[b + 1] - start;
                if (length == 0) continue;
                AttentionInputs one;
                one.x = {s->inputs.x.data + start * H, std::size_t(length * H), {1, length, H}, s->inputs.x.memory};
                s->layer.forward(one, {s->y_view.data + start * H, std::size_t(length * H), {1, length, H},
                                       s->y_view.memory});
            }
            s->layer.synchronize();
        };
    } else {
        prepared.run = [s] {
            s->layer.forward_packed(s->inputs, s->y_view);
            s->layer.synchronize();
        };
    }
    if (!first_run(prepared)) return prepared;
    s->place.copy_outputs_to_host();
    prepared.error = accuracy_error(prepared, s->y.data(), f.exact_y, f.float32_y, variant.name);
    return prepared;
}

Prepared stage(const std::string &name, const VariantInfo &variant, const ListedProblem &lp) {
    Prepared prepared;
    if (!variant.runnable) return {{}, "cannot run here: " + variant.not_runnable_reason};
    if (std::string below = below_min_shapes(variant, name, lp.problem); !below.empty()) return {{}, below};
    Fixture &f = fixture(lp);
    const Problem &p = lp.problem;
    const Shape bsh{p.batch, p.s_q, p.hidden}, sc{p.batch, p.heads, p.s_q, p.s_k};
    const bool scores_out = name == "attention_scores" || name == "masked_softmax";
    struct State {
        Placement place;
        std::vector<float> out, k, v;
        ConstTensor x_in, scores_in, probs_in;
        MaskTensor mask;
        MutableTensor out_view, k_view, v_view;
    };
    auto s = std::make_shared<State>(State{Placement(variant),
                                           std::vector<float>(scores_out ? f.scores.size() : f.data.x.size()),
                                           std::vector<float>(f.data.x.size()), std::vector<float>(f.data.x.size())});
    s->x_in = s->place.in(f.data.x, bsh);
    if (!f.data.mask.empty()) s->mask = s->place.in(f.data.mask, {p.batch, p.s_k});
    if (name == "masked_softmax") s->scores_in = s->place.in(f.scores, sc);
    if (name == "weighted_sum") s->probs_in = s->place.in(f.probs, sc);
    s->out_view = s->place.out(s->out, scores_out ? sc : bsh);
    if (name == "qkv_projection") s->k_view = s->place.out(s->k, bsh), s->v_view = s->place.out(s->v, bsh);
    const Config c = p.config();
    // The weights where the variant reads them: a GPU user's stay on the device.
    const Shape square{p.hidden, p.hidden}, vec{p.hidden};
    const LayerWeights w{s->place.in(f.data.w_q, square), s->place.in(f.data.b_q, vec),
                         s->place.in(f.data.w_k, square), s->place.in(f.data.b_k, vec),
                         s->place.in(f.data.w_v, square), s->place.in(f.data.b_v, vec),
                         s->place.in(f.data.w_o, square), s->place.in(f.data.b_o, vec),
                         s->place.in(f.data.gamma, vec),  s->place.in(f.data.beta, vec)};
    prepared.run = [s, name, c, w, &variant] {
        if (name == "qkv_projection") {
            stages::qkv_projection(variant, c, s->x_in, s->x_in, w, s->out_view, s->k_view, s->v_view);
        } else if (name == "attention_scores") {
            stages::attention_scores(variant, c, s->x_in, s->x_in, {}, s->out_view);
        } else if (name == "masked_softmax") {
            stages::masked_softmax(variant, c, s->scores_in, s->mask, s->out_view);
        } else if (name == "weighted_sum") {
            stages::weighted_sum(variant, c, s->probs_in, s->x_in, s->out_view);
        } else if (name == "attention_core") {  // q = k = v = x, as the peers (bench/peers.py) take them
            stages::attention_core(variant, c, s->x_in, s->x_in, s->x_in, s->mask, {}, s->out_view);
        } else {
            stages::output_layernorm(variant, c, s->x_in, s->x_in, w, s->out_view);
        }
        synchronize(variant);
    };
    if (!first_run(prepared)) return prepared;
    s->place.copy_outputs_to_host();
    if (lp.reference_checked) {
        auto &[exact, plain] = f.stage_reference[name];  // Fixture is shared; cases are prepared one at a time
        if (exact.empty()) {
            exact = stage_reference<double>(name, f, p);
            plain = stage_reference<float>(name, f, p);
        }
        std::vector<float> actual = s->out;  // q, then k and v
        if (name == "qkv_projection") {
            actual.insert(actual.end(), s->k.begin(), s->k.end());
            actual.insert(actual.end(), s->v.begin(), s->v.end());
        }
        prepared.error = accuracy_error(prepared, actual.data(), exact, plain, name + " " + variant.name);
    }
    return prepared;
}

Prepared openblas_layer(bool roofline, const ListedProblem &lp) {
    const Fixture &f = fixture(lp);
    auto ws = std::make_shared<BlasWorkspace>(lp.problem);
    Prepared prepared;
    if (roofline) {
        prepared.run = [ws, &f] { openblas_roofline(Gemms::layer, f.data, *ws); };
        return prepared;
    }
    auto y = std::make_shared<std::vector<float>>(f.data.x.size());
    prepared.run = [ws, y, &f] { openblas_unfused(f.data, *ws, y->data()); };
    prepared.run();
    prepared.error = accuracy_error(prepared, y->data(), f.exact_y, f.float32_y, "openblas_unfused");
    return prepared;
}

Prepared openblas_stage(Gemms gemms, const ListedProblem &lp) {
    const Fixture &f = fixture(lp);
    auto ws = std::make_shared<BlasWorkspace>(lp.problem);
    return {[ws, gemms, &f] { openblas_roofline(gemms, f.data, *ws); }};
}

// One benchmark case: <function>/<implementation>/<problem>, made ready on demand.
struct Case {
    std::string name, function;
    const ListedProblem *problem;
    std::function<Prepared()> prepare;
};

// The stages' functions (the manifest's functions of the other generators) are timed at
// short contexts, the projections at every one; the fused layer's (kLayerFunction) on every problem.
std::vector<std::string> stage_functions() {
    std::vector<std::string> names;
    for (const manifest::Function &f : manifest::kFunctions) {
        if (std::string(f.generator) != "attention_layer") names.push_back(f.name);
    }
    return names;
}

// Every case: each variant (OpenCL ones aside: they run the GPU schedules on PoCL in
// CI, to check them; a CPU's OpenCL says nothing about a GPU) fused and by stage, and
// OpenBLAS beside them.
std::vector<Case> all_cases(const std::vector<VariantInfo> &variant_list) {
    const std::pair<const char *, Gemms> stage_peers[] = {{"qkv_projection", Gemms::qkv_projection},
                                                          {"attention_scores", Gemms::attention_scores},
                                                          {"weighted_sum", Gemms::weighted_sum},
                                                          {"output_layernorm", Gemms::output_projection}};
    std::vector<const VariantInfo *> timed;
    for (const VariantInfo &v : variant_list) {
        if (v.device != "opencl") timed.push_back(&v);
    }
    std::vector<Case> cases;
    auto add = [&](const std::string &function, const std::string &impl, const ListedProblem &lp,
                   std::function<Prepared()> prepare) {
        cases.push_back({function + "/" + impl + "/" + lp.problem.name(), function, &lp, std::move(prepare)});
    };
    for (const ListedProblem &lp : testing::problem_list()) {
        if (lp.problem.packed) {
            // Packed (the peers run the padded batch), and each variant's dense B=1 calls, one
            // sequence at a time: per_sequence_<variant>.
            for (const VariantInfo *v : timed) {
                add(kLayerFunction, v->name, lp, [v, &lp] { return packed_layer(*v, lp, false); });
                add(kLayerFunction, "per_sequence_" + v->name, lp, [v, &lp] { return packed_layer(*v, lp, true); });
            }
            continue;
        }
        for (const VariantInfo *v : timed) add(kLayerFunction, v->name, lp, [v, &lp] { return fused_layer(*v, lp); });
        add(kLayerFunction, "openblas_roofline", lp, [&lp] { return openblas_layer(true, lp); });
        add(kLayerFunction, "openblas_unfused", lp, [&lp] { return openblas_layer(false, lp); });
        const bool short_context = lp.problem.s_q <= kLongestStageSeq;
        for (const std::string &name : stage_functions()) {
            if (!short_context && !timed_at_every_length(name)) continue;
            for (const VariantInfo *v : timed) {
                add(name, v->name, lp, [name, v, &lp] { return stage(name, *v, lp); });
            }
        }
        for (const auto &[name, gemms] : stage_peers) {
            if (!short_context && !timed_at_every_length(name)) continue;
            add(name, "openblas_roofline", lp, [gemms = gemms, &lp] { return openblas_stage(gemms, lp); });
        }
    }
    return cases;
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

// --candidate=LIBRARY:SUFFIX:ISA: the functions attn_<function>_<SUFFIX> the library has.
VariantInfo load_candidate(const std::string &spec) {
    const std::size_t first = spec.find(':'), last = spec.rfind(':');
    if (first == std::string::npos || first == last) {
        throw Error("--candidate", "expected LIBRARY:SUFFIX:ISA, got '" + spec + "'");
    }
    const std::string library = spec.substr(0, first), suffix = spec.substr(first + 1, last - first - 1);
    void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) throw Error("--candidate", std::string("cannot load ") + library + ": " + dlerror());
    detail::FunctionTable functions;
    for (const manifest::Function &f : manifest::kFunctions) {
        const std::string symbol = "attn_" + std::string(f.name) + "_" + suffix;
        detail::CompiledFunction compiled;
        compiled.argv = reinterpret_cast<int (*)(void **)>(dlsym(handle, (symbol + "_argv").c_str()));
        compiled.metadata =
            reinterpret_cast<const halide_filter_metadata_t *(*)()>(dlsym(handle, (symbol + "_metadata").c_str()));
        if (compiled.argv && compiled.metadata) functions[f.name] = {compiled};
    }
    if (functions.empty()) throw Error("--candidate", library + " has no function attn_<function>_" + suffix);
    VariantInfo info;
    info.name = "candidate_" + suffix;
    info.schedule = "candidate";
    info.isa = spec.substr(last + 1);
    info.target = library;
    return detail::register_variant(info, functions);
}

std::string cpu_model() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    }
    return "unknown";
}

// The problem list, with each sequence's real length, for the Python side (bench/compare.py).
nlohmann::json problems_json() {
    nlohmann::json list = nlohmann::json::array();
    for (const ListedProblem &lp : testing::problem_list()) {
        const Problem &p = lp.problem;
        nlohmann::json lengths = nlohmann::json::array();
        for (int64_t real : lengths_of(p)) lengths.push_back(real);
        list.push_back({{"name", p.name()},
                        {"model", lp.model},
                        {"batch", p.batch},
                        {"s_q", p.s_q},
                        {"s_k", p.s_k},
                        {"hidden", p.hidden},
                        {"heads", p.heads},
                        {"causal", p.causal},
                        {"reference_checked", lp.reference_checked},
                        {"lengths", lengths},
                        {"gflop", work(kLayerFunction, p).flops * 1e-9}});
    }
    return list;
}

nlohmann::json context_json() {
    return {{"cpu_model", cpu_model()},
            {"num_cpus", std::thread::hardware_concurrency()},
            {"halide", "21.0.0"},
            {"openblas", openblas_get_config()},
            {"selected_variant", select_variant().name}};
}

// --serve: the measuring side of the interleaved comparison (bench/compare.py). Reads
// one command per line on stdin and answers each with one JSON line on stdout:
//   list                  {"context", "problems", "cases": [{"name", "function", "problem", "gflop"}]}
//   prepare <case>        makes the case ready (first run, checked against the reference, and the
//                         peak heap of a second run): {"name", "ok", "error", "max_error", "peak_bytes"}
//   time <case> <seconds> runs a prepared case for at least that long (at least once):
//                         {"ms": per-run wall time, "runs": n}
//   release               forgets every prepared case and problem fixture
// A malformed command is answered {"error": ...}; end of input ends the process.
int serve(const std::vector<Case> &cases) {
    std::map<std::string, const Case *> by_name;
    for (const Case &c : cases) by_name[c.name] = &c;
    std::map<std::string, Prepared> prepared;
    PeakMemory peak_memory;
    auto reply = [](const nlohmann::json &answer) { std::cout << answer.dump() << std::endl; };
    for (std::string line; std::getline(std::cin, line);) {
        std::istringstream words(line);
        std::string command, name;
        words >> command >> name;
        try {
            if (command == "list") {
                nlohmann::json listed = nlohmann::json::array();
                for (const Case &c : cases) {
                    listed.push_back({{"name", c.name},
                                      {"function", c.function},
                                      {"problem", c.problem->problem.name()},
                                      {"gflop", work(c.function, c.problem->problem).flops * 1e-9}});
                }
                reply({{"context", context_json()}, {"problems", problems_json()}, {"cases", listed}});
            } else if (command == "prepare") {
                auto found = by_name.find(name);
                if (found == by_name.end()) throw Error("prepare", "no case named '" + name + "'");
                Prepared p = found->second->prepare();
                nlohmann::json answer{{"name", name}, {"ok", p.error.empty()}, {"error", p.error}};
                if (p.max_error >= 0) answer["max_error"] = p.max_error;
                if (p.error.empty()) {
                    answer["peak_bytes"] = peak_memory.measure(p.run);
                    prepared[name] = std::move(p);
                }
                reply(answer);
            } else if (command == "time") {
                double seconds = 0;
                if (!(words >> seconds)) throw Error("time", "expected: time <case> <seconds>");
                auto found = prepared.find(name);
                if (found == prepared.end()) throw Error("time", "case '" + name + "' is not prepared");
                int runs = 0;
                const auto start = std::chrono::steady_clock::now();
                double elapsed = 0;
                do {
                    found->second.run();
                    ++runs;
                    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                } while (elapsed < seconds);
                reply({{"ms", elapsed * 1e3 / runs}, {"runs", runs}});
            } else if (command == "release") {
                prepared.clear();
                release_fixtures();
                reply({{"released", true}});
            } else {
                throw Error("command", "unknown command '" + command + "' (list, prepare, time, release)");
            }
        } catch (const std::exception &e) {
            reply({{"error", e.what()}});
        }
    }
    return 0;
}

}  // namespace
}  // namespace attn::bench

int main(int argc, char **argv) {
    const char *candidate_flag = "--candidate=";
    std::vector<attn::VariantInfo> variant_list = attn::variants();
    bool serve = false;
    for (int i = 1; i < argc; ++i) {
        const bool is_candidate = std::strncmp(argv[i], candidate_flag, std::strlen(candidate_flag)) == 0;
        const bool is_serve = std::strcmp(argv[i], "--serve") == 0;
        if (!is_candidate && !is_serve) continue;
        if (is_candidate) {
            try {
                variant_list.push_back(attn::bench::load_candidate(argv[i] + std::strlen(candidate_flag)));
            } catch (const attn::Error &e) {
                std::fprintf(stderr, "attn_bench: %s\n", e.what());
                return 1;
            }
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
