// `attn bench` (and the README's main job): every variant on one problem, by default a
// BERT-base layer (B=1, S=128, H=768, 12 heads, padded), each checked against the
// double reference, timed, and tabulated.
#include "commands.h"
#include "problems/problem.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <regex>

namespace attn::cli {
using namespace attn::testing;
namespace {

// The main job's problem: BERT-base (B=1, S=128, H=768, 12 heads) with a padding mask.
Problem default_problem() {
    Problem bert_base;
    bert_base.mask = Mask::padding;
    return bert_base;
}

Problem find_problem(const std::string &name) {
    if (name.empty() || name == default_problem().name()) return default_problem();
    for (const ListedProblem &listed : problem_list()) {
        if (listed.problem.name() == name) return listed.problem;
    }
    throw Error("--problem", "unknown problem '" + name + "'; known: " + benchmark_problem_names());
}

}  // namespace

std::string benchmark_problem_names() {
    std::string names = default_problem().name();
    for (const ListedProblem &listed : problem_list()) names += ", " + listed.problem.name();
    return names;
}

int compare_variants(const BenchOptions &options) {
    const Problem problem = find_problem(options.problem);
    std::regex variant_filter;
    try {
        variant_filter = std::regex(options.variants.empty() ? ".*" : options.variants);
    } catch (const std::regex_error &e) {
        throw Error("--variants", "'" + options.variants + "' is not a regular expression: " + e.what());
    }
    const int rounds = options.repetitions;
    const int threads = num_threads();
    std::printf("problem %s, %d interleaved rounds (each runs every variant once, in a rotating order), %s\n",
                problem.name().c_str(), rounds,
                threads ? ("kernels on " + std::to_string(threads) + " threads").c_str()
                        : "kernels on one thread per CPU core");
    const LayerData data(problem);
    // A packed problem runs its real tokens through forward_packed, the rest the padded batch.
    const PackedBatch packed = problem.packed ? data.packed() : PackedBatch{};
    const Config config = problem.config();
    const std::vector<double> exact_y =
        problem.packed ? reference::attention_layer_packed<double>(config, data.weights(), packed.inputs()).y
                       : reference::attention_layer<double>(config, data.weights(), data.inputs()).y;
    const std::vector<float> float32_y =
        problem.packed ? reference::attention_layer_packed<float>(config, data.weights(), packed.inputs()).y
                       : reference::attention_layer<float>(config, data.weights(), data.inputs()).y;

    struct Row {
        std::string name, status, skip_reason;
        double max_error = 0, tolerance = 0;
        bool on_cpu = true;
        bool reduced = false;  // <variant>_bf16, _int8: a reduced precision, never the "best" the others are compared with
        std::unique_ptr<Attention> layer;
        std::vector<double> ms;  // one per round
    };
    std::vector<Row> rows;
    std::vector<float> y(exact_y.size());
    const auto y_view = problem.packed ? view(y, {packed.tokens(), problem.hidden})
                                       : view(y, {problem.batch, problem.s_q, problem.hidden});
    auto forward = [&](const Attention &layer) {
        if (problem.packed) {
            layer.forward_packed(packed.inputs(), y_view);
        } else {
            layer.forward(data.inputs(), y_view);
        }
    };
    bool all_ok = true;
    // Each variant runs once first (a warm-up) and is checked against the reference.
    for (const VariantInfo &variant : variants()) {
        if (!std::regex_search(variant.name, variant_filter)) continue;
        // (an ISA built for reduced precisions only has no fp32 layer to compare)
        if (!variant.provides("attention_layer")) continue;
        Row row{variant.name};
        row.on_cpu = variant.device == "cpu";
        if (!variant.runnable) {
            row.status = "skipped", row.skip_reason = variant.not_runnable_reason;
            rows.push_back(std::move(row));
            continue;
        }
        row.layer = std::make_unique<Attention>(problem.config(), data.weights(), variant.name);
        try {
            forward(*row.layer);
        } catch (const Error &e) {  // an autoscheduled variant may refuse a shape smaller than its tiles
            row.status = "refused", row.skip_reason = e.what();
            rows.push_back(std::move(row));
            continue;
        }
        const Accuracy a = check_accuracy(y.data(), exact_y, float32_y);
        row.status = a.ok ? "ok" : "WRONG", row.max_error = a.max_error, row.tolerance = a.tolerance;
        all_ok = all_ok && a.ok;
        if (!a.ok) std::fprintf(stderr, "%s\n", a.report(variant.name).c_str());
        rows.push_back(std::move(row));
    }
    // The layer in bf16 and int8 (Precision::bf16, int8), for each variant with such a layer,
    // checked against the references of the same rounding or quantization (and their
    // allowance: reference::context_allowance).
    for (const ReducedPrecision &p : kReducedPrecisions) {
        Config config = problem.config();
        config.precision = p.precision;
        config.allow_storage_only = true;  // a named variant runs as built; the row says so below
        std::vector<double> reduced_exact;
        std::vector<float> reduced_float32;
        std::vector<double> allowance;
        for (const VariantInfo *variant : precision_variants(p.precision)) {
            Row row{variant->name + "_" + p.name};
            row.reduced = true;
            if (!std::regex_search(row.name, variant_filter)) continue;
            if (!variant->runnable) {
                row.status = "skipped", row.skip_reason = variant->not_runnable_reason;
                rows.push_back(std::move(row));
                continue;
            }
            if (reduced_exact.empty()) {
                if (problem.packed) {
                    auto exact = reference::attention_layer_packed<double>(config, data.weights(), packed.inputs());
                    reduced_exact = std::move(exact.y), allowance = std::move(exact.allowance);
                    reduced_float32 = reference::attention_layer_packed<float>(config, data.weights(), packed.inputs()).y;
                } else {
                    auto exact = reference::attention_layer<double>(config, data.weights(), data.inputs());
                    auto plain = reference::attention_layer<float>(config, data.weights(), data.inputs());
                    allowance = reference::context_allowance(config, data.weights(), data.inputs(), exact, plain);
                    reduced_exact = std::move(exact.y), reduced_float32 = std::move(plain.y);
                }
            }
            row.layer = std::make_unique<Attention>(config, data.weights(), variant->name);
            if (!computes_natively(*variant, p.precision))
                row.skip_reason = std::string("without ") + p.cpu_feature + " (its ISA lacks it): " + p.without_feature;
            forward(*row.layer);
            const Accuracy a = check_accuracy(y.data(), reduced_exact, reduced_float32, allowance);
            row.status = a.ok ? "ok" : "WRONG", row.max_error = a.max_error, row.tolerance = a.tolerance;
            all_ok = all_ok && a.ok;
            if (!a.ok) std::fprintf(stderr, "%s\n", a.report(row.name).c_str());
            rows.push_back(std::move(row));
        }
    }
    std::vector<Row *> timed;
    for (Row &r : rows) {
        if (r.status == "ok") timed.push_back(&r);
    }
    for (int round = 0; round < rounds; ++round) {
        for (std::size_t n = 0; n < timed.size(); ++n) {
            Row &r = *timed[(n + std::size_t(round)) % timed.size()];
            const auto start = std::chrono::steady_clock::now();
            forward(*r.layer);
            r.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
        }
    }
    // "vs best": paired, round by round, against the CPU variant of lowest median (a GPU
    // variant's time here includes host-device copies).
    const Row *best = nullptr;
    // Passes: fp32 CPU variants; any fp32 one, when none is a CPU one; any, when only bf16 or int8 ran.
    for (int pass = 0; pass < 3 && !best; ++pass) {
        for (const Row *r : timed) {
            if ((pass == 2 || !r->reduced) && (pass > 0 || r->on_cpu) && (!best || median(r->ms) < median(best->ms)))
                best = r;
        }
    }
    std::printf("\n%-26s %-8s %10s %10s %10s %7s  %s\n", "variant", "status", "max error", "tolerance", "median ms",
                "spread", "vs best [interval]");
    for (const Row &r : rows) {
        if (r.ms.empty()) {
            std::printf("%-26s %-8s %10s %10s %10s %7s  %s\n", r.name.c_str(), r.status.c_str(),
                        r.status == "WRONG" ? "" : "-", "-", "-", "-", "-");
            continue;
        }
        const double ms = median(r.ms);
        const double spread =
            100 * (*std::max_element(r.ms.begin(), r.ms.end()) - *std::min_element(r.ms.begin(), r.ms.end())) / ms;
        std::vector<double> ratios;
        for (std::size_t i = 0; i < r.ms.size(); ++i) ratios.push_back(r.ms[i] / best->ms[i]);
        const auto [lo, hi] = median_interval(ratios);
        char vs[64];
        std::snprintf(vs, sizeof vs, "%.2fx [%.2f, %.2f]%s", median(ratios), lo, hi,
                      &r == best ? "" : (lo <= 1 && 1 <= hi ? " within noise" : ""));
        std::printf("%-26s %-8s %10.3g %10.3g %10.3f %6.0f%%  %s\n", r.name.c_str(), r.status.c_str(), r.max_error,
                    r.tolerance, ms, spread, &r == best ? "best" : vs);
    }
    for (const Row &r : rows) {
        if (!r.skip_reason.empty())
            std::printf("  %s %s: %s\n", r.name.c_str(), r.status.c_str(), r.skip_reason.c_str());
    }
    std::printf(
        "\nTimes are medians over the rounds; spread is (max - min) / median. \"vs best\" is time / the\n"
        "fastest CPU variant's time, taken round by round: the median, and in brackets an interval\n"
        "holding the median with at least 90%% confidence. GPU variants are given host memory here, so\n"
        "their times include the copies to and from the device (tools/gpu_machine.sh bench times them on\n"
        "device memory); OpenCL variants run on this machine's OpenCL, which may be a CPU (PoCL).\n"
        "<variant>_bf16 and <variant>_int8 are the layer with its projections in bf16 or int8 (and\n"
        "its core's products in bf16)\n"
        "(--precision), checked against the reference of the same rounding or quantization, and\n"
        "compared with the fastest fp32 CPU variant.\n");
    std::printf("\nselected on this machine: %s\n", select_variant().name.c_str());
    return all_ok ? 0 : 1;
}

}  // namespace attn::cli
