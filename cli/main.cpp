// attn: the command-line face of the library. Subcommands:
//   variants   every compiled variant, its target and schedule source, and whether it runs here
//   run        one attention layer of a Hugging Face BERT checkpoint on NumPy inputs
//   heatmap    PNG heatmaps of attention probabilities
//   generate   static libraries and headers for another target
//   bench      every variant on a benchmark problem, checked and timed
// Exit status: 0 on success, 1 on bad input or a failed check, CLI11's codes on bad usage.
#include "commands.h"

#include "attn/attention.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace {
// The --precision values: fp32 and every reduced precision (attn::kReducedPrecisions).
std::vector<std::string> precision_choices() {
    std::vector<std::string> names{"fp32"};
    for (const attn::ReducedPrecision &p : attn::kReducedPrecisions) names.push_back(p.name);
    return names;
}
}  // namespace

int main(int argc, char **argv) {
    using namespace attn::cli;
    CLI::App app{"attn: BERT self-attention compiled ahead of time with Halide"};
    app.require_subcommand(1);

    VariantsOptions variants;
    auto *variants_cmd = app.add_subcommand("variants", "List every compiled variant and whether this machine runs it");
    variants_cmd->add_flag("--json", variants.json, "print JSON instead of a table");

    RunOptions run;
    auto *run_cmd = app.add_subcommand("run", "Run one self-attention layer of a BERT checkpoint on x.npy");
    run_cmd->add_option("--model", run.model, "model.safetensors, or a directory with it and config.json")->required();
    run_cmd
        ->add_option("--layer", run.layer,
                     "encoder layer N (tensors [<name>.]encoder.layer.N.*; default 0); leave out for a checkpoint "
                     "of one layer")
        ->check(CLI::NonNegativeNumber);
    run_cmd->add_option("--input", run.input, "x: float32 [batch, seq, hidden] .npy")->required();
    run_cmd->add_option("--mask", run.mask, "key padding mask [batch, seq] .npy of 0/1 (bool, integer or float)");
    run_cmd->add_flag("--causal", run.causal, "decoder (causal) mask");
    run_cmd->add_flag("--packed", run.packed,
                      "compute the real tokens only (--mask's ones, right padding), packed: padded rows of the "
                      "output and padded entries of --probs are zeros");
    run_cmd->add_option("--variant", run.variant, "variant name (attn variants); default: the best this CPU runs");
    run_cmd->add_option("--output", run.output, "y: float32 [batch, seq, hidden] .npy to write")->required();
    run_cmd->add_option("--probs", run.probs, "also write the probabilities float32 [batch, heads, seq, seq] .npy");
    run_cmd->add_option("--heads", run.heads, "attention heads (default: num_attention_heads of config.json)");
    run_cmd
        ->add_option("--precision", run.precision,
                     "the projections' precision: fp32; bf16 (bf16 weights and inputs, f32 sums; vdpbf16ps where "
                     "the CPU has avx512bf16); or int8 (int8 weights per output feature, u8 inputs per token, i32 "
                     "sums; vpdpbusd where the CPU has avx512vnni); no --probs in bf16 or int8")
        ->check(CLI::IsMember(precision_choices()))
        ->capture_default_str();
    run_cmd->add_flag("--allow-storage-only", run.allow_storage_only,
                      "bf16 on a CPU without avx512bf16, or int8 without avx512vnni: compute the same results without "
                      "those instructions instead of refusing");
    // The kernels' CPU threads, for run and bench alike (attn::set_num_threads).
    int threads = 0;
    const auto threads_option = [&](CLI::App *command) {
        command->add_option("--threads", threads, "CPU threads the kernels use (default: one per CPU core)")
            ->check(CLI::Range(1, attn::kMaxThreads));
    };
    threads_option(run_cmd);
    run_cmd->add_option("--eps", run.eps, "LayerNorm epsilon (default: layer_norm_eps of config.json, else 1e-12)");

    HeatmapOptions heatmap;
    auto *heatmap_cmd = app.add_subcommand("heatmap", "Draw attention probabilities as PNG heatmaps");
    heatmap_cmd->add_option("--probs", heatmap.probs, "probabilities [batch, heads, S_q, S_k] .npy (attn run --probs)")
        ->required();
    heatmap_cmd
        ->add_option("--out", heatmap.out, "PNG file (one head, or --grid); otherwise a directory for one PNG per head")
        ->required();
    heatmap_cmd->add_option("--tokens", heatmap.tokens, "text file, one token per line, to label the axes");
    heatmap_cmd->add_option("--batch", heatmap.batch, "which sequence of the batch")->capture_default_str();
    heatmap_cmd->add_option("--head", heatmap.head, "one head only (default: every head)");
    heatmap_cmd->add_flag("--grid", heatmap.grid, "all heads in one image");
    heatmap_cmd->add_option("--highlight-query", heatmap.highlight_query, "outline this query's row");
    heatmap_cmd->add_option("--title", heatmap.title, "title above the heatmaps");

    GenerateOptions generate;
    auto *generate_cmd = app.add_subcommand("generate", "Generate static libraries and headers for another target");
    generate_cmd->add_option("--target", generate.target, "Halide target, e.g. x86-64-linux-avx2-fma, arm-64-linux")
        ->required();
    generate_cmd
        ->add_option("--schedule", generate.schedule,
                     "schedule source: manual (hand-written) or an autoscheduler's (attn variants lists them)")
        ->required();
    generate_cmd->add_option("--out", generate.out, "output directory")->required();
    generate_cmd->add_option("--generator", generate.generator,
                             "path of attn_generators (default: found automatically)");
    generate_cmd->add_option("--functions", generate.functions,
                             "only the functions whose name matches this regular expression (--dry-run lists "
                             "them; default: every one)");
    generate_cmd->add_option("--jobs", generate.jobs, "generators to run at once (default: one per core)")
        ->check(CLI::PositiveNumber);
    generate_cmd->add_option("--name-suffix", generate.name_suffix,
                             "suffix of the function names (default: the target, as an identifier)");
    generate_cmd->add_flag("--dry-run", generate.dry_run, "say what would be generated, and generate nothing");

    BenchOptions bench;
    auto *bench_cmd =
        app.add_subcommand("bench", "Run every variant on a problem, check it against the reference, time it");
    bench_cmd->add_option("--problem", bench.problem, "benchmark problem: " + benchmark_problem_names());
    bench_cmd->add_option("--variants", bench.variants, "only variants whose name matches this regular expression");
    bench_cmd
        ->add_option("--rounds,--repetitions", bench.repetitions,
                     "interleaved rounds, each timing every variant once (medians reported)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    threads_option(bench_cmd);

    CLI11_PARSE(app, argc, argv);
    if (threads) attn::set_num_threads(threads);
    const std::string command = app.get_subcommands().front()->get_name();
    try {
        if (*variants_cmd) return list_variants(variants);
        if (*run_cmd) return run_layer(run);
        if (*heatmap_cmd) return draw_heatmaps(heatmap);
        if (*generate_cmd) return generate_libraries(generate);
        if (*bench_cmd) return compare_variants(bench);
    } catch (const attn::Error &e) {
        std::fprintf(stderr, "attn %s: error: %s\n", command.c_str(), e.what());
        return 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "attn %s: error: %s\n", command.c_str(), e.what());
        return 1;
    }
    return 1;
}
