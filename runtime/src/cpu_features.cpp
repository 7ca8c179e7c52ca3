// Run-time ISA check. Halide 21's own multi-target dispatch does not know
// avx512_zen4, so the runtime checks the CPU itself before calling a variant, against
// the features manifest.json lists for the ISA.
#include "attn/generated/manifest.h"
#include "attn/internal.h"

namespace attn::detail {

namespace {

bool has(const std::string &feature) {
    __builtin_cpu_init();
    // __builtin_cpu_supports needs a literal: one test per feature of the manifest.
#define ATTN_FEATURE(name) \
    if (feature == name) return __builtin_cpu_supports(name);
    ATTN_FOR_EACH_CPU_FEATURE(ATTN_FEATURE)
#undef ATTN_FEATURE
    return false;
}

}  // namespace

bool cpu_supports(const std::string &isa, std::string *missing) {
    for (const manifest::Isa &i : manifest::kIsas) {
        if (isa != i.name) continue;
        if (i.cross_compiled) {
            if (missing) *missing = "'" + isa + "' is cross-compiled, never linked here";
            return false;
        }
        std::string absent;
        for (const char *feature : i.cpu_features) {
            if (!has(feature)) absent += (absent.empty() ? "" : " ") + std::string(feature);
        }
        if (missing) *missing = absent.empty() ? "" : "this CPU lacks " + absent;
        return absent.empty();
    }
    if (missing) *missing = "unknown ISA '" + isa + "'";
    return false;
}

}  // namespace attn::detail
