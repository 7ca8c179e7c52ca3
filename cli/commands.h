// The attn subcommands, each with its options as parsed by main.cpp. Each returns the
// process exit status and reports bad input by throwing attn::Error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace attn::cli {

struct VariantsOptions {
    bool json = false;
};
int list_variants(const VariantsOptions &options);

struct RunOptions {
    std::string model, input, mask, variant, output, probs;
    std::optional<int> layer;  // default: layer 0, or the checkpoint's only layer
    bool causal = false;
    bool packed = false;  // only the real tokens (Attention::forward_packed); padded rows of y are zeros
    std::optional<int64_t> heads;
    std::optional<float> eps;
    std::string precision = "fp32";   // fp32, bf16 or int8 (attn::Precision)
    bool allow_storage_only = false;  // bf16 without avx512bf16, int8 without avx512vnni: the same results without them
};
int run_layer(const RunOptions &options);

struct HeatmapOptions {
    std::string probs, tokens, out, title;
    int64_t batch = 0, head = -1, highlight_query = -1;  // head -1: every head
    bool grid = false;
};
int draw_heatmaps(const HeatmapOptions &options);

struct GenerateOptions {
    std::string target, schedule, out, generator, name_suffix;
    std::string functions;  // a regular expression; empty: every function
    int jobs = 0;          // generators run at once; 0: one per core
    bool dry_run = false;  // say what would be generated, and run nothing
};
int generate_libraries(const GenerateOptions &options);

struct BenchOptions {
    std::string problem, variants;
    int repetitions = 20;
};
int compare_variants(const BenchOptions &options);
std::string benchmark_problem_names();  // for --help

}  // namespace attn::cli
