#include "checkpoint.h"

#include "safetensors.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <regex>
#include <set>

namespace attn::cli {
namespace fs = std::filesystem;
namespace {

constexpr const char *kModelArg = "--model";

nlohmann::json read_config(const std::string &path) {
    const std::string text = read_file(path, kModelArg);
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception &e) {
        throw Error(kModelArg, path + ": malformed JSON: " + e.what());
    }
}

// The attention modules in the file: the prefixes P of the tensors named
// P + "self.query.weight", where P is "<any>encoder.layer.N.attention." (a model),
// "layer.N.attention." (an encoder), "attention." (one BertLayer) or "" (one
// BertAttention), by layer index N; kNoIndex for a module without one.
constexpr int kNoIndex = -1;
std::map<int, std::set<std::string>> attention_modules(const SafetensorsFile &file) {
    static const std::regex query(R"(^((?:.*\.)?attention\.)?self\.query\.weight$)");
    static const std::regex indexed(R"((?:^|\.)layer\.(\d{1,8})\.attention\.$)");
    std::map<int, std::set<std::string>> modules;
    std::smatch m, index;
    for (const auto &[name, array] : file.tensors()) {
        if (!std::regex_match(name, m, query)) continue;
        const std::string prefix = m[1];
        modules[std::regex_search(prefix, index, indexed) ? std::stoi(index[1]) : kNoIndex].insert(prefix);
    }
    return modules;
}

std::string quoted_list(const std::set<std::string> &names) {
    std::string list;
    for (const std::string &n : names) list += (list.empty() ? "'" : ", '") + n + "'";
    return list;
}

std::vector<float> load_tensor(const SafetensorsFile &file, const std::string &name, const Shape &shape) {
    const Array &array = file.tensor(name);
    if (array.shape != shape) {
        throw Error(kModelArg, file.path() + ": tensor '" + name + "' has shape " + array.shape_string() +
                                   ", expected " + shape_string(shape));
    }
    return to_float32(array, std::string(kModelArg) + " tensor '" + name + "'");
}

}  // namespace

LayerWeights CheckpointLayer::weights() const {
    const int64_t h = config.hidden_size;
    LayerWeights w;
    w.w_q = {w_q.data(), w_q.size(), {h, h}};
    w.w_k = {w_k.data(), w_k.size(), {h, h}};
    w.w_v = {w_v.data(), w_v.size(), {h, h}};
    w.w_o = {w_o.data(), w_o.size(), {h, h}};
    w.b_q = {b_q.data(), b_q.size(), {h}};
    w.b_k = {b_k.data(), b_k.size(), {h}};
    w.b_v = {b_v.data(), b_v.size(), {h}};
    w.b_o = {b_o.data(), b_o.size(), {h}};
    w.gamma = {gamma.data(), gamma.size(), {h}};
    w.beta = {beta.data(), beta.size(), {h}};
    return w;
}

CheckpointLayer load_bert_layer(const std::string &model_path, std::optional<int> layer, std::optional<int64_t> heads,
                                std::optional<float> eps) {
    CheckpointLayer out;
    std::error_code ec;
    if (fs::is_directory(model_path, ec)) {
        const fs::path dir(model_path);
        out.safetensors_path = (dir / "model.safetensors").string();
        if (!fs::exists(out.safetensors_path, ec)) {
            if (fs::exists(dir / "model.safetensors.index.json", ec)) {
                throw Error(kModelArg, "directory " + model_path +
                                           " holds a sharded checkpoint (model.safetensors.index.json): pass the "
                                           "shard that holds the layer, --model " +
                                           model_path + "/<shard>.safetensors (the index's weight_map names it)");
            }
            if (fs::exists(dir / "pytorch_model.bin", ec)) {
                throw Error(kModelArg,
                            "directory " + model_path +
                                " holds pytorch_model.bin (a PyTorch pickle), which attn does not read; "
                                "save the model as safetensors (save_pretrained(dir, safe_serialization=True))");
            }
            throw Error(kModelArg, "directory " + model_path + " has no model.safetensors");
        }
    } else if (fs::exists(model_path, ec)) {
        out.safetensors_path = model_path;
    } else {
        throw Error(kModelArg, model_path + " does not exist");
    }
    const fs::path config_path = fs::path(out.safetensors_path).parent_path() / "config.json";
    if (fs::exists(config_path, ec)) out.config_path = config_path.string();

    const SafetensorsFile file(out.safetensors_path, kModelArg);
    const auto modules = attention_modules(file);
    if (modules.empty()) {
        throw Error(kModelArg, out.safetensors_path +
                                   ": no BERT attention layers (no tensor named like "
                                   "'encoder.layer.N.attention.self.query.weight', 'attention.self.query.weight' "
                                   "or 'self.query.weight')");
    }
    const bool indexed = modules.rbegin()->first != kNoIndex;
    // Without --layer: layer 0 of a model or encoder, else the one module without an index.
    const int wanted = layer ? *layer : indexed ? 0 : kNoIndex;
    const auto found = modules.find(wanted);
    if (found == modules.end()) {
        if (!indexed) {  // then --layer was given: without it, the module without a number is found
            throw Error("--layer", std::to_string(wanted) + " given, but " + out.safetensors_path +
                                       " holds one attention layer without a layer number (" +
                                       quoted_list(modules.at(kNoIndex)) + "); leave --layer out");
        }
        const std::string range =
            std::to_string(modules.upper_bound(kNoIndex)->first) + " to " + std::to_string(modules.rbegin()->first);
        if (!layer) {
            throw Error(kModelArg,
                        out.safetensors_path + " has no layer 0 (its layers are " + range + "): name one with --layer");
        }
        throw Error("--layer", std::to_string(wanted) + " is not in the checkpoint, which has layers " + range);
    }
    if (found->second.size() > 1) {
        throw Error(kModelArg, out.safetensors_path + ": " +
                                   (wanted == kNoIndex ? "the attention layer" : "layer " + std::to_string(wanted)) +
                                   " is ambiguous, found under " + quoted_list(found->second));
    }
    out.prefix = *found->second.begin();

    const std::string self = out.prefix + "self.", output = out.prefix + "output.";
    const Array &query = file.tensor(self + "query.weight");
    if (query.shape.size() != 2 || query.shape[0] != query.shape[1]) {
        throw Error(kModelArg, out.safetensors_path + ": tensor '" + self + "query.weight' has shape " +
                                   query.shape_string() + ", expected [hidden, hidden]");
    }
    const int64_t h = query.shape[0];
    out.config.hidden_size = h;

    nlohmann::json config;
    if (!out.config_path.empty()) config = read_config(out.config_path);
    auto config_number = [&](const char *key) -> std::optional<double> {
        if (!config.is_object() || !config.contains(key)) return std::nullopt;
        if (!config[key].is_number()) {
            throw Error(kModelArg, out.config_path + ": '" + key + "' is " + config[key].dump() + ", not a number");
        }
        return config[key].get<double>();
    };
    if (const auto hidden = config_number("hidden_size"); hidden && int64_t(*hidden) != h) {
        throw Error(kModelArg, out.config_path + ": hidden_size " + std::to_string(int64_t(*hidden)) +
                                   " disagrees with the checkpoint's " + std::to_string(h));
    }
    if (heads) {
        out.config.num_heads = *heads;
    } else if (const auto n = config_number("num_attention_heads")) {
        out.config.num_heads = int64_t(*n);
    } else {
        throw Error("--heads", "not given, and " + (out.config_path.empty()
                                                        ? "there is no config.json beside " + out.safetensors_path
                                                        : out.config_path + " has no num_attention_heads"));
    }
    if (eps) {
        out.config.layer_norm_eps = *eps;
    } else if (const auto e = config_number("layer_norm_eps")) {
        out.config.layer_norm_eps = float(*e);
    } else {
        out.config.layer_norm_eps = 1e-12f;  // BERT's default
    }

    out.w_q = load_tensor(file, self + "query.weight", {h, h});
    out.b_q = load_tensor(file, self + "query.bias", {h});
    out.w_k = load_tensor(file, self + "key.weight", {h, h});
    out.b_k = load_tensor(file, self + "key.bias", {h});
    out.w_v = load_tensor(file, self + "value.weight", {h, h});
    out.b_v = load_tensor(file, self + "value.bias", {h});
    out.w_o = load_tensor(file, output + "dense.weight", {h, h});
    out.b_o = load_tensor(file, output + "dense.bias", {h});
    const bool old_names = !file.contains(output + "LayerNorm.weight") && file.contains(output + "LayerNorm.gamma");
    out.gamma = load_tensor(file, output + (old_names ? "LayerNorm.gamma" : "LayerNorm.weight"), {h});
    out.beta = load_tensor(file, output + (old_names ? "LayerNorm.beta" : "LayerNorm.bias"), {h});
    return out;
}

}  // namespace attn::cli
