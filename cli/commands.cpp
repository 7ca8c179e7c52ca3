// `attn variants`, `attn run` and `attn heatmap`.
#include "commands.h"

#include "attn/generated/manifest.h"

#include "checkpoint.h"
#include "heatmap.h"
#include "npy.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace attn::cli {
namespace {

// Reads a float32 tensor of the given rank; `dims` names its dimensions for messages.
std::vector<float> read_float32(const std::string &path, const std::string &argument, const Array &array,
                                const std::string &dims) {
    if (array.dtype != DType::float32) {
        throw Error(argument, path + ": expected float32 " + dims + ", got " + dtype_name(array.dtype));
    }
    return to_float32(array, argument);
}

std::vector<std::string> read_tokens(const std::string &path) {
    std::ifstream in(path);
    if (!in) throw Error("--tokens", "cannot open " + path);
    std::vector<std::string> tokens;
    for (std::string line; std::getline(in, line);) tokens.push_back(line);
    return tokens;
}

}  // namespace

// A variant's min_shapes by function: the extents below which its fallback's kernels run.
nlohmann::json min_shapes_json(const VariantInfo &v) {
    nlohmann::json shapes = nlohmann::json::object();
    for (const auto &[function, m] : v.min_shapes) {
        for (const ProblemDimension &d : kProblemDimensions) shapes[function][d.name] = m.*d.extent;
    }
    return shapes;
}

int list_variants(const VariantsOptions &options) {
    if (options.json) {
        nlohmann::json list = nlohmann::json::array();
        for (const VariantInfo &v : variants()) {
            list.push_back({{"name", v.name},
                            {"schedule", v.schedule},
                            {"isa", v.isa},
                            {"target", v.target},
                            {"device", v.device},
                            {"functions", v.functions},
                            {"bitwise_reproducible", v.bitwise_reproducible},
                            {"min_shapes", min_shapes_json(v)},
                            {"fallback", v.fallback},
                            {"runnable", v.runnable},
                            {"not_runnable_reason", v.not_runnable_reason}});
        }
        std::printf("%s\n", list.dump(2).c_str());
        return 0;
    }
    std::printf("%-26s %-6s %-14s %-9s %s\n", "variant", "device", "schedule", "runs here", "target");
    for (const VariantInfo &v : variants()) {
        std::printf("%-26s %-6s %-14s %-9s %s\n", v.name.c_str(), v.device.c_str(), v.schedule.c_str(),
                    v.runnable ? "yes" : "no", v.target.c_str());
    }
    for (const VariantInfo &v : variants()) {
        if (!v.runnable) std::printf("  %s does not run here: %s\n", v.name.c_str(), v.not_runnable_reason.c_str());
    }
    for (const VariantInfo &v : variants()) {
        const std::size_t all = std::size(manifest::kFunctions);
        if (v.functions.size() < all) {
            std::printf("  %s provides %zu of the %zu functions (see not_provided and built_for in manifest.json)\n",
                        v.name.c_str(), v.functions.size(), all);
        }
    }
    std::printf("\nselected on this machine: %s\n", default_variant_reason().c_str());
    for (const ReducedPrecision &p : kReducedPrecisions) {
        std::string names;
        for (const VariantInfo *v : precision_variants(p.precision))
            names += (names.empty() ? "" : ", ") + v->name +
                     (computes_natively(*v, p.precision) ? "" : " (without " + std::string(p.cpu_feature) + ")");
        std::printf("%s (--precision %s): %s\n", p.name, p.name, names.empty() ? "no variant in this build" : names.c_str());
    }
    return 0;
}

int run_layer(const RunOptions &options) {
    CheckpointLayer checkpoint = load_bert_layer(options.model, options.layer, options.heads, options.eps);
    checkpoint.config.causal = options.causal;
    const int64_t hidden = checkpoint.config.hidden_size;

    const std::string x_dims = "[batch, seq, " + std::to_string(hidden) + "]";
    const Array x_array = read_npy(options.input, "--input");
    if (x_array.shape.size() != 3 || x_array.shape[2] != hidden) {
        throw Error("--input", options.input + ": expected x of shape " + x_dims + " (hidden size from " +
                                   checkpoint.prefix + "), got " + x_array.shape_string());
    }
    const std::vector<float> x = read_float32(options.input, "--input", x_array, x_dims);
    const int64_t batch = x_array.shape[0], seq = x_array.shape[1];

    std::vector<uint8_t> mask;
    AttentionInputs inputs;
    inputs.x = {x.data(), x.size(), x_array.shape};
    if (!options.mask.empty()) {
        const Array mask_array = read_npy(options.mask, "--mask");
        if (mask_array.shape != Shape{batch, seq}) {
            throw Error("--mask", options.mask + ": expected shape [" + std::to_string(batch) + ", " +
                                      std::to_string(seq) + "] to match --input, got " + mask_array.shape_string());
        }
        mask = to_mask(mask_array, "--mask " + options.mask);
        inputs.key_padding_mask = {mask.data(), mask.size(), mask_array.shape};
    }

    const Precision precision = precision_from_name(options.precision, "--precision");
    const bool reduced = precision != Precision::fp32;
    if (reduced && !options.probs.empty())
        throw Error("--probs", "a " + options.precision + " layer has no probabilities output; drop --probs");
    checkpoint.config.precision = precision;
    checkpoint.config.allow_storage_only = options.allow_storage_only;
    const Attention layer = [&] {
        try {
            return Attention(checkpoint.config, checkpoint.weights(), options.variant);
        } catch (const Error &e) {
            if (e.argument() != "precision") throw;
            std::string message = std::string(e.what()).substr(e.argument().size() + 2);
            const std::string field = "config.allow_storage_only", flag = "--allow-storage-only";
            for (std::size_t at; (at = message.find(field)) != std::string::npos;) message.replace(at, field.size(), flag);
            throw Error("--precision", message);
        }
    }();
    std::vector<float> y(x.size());
    std::vector<float> probs;
    const Shape probs_shape{batch, checkpoint.config.num_heads, seq, seq};
    if (!options.probs.empty()) probs.resize(std::size_t(batch * checkpoint.config.num_heads * seq * seq));
    const auto start = std::chrono::steady_clock::now();
    if (options.packed) {
        // The real tokens only; then back to the padded layout, zeros at padding.
        const PackedBatch packed = pack(inputs.x, inputs.key_padding_mask);
        const int64_t heads = checkpoint.config.num_heads, hidden = checkpoint.config.hidden_size;
        std::vector<float> y_packed(packed.x.size()), probs_packed;
        const std::vector<int32_t> &offsets = packed.sequence_offsets;
        if (!options.probs.empty()) probs_packed.resize(std::size_t(packed_probs_size(packed.inputs().sequence_offsets, heads)));
        layer.forward_packed(packed.inputs(), view(y_packed, {packed.tokens(), hidden}),
                             options.probs.empty() ? MutableTensor{} : view(probs_packed, {int64_t(probs_packed.size())}));
        unpack(view(y_packed, {packed.tokens(), hidden}), packed.inputs().sequence_offsets,
               {y.data(), y.size(), x_array.shape});
        const float *from = probs_packed.data();
        for (std::size_t b = 0; b + 1 < offsets.size() && !options.probs.empty(); ++b) {
            const int64_t length = offsets[b + 1] - offsets[b];
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t i = 0; i < length; ++i, from += length)
                    std::copy(from, from + length, &probs[std::size_t(((int64_t(b) * heads + h) * seq + i) * seq)]);
        }
    } else {
        layer.forward(inputs, {y.data(), y.size(), x_array.shape},
                      options.probs.empty() ? MutableTensor{} : MutableTensor{probs.data(), probs.size(), probs_shape});
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

    write_npy(options.output, x_array.shape, y, "--output");
    if (!options.probs.empty()) write_npy(options.probs, probs_shape, probs, "--probs");
    std::printf(
        "%s: %s, %lld heads, eps %g%s%s%s, variant %s: x %s -> %s in %.3f ms\n",
        checkpoint.prefix.empty() ? "attention" : checkpoint.prefix.substr(0, checkpoint.prefix.size() - 1).c_str(),
        checkpoint.safetensors_path.c_str(), static_cast<long long>(checkpoint.config.num_heads),
        double(checkpoint.config.layer_norm_eps), options.causal ? ", causal" : "",
        options.mask.empty() ? "" : (options.packed ? ", key padding mask, packed" : ", key padding mask"),
        !reduced                                     ? ""
        : computes_natively(layer.variant(), precision) ? (", " + options.precision).c_str()
                                                     : (", " + options.precision + " without " +
                                                        reduced_precision(precision).cpu_feature).c_str(),
        layer.variant().name.c_str(), x_array.shape_string().c_str(),
        options.output.c_str(), ms);
    return 0;
}

int draw_heatmaps(const HeatmapOptions &options) {
    const Array array = read_npy(options.probs, "--probs");
    if (array.shape.size() != 4 || array.shape[2] <= 0 || array.shape[3] <= 0) {
        throw Error("--probs",
                    options.probs + ": expected probabilities [batch, heads, S_q, S_k], got " + array.shape_string());
    }
    const std::vector<float> probs = read_float32(options.probs, "--probs", array, "[batch, heads, S_q, S_k]");
    const int64_t batch = array.shape[0], heads = array.shape[1], s_q = array.shape[2], s_k = array.shape[3];
    if (options.batch < 0 || options.batch >= batch) {
        throw Error("--batch", std::to_string(options.batch) + " is outside [0, " + std::to_string(batch) + ")");
    }
    if (options.head < -1 || options.head >= heads) {
        throw Error("--head", std::to_string(options.head) + " is outside [0, " + std::to_string(heads) + ")");
    }
    HeatmapStyle style;
    if (!options.tokens.empty()) {
        style.tokens = read_tokens(options.tokens);
        if (int64_t(style.tokens.size()) != std::max(s_q, s_k)) {
            throw Error("--tokens", options.tokens + " has " + std::to_string(style.tokens.size()) +
                                        " lines, but the probabilities cover " + std::to_string(std::max(s_q, s_k)) +
                                        " tokens (one per line)");
        }
    }
    if (options.highlight_query >= s_q) {
        throw Error("--highlight-query",
                    std::to_string(options.highlight_query) + " is outside [0, " + std::to_string(s_q) + ")");
    }
    style.highlight_query = options.highlight_query;
    style.title = options.title;

    std::vector<HeatmapPanel> panels;
    for (int64_t h = 0; h < heads; ++h) {
        if (options.head >= 0 && h != options.head) continue;
        panels.push_back(
            {&probs[std::size_t(((options.batch * heads) + h) * s_q * s_k)], s_q, s_k, "head " + std::to_string(h)});
    }
    std::vector<std::string> written;
    struct ReleaseCaches {
        ~ReleaseCaches() { release_heatmap_caches(); }
    } release_caches_when_done;
    if (options.grid || panels.size() == 1) {
        write_heatmap_png(options.out, panels, style);
        written.push_back(options.out);
    } else {
        std::error_code ec;
        std::filesystem::create_directories(options.out, ec);
        if (ec) throw Error("--out", "cannot create directory " + options.out + ": " + ec.message());
        for (std::size_t i = 0; i < panels.size(); ++i) {
            char name[64];
            std::snprintf(name, sizeof name, "batch%lld_head%02zu.png", static_cast<long long>(options.batch), i);
            written.push_back((std::filesystem::path(options.out) / name).string());
            write_heatmap_png(written.back(), {panels[i]}, style);
        }
    }
    for (const std::string &path : written) std::printf("wrote %s\n", path.c_str());
    return 0;
}

}  // namespace attn::cli
