// detail::load_candidate and take_candidates (attn/internal.h): a tuning candidate's shared
// library registered as a variant, for attn_bench --candidate and the tests' --candidate.
#include "attn/generated/manifest.h"
#include "attn/internal.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>

namespace attn::detail {

const VariantInfo &load_candidate(const std::string &spec) {
    const std::size_t first = spec.find(':'), last = spec.rfind(':');
    if (first == std::string::npos || first == last) {
        throw Error("--candidate", "expected LIBRARY:SUFFIX:ISA, got '" + spec + "'");
    }
    const std::string library = spec.substr(0, first), suffix = spec.substr(first + 1, last - first - 1);
    void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) throw Error("--candidate", std::string("cannot load ") + library + ": " + dlerror());
    FunctionTable functions;
    for (const manifest::Function &f : manifest::kFunctions) {
        const std::string symbol = "attn_" + std::string(f.name) + "_" + suffix;
        CompiledFunction compiled;
        compiled.argv = reinterpret_cast<int (*)(void **)>(dlsym(handle, (symbol + "_argv").c_str()));
        compiled.metadata =
            reinterpret_cast<const halide_filter_metadata_t *(*)()>(dlsym(handle, (symbol + "_metadata").c_str()));
        if (compiled.argv && compiled.metadata) functions[f.name] = {compiled};
    }
    if (functions.empty()) throw Error("--candidate", library + " has no function attn_<function>_" + suffix);
    VariantInfo info;
    info.name = "candidate_" + suffix;
    info.schedule = "candidate";
    info.isa = spec.substr(last + 1);
    info.target = library;
    return register_variant(info, functions);
}

std::vector<VariantInfo> take_candidates(int &argc, char **argv) {
    const char *flag = "--candidate=";
    std::vector<VariantInfo> loaded;
    for (int i = 1; i < argc; ++i) {
        if (std::strncmp(argv[i], flag, std::strlen(flag)) != 0) continue;
        loaded.push_back(load_candidate(argv[i] + std::strlen(flag)));
        std::copy(argv + i + 1, argv + argc + 1, argv + i);  // argv[argc] is null
        --argc;
        --i;
    }
    return loaded;
}

}  // namespace attn::detail
