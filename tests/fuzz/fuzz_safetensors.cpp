// libFuzzer target: the safetensors reader on arbitrary bytes, then every tensor's
// conversion to float32. Any outcome but a value or an attn::Error is a finding.
#include "safetensors.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, std::size_t size) {
    try {
        const attn::cli::SafetensorsFile file("fuzz.safetensors", "--model",
                                              std::string(reinterpret_cast<const char *>(data), size));
        for (const auto &[name, array] : file.tensors()) {
            try {
                (void)attn::cli::to_float32(array, name);
            } catch (const attn::Error &) {
            }
        }
    } catch (const attn::Error &) {
    }
    return 0;
}
