// libFuzzer target: the NumPy .npy reader on arbitrary bytes, then both conversions the
// command line applies (float32 for x, 0/1 for a mask). Any outcome but a value or an
// attn::Error (a crash, a sanitizer report, another exception) is a finding.
#include "npy.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, std::size_t size) {
    try {
        const attn::cli::Array array =
            attn::cli::parse_npy(std::string(reinterpret_cast<const char *>(data), size), "fuzz.npy", "--input");
        try {
            (void)attn::cli::to_float32(array, "--input");
        } catch (const attn::Error &) {
        }
        (void)attn::cli::to_mask(array, "--mask");
    } catch (const attn::Error &) {
    }
    return 0;
}
