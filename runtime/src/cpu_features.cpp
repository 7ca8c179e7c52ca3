// Run-time ISA check. Halide 21's own multi-target dispatch does not know
// avx512_zen4, so the runtime checks the CPU itself before calling a variant.
// Each list matches the Halide target of the ISA in cmake/AttnTargets.cmake.
#include "kernels.h"

#include <map>
#include <vector>

namespace attn::detail {

namespace {

bool has(const std::string &feature) {
    __builtin_cpu_init();
    // __builtin_cpu_supports needs a literal, hence the table.
#define ATTN_FEATURE(name) \
    if (feature == name) return __builtin_cpu_supports(name);
    ATTN_FEATURE("sse4.1")
    ATTN_FEATURE("avx")
    ATTN_FEATURE("avx2")
    ATTN_FEATURE("fma")
    ATTN_FEATURE("f16c")
    ATTN_FEATURE("avx512f")
    ATTN_FEATURE("avx512cd")
    ATTN_FEATURE("avx512vl")
    ATTN_FEATURE("avx512bw")
    ATTN_FEATURE("avx512dq")
    ATTN_FEATURE("avx512ifma")
    ATTN_FEATURE("avx512vbmi")
    ATTN_FEATURE("avx512vnni")
    ATTN_FEATURE("avx512bf16")
#undef ATTN_FEATURE
    return false;
}

const std::map<std::string, std::vector<std::string>> &isa_features() {
    static const std::map<std::string, std::vector<std::string>> table = [] {
        std::map<std::string, std::vector<std::string>> t;
        t["sse41"] = {"sse4.1"};
        t["avx2"] = t["sse41"];
        t["avx2"].insert(t["avx2"].end(), {"avx", "avx2", "fma", "f16c"});
        t["avx512_skylake"] = t["avx2"];
        t["avx512_skylake"].insert(t["avx512_skylake"].end(),
                                   {"avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq"});
        t["avx512_zen4"] = t["avx512_skylake"];
        t["avx512_zen4"].insert(t["avx512_zen4"].end(),
                                {"avx512ifma", "avx512vbmi", "avx512vnni", "avx512bf16"});
        return t;
    }();
    return table;
}

}  // namespace

bool cpu_supports(const std::string &isa, std::string *missing) {
    auto it = isa_features().find(isa);
    if (it == isa_features().end()) {
        if (missing) *missing = "unknown ISA '" + isa + "'";
        return false;
    }
    std::string absent;
    for (const std::string &feature : it->second) {
        if (!has(feature)) absent += (absent.empty() ? "" : " ") + feature;
    }
    if (missing) *missing = absent.empty() ? "" : "this CPU lacks " + absent;
    return absent.empty();
}

}  // namespace attn::detail
