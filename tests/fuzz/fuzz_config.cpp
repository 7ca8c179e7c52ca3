// libFuzzer target: a checkpoint's config.json. The input becomes the config.json beside
// a valid one-layer checkpoint (hidden 4), which is then loaded as `attn run` loads it.
// Any outcome but a loaded layer or an attn::Error is a finding.
#include "checkpoint.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace {

// A safetensors file of one BertLayer's attention tensors, all float32 zeros.
std::string one_layer_checkpoint() {
    const int h = 4;
    std::string header = "{", data;
    auto add = [&](const std::string &name, bool matrix) {
        const std::size_t bytes = std::size_t(matrix ? h * h : h) * 4;
        header += std::string(header.size() > 1 ? "," : "") + "\"attention." + name +
                  "\":{\"dtype\":\"F32\",\"shape\":" + (matrix ? "[4,4]" : "[4]") + ",\"data_offsets\":[" +
                  std::to_string(data.size()) + "," + std::to_string(data.size() + bytes) + "]}";
        data.append(bytes, '\0');
    };
    for (const char *name : {"self.query", "self.key", "self.value", "output.dense"}) {
        add(std::string(name) + ".weight", true);
        add(std::string(name) + ".bias", false);
    }
    add("output.LayerNorm.weight", false);
    add("output.LayerNorm.bias", false);
    header += "}";
    std::string file(8, '\0');
    const uint64_t length = header.size();
    for (int i = 0; i < 8; ++i) file[std::size_t(i)] = char((length >> (8 * i)) & 0xff);
    return file + header + data;
}

const std::string &model_dir() {
    static const std::string dir = [] {
        char pattern[] = "/tmp/attn_fuzz_config_XXXXXX";
        const std::string d = mkdtemp(pattern);
        std::ofstream(d + "/model.safetensors", std::ios::binary) << one_layer_checkpoint();
        return d;
    }();
    return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, std::size_t size) {
    const std::string &dir = model_dir();
    std::ofstream(dir + "/config.json", std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char *>(data), std::streamsize(size));
    try {
        (void)attn::cli::load_bert_layer(dir, std::nullopt, std::nullopt, std::nullopt);
    } catch (const attn::Error &) {
    }
    return 0;
}
