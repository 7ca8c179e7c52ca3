// The main job: every variant on one BERT-base layer (B=1, S=128, H=768, 12 heads,
// padded), each checked against the double reference, timed, and tabulated.
// Usage: attn_compare [--repetitions N]
#include "support/problem.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>

using namespace attn;
using namespace attn::testing;

int main(int argc, char **argv) {
    CLI::App app{"Run every attn variant on a BERT-base layer and compare it with the reference"};
    int repetitions = 20;
    app.add_option("--repetitions", repetitions, "timed runs per variant (median reported)")->check(CLI::PositiveNumber);
    CLI11_PARSE(app, argc, argv);

    Problem problem;  // BERT-base: B=1, S=128, H=768, 12 heads
    problem.mask = Mask::padding;
    const LayerData data(problem);
    std::printf("problem %s (seeded padding mask), %d timed runs per variant\n", problem.name().c_str(), repetitions);
    const auto exact = reference::attention_layer<double>(problem.config(), data.weights(), data.inputs());
    const auto float32 = reference::attention_layer<float>(problem.config(), data.weights(), data.inputs());

    std::printf("\n%-24s %-8s %12s %12s %12s %10s\n", "variant", "status", "max error", "tolerance", "median ms",
                "vs best");
    struct Row {
        std::string name, status, skip_reason;
        double max_error = 0, tolerance = 0, ms = 0;
    };
    std::vector<Row> rows;
    bool all_ok = true;
    for (const VariantInfo &variant : variants()) {
        if (!variant.runnable) {
            rows.push_back({variant.name, "skipped", variant.not_runnable_reason});
            continue;
        }
        Attention layer(problem.config(), data.weights(), variant.name);
        std::vector<float> y(exact.y.size());
        auto y_view = view(y, {problem.batch, problem.s_q, problem.hidden});
        layer.forward(data.inputs(), y_view);  // warm-up, and the output checked
        const Accuracy a = check_accuracy(y.data(), exact.y, float32.y);
        std::vector<double> ms;
        for (int r = 0; r < repetitions; ++r) {
            const auto start = std::chrono::steady_clock::now();
            layer.forward(data.inputs(), y_view);
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
        }
        rows.push_back({variant.name, a.ok ? "ok" : "WRONG", "", a.max_error, a.tolerance, median(ms)});
        all_ok = all_ok && a.ok;
        if (!a.ok) std::fprintf(stderr, "%s\n", a.report(variant.name).c_str());
    }
    double best = 0;
    for (const Row &r : rows) {
        if (r.status == "ok" && (best == 0 || r.ms < best)) best = r.ms;
    }
    for (const Row &r : rows) {
        if (r.status == "skipped") {
            std::printf("%-24s %-8s %12s %12s %12s %10s\n", r.name.c_str(), "skipped", "-", "-", "-", "-");
        } else {
            std::printf("%-24s %-8s %12.3g %12.3g %12.3f %9.2fx\n", r.name.c_str(), r.status.c_str(), r.max_error,
                        r.tolerance, r.ms, r.ms / best);
        }
    }
    for (const Row &r : rows) {
        if (!r.skip_reason.empty()) std::printf("  %s skipped: %s\n", r.name.c_str(), r.skip_reason.c_str());
    }
    std::printf("\nselected on this machine: %s\n", select_variant().name.c_str());
    return all_ok ? 0 : 1;
}
