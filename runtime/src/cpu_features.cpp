// Run-time ISA check. Halide 21's own multi-target dispatch does not know
// avx512_zen4, so the runtime checks the CPU itself before calling a variant, against
// the features manifest.json lists for the ISA.
#include "attn/generated/manifest.h"
#include "attn/internal.h"

#include <fstream>
#include <string>

#if defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#elif defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace attn::detail {

namespace {

#if defined(__x86_64__)
// AMX's tile data is an XSAVE state Linux (5.16 and later) gives a process only on request:
// without it the first tile instruction faults. Halide 21's runtime does not ask (Halide's
// pull request 9199 does, after 21), so the runtime asks, once, when it checks an ISA whose
// features include AMX's on a CPU that has AMX; the grant holds for every thread of the
// process (and from then on Linux wants alternate signal stacks large enough for the tiles).
bool amx_granted() {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    static const bool granted = __builtin_cpu_supports("amx-tile") &&
                                syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
    return granted;
}

bool is_amx(const std::string &feature) { return feature.rfind("amx-", 0) == 0; }

bool has(const std::string &feature) {
    __builtin_cpu_init();
    if (is_amx(feature) && !amx_granted()) return false;
    // __builtin_cpu_supports needs a literal: one test per feature of the manifest.
#define ATTN_FEATURE(name) \
    if (feature == name) return __builtin_cpu_supports(name);
    ATTN_FOR_EACH_CPU_FEATURE(ATTN_FEATURE)
#undef ATTN_FEATURE
    return false;
}

// Why AMX is missing when the CPU has it: Linux refused the tile state ("" otherwise).
std::string refused(const std::string &absent) {
    __builtin_cpu_init();
    if (absent.find("amx-") == std::string::npos || !__builtin_cpu_supports("amx-tile")) return "";
    return " (the CPU has AMX, but Linux refused this process its tile state: arch_prctl(ARCH_REQ_XCOMP_PERM))";
}
#elif defined(__aarch64__)
// Linux reports AArch64 features as HWCAP bits (GCC 12 has no __builtin_cpu_supports
// there); the names are those of /proc/cpuinfo.
bool has(const std::string &feature) {
    struct Bit {
        const char *name;
        unsigned long hwcap, bit;
    };
    static const Bit bits[] = {{"asimd", AT_HWCAP, HWCAP_ASIMD},     {"asimdhp", AT_HWCAP, HWCAP_ASIMDHP},
                               {"asimddp", AT_HWCAP, HWCAP_ASIMDDP}, {"sve", AT_HWCAP, HWCAP_SVE},
                               {"i8mm", AT_HWCAP2, HWCAP2_I8MM},     {"bf16", AT_HWCAP2, HWCAP2_BF16}};
    for (const Bit &b : bits) {
        if (feature == b.name) return getauxval(b.hwcap) & b.bit;
    }
    return false;
}
std::string refused(const std::string &) { return ""; }
#else
#error "attn runs on x86-64 and AArch64"
#endif

}  // namespace

bool cpu_supports(const std::string &isa, std::string *missing) {
    for (const manifest::Isa &i : manifest::kIsas) {
        if (isa != i.name) continue;
        if (i.cross_compiled) {
            if (missing) *missing = "'" + isa + "' is for " + i.halide_target + ", not this build's architecture";
            return false;
        }
        std::string absent;
        for (const char *feature : i.cpu_features) {
            if (!has(feature)) absent += (absent.empty() ? "" : " ") + std::string(feature);
        }
        if (missing) *missing = absent.empty() ? "" : "this CPU lacks " + absent + refused(absent);
        return absent.empty();
    }
    if (missing) *missing = "unknown ISA '" + isa + "'";
    return false;
}

namespace {
// The value of /proc/cpuinfo's first line whose key is `key` ("model name: AMD EPYC"), "" if none.
std::string cpuinfo_value(const std::string &key) {
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
        const std::size_t colon = line.find(':');
        if (colon == std::string::npos || line.find_last_not_of(" \t", colon - 1) + 1 != key.size() ||
            line.compare(0, key.size(), key) != 0)
            continue;
        const std::size_t value = line.find_first_not_of(' ', colon + 1);
        return value == std::string::npos ? "" : line.substr(value);
    }
    return "";
}
}  // namespace

// Each read once per process: dispatch asks for both several times (/proc/cpuinfo is long on
// a many-core server).
std::string cpu_model() {
    static const std::string model = [] {
        const std::string name = cpuinfo_value("model name");
        return name.empty() ? "unknown" : name;
    }();
    return model;
}

std::string cpu_id() {
    static const std::string id = [] {
        const std::string family = cpuinfo_value("cpu family"), model = cpuinfo_value("model");
        return family.empty() || model.empty() ? "" : "family " + family + " model " + model;
    }();
    return id;
}

}  // namespace attn::detail
