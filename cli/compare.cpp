// `attn bench` (and the README's main job): every variant on one problem, by default a
// BERT-base layer (B=1, S=128, H=768, 12 heads, padded), each checked against the
// double reference, timed, and tabulated.
#include "commands.h"
#include "support/problem.h"

#include <chrono>
#include <cstdio>
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
    const int repetitions = options.repetitions;
    std::printf("problem %s, %d timed runs per variant\n", problem.name().c_str(), repetitions);
    const LayerData data(problem);
    const auto exact = reference::attention_layer<double>(problem.config(), data.weights(), data.inputs());
    const auto float32 = reference::attention_layer<float>(problem.config(), data.weights(), data.inputs());

    std::printf("\n%-26s %-8s %12s %12s %12s %10s\n", "variant", "status", "max error", "tolerance", "median ms",
                "vs best");
    struct Row {
        std::string name, status, skip_reason;
        double max_error = 0, tolerance = 0, ms = 0;
        bool on_cpu = true;
    };
    std::vector<Row> rows;
    bool all_ok = true;
    for (const VariantInfo &variant : variants()) {
        if (!std::regex_search(variant.name, variant_filter)) continue;
        if (!variant.runnable) {
            rows.push_back({variant.name, "skipped", variant.not_runnable_reason});
            continue;
        }
        Attention layer(problem.config(), data.weights(), variant.name);
        std::vector<float> y(exact.y.size());
        auto y_view = view(y, {problem.batch, problem.s_q, problem.hidden});
        try {
            layer.forward(data.inputs(), y_view);  // warm-up, and the output checked
        } catch (const Error &e) {                 // an autoscheduled variant may refuse a shape smaller than its tiles
            rows.push_back({variant.name, "refused", e.what()});
            continue;
        }
        const Accuracy a = check_accuracy(y.data(), exact.y, float32.y);
        std::vector<double> ms;
        for (int r = 0; r < repetitions; ++r) {
            const auto start = std::chrono::steady_clock::now();
            layer.forward(data.inputs(), y_view);
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
        }
        rows.push_back({variant.name, a.ok ? "ok" : "WRONG", "", a.max_error, a.tolerance, median(ms),
                        variant.device == "cpu"});
        all_ok = all_ok && a.ok;
        if (!a.ok) std::fprintf(stderr, "%s\n", a.report(variant.name).c_str());
    }
    double best = 0;  // of the CPU variants: a GPU variant's time here includes host-device copies
    for (const Row &r : rows) {
        if (r.status == "ok" && r.on_cpu && (best == 0 || r.ms < best)) best = r.ms;
    }
    for (const Row &r : rows) {
        if (r.status == "skipped" || r.status == "refused") {
            std::printf("%-26s %-8s %12s %12s %12s %10s\n", r.name.c_str(), r.status.c_str(), "-", "-", "-", "-");
        } else {
            std::printf("%-26s %-8s %12.3g %12.3g %12.3f %9.2fx\n", r.name.c_str(), r.status.c_str(), r.max_error,
                        r.tolerance, r.ms, r.ms / best);
        }
    }
    for (const Row &r : rows) {
        if (!r.skip_reason.empty())
            std::printf("  %s %s: %s\n", r.name.c_str(), r.status.c_str(), r.skip_reason.c_str());
    }
    std::printf("\n\"vs best\" is against the fastest CPU variant. GPU variants are given host memory here, so\n"
                "their times include the copies to and from the device (tools/bench_gpu.sh times them on\n"
                "device memory); OpenCL variants run on this machine's OpenCL, which may be a CPU (PoCL).\n");
    std::printf("\nselected on this machine: %s\n", select_variant().name.c_str());
    return all_ok ? 0 : 1;
}

}  // namespace attn::cli
