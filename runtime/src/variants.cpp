// The variant table: built from the generated variant list (schedules/variants.cmake).
#include "attn/generated/kernels.h"
#include "kernels.h"

#include <algorithm>
#include <deque>

namespace attn {

namespace {

// Stands in for a function a variant lacks (one its schedule source cannot provide,
// see cmake/AttnVariants.cmake, or one a registered candidate does not have).
template <typename... Args>
int missing_function(Args...) {
    halide_error(nullptr, "this variant does not provide this function\n");
    return halide_error_code_generic_error;
}
template <typename... Args>
void fill_missing(int (*&function)(Args...)) {
    if (!function) function = missing_function<Args...>;
}
void fill_missing(detail::Kernels &k) {
    fill_missing(k.qkv_projection);
    fill_missing(k.attention_scores);
    fill_missing(k.masked_softmax);
    fill_missing(k.weighted_sum);
    fill_missing(k.output_layernorm);
    fill_missing(k.self_attention);
    fill_missing(k.self_attention_probs);
    fill_missing(k.cross_attention);
    fill_missing(k.cross_attention_probs);
}

struct Entry {
    VariantInfo info;
    detail::Kernels kernels;
    bool registered = false;  // by detail::register_variant, not compiled in
};

// The GPU "ISAs" of cmake/AttnTargets.cmake name their device; their host part is
// built for the x86-64 baseline.
bool is_gpu(const std::string &isa) { return isa == "cuda" || isa == "opencl"; }

Entry make_entry(const char *schedule, const char *isa, const char *target, detail::Kernels kernels) {
    fill_missing(kernels);
    Entry e{{}, kernels};
    e.info.schedule = schedule;
    e.info.isa = isa;
    e.info.name = e.info.schedule + "_" + e.info.isa;
    e.info.target = target;
    e.info.device = is_gpu(isa) ? isa : "cpu";
    std::string missing;
    e.info.runnable = detail::cpu_supports(is_gpu(isa) ? "sse41" : isa, &missing) &&
                      detail::device_available(e.info.device, &missing);
    e.info.not_runnable_reason = missing;
    return e;
}

// The compiled variants, then any registered at run time (a deque: references stay valid).
std::deque<Entry> &entries() {
    static std::deque<Entry> table = {
#define ATTN_VARIANT(schedule, isa, target)                                                              \
    make_entry(#schedule, #isa, target,                                                                  \
               {attn_qkv_projection_##schedule##_##isa, attn_attention_scores_##schedule##_##isa,        \
                attn_masked_softmax_##schedule##_##isa, attn_weighted_sum_##schedule##_##isa,            \
                attn_output_layernorm_##schedule##_##isa, attn_self_attention_##schedule##_##isa,        \
                attn_self_attention_probs_##schedule##_##isa, attn_cross_attention_##schedule##_##isa,   \
                attn_cross_attention_probs_##schedule##_##isa}),
#include "attn/generated/variant_list.inc"
#undef ATTN_VARIANT
    };
    return table;
}

// Wider vectors first; the list order breaks ties (autotuned, then hand-written
// schedules come first there). GPU variants are chosen by name only.
int isa_rank(const std::string &isa) {
    static const std::vector<std::string> order = {"sse41", "avx2", "avx512_skylake", "avx512_zen4"};
    return int(std::find(order.begin(), order.end(), isa) - order.begin());
}

std::string variant_names() {
    std::string names;
    for (const Entry &e : entries()) names += (names.empty() ? "" : ", ") + e.info.name;
    return names;
}

}  // namespace

const std::vector<VariantInfo> &variants() {
    static const std::vector<VariantInfo> infos = [] {
        std::vector<VariantInfo> v;
        for (const Entry &e : entries()) {
            if (!e.registered) v.push_back(e.info);
        }
        return v;
    }();
    return infos;
}

const VariantInfo &select_variant(const std::string &name) {
    const std::vector<VariantInfo> &all = variants();
    if (name.empty()) {
        const VariantInfo *best = nullptr;
        for (const VariantInfo &v : all) {
            if (v.runnable && v.device == "cpu" && (!best || isa_rank(v.isa) > isa_rank(best->isa))) best = &v;
        }
        if (!best) throw Error("variant", "no compiled variant can run on this CPU (compiled: " + variant_names() + ")");
        return *best;
    }
    for (const VariantInfo &v : all) {
        if (v.name != name) continue;
        if (!v.runnable) throw Error("variant", "'" + name + "' cannot run here: " + v.not_runnable_reason);
        return v;
    }
    for (const Entry &e : entries()) {
        if (e.registered && e.info.name == name) return e.info;
    }
    throw Error("variant", "expected one of {" + variant_names() + "}, got '" + name + "'");
}

namespace detail {

const Kernels &runnable_kernels(const VariantInfo &variant) {
    for (const Entry &e : entries()) {
        if (e.info.name != variant.name) continue;
        if (!e.info.runnable) {
            throw Error("variant", "'" + variant.name + "' cannot run here: " + e.info.not_runnable_reason);
        }
        return e.kernels;
    }
    throw Error("variant", "expected one of {" + variant_names() + "}, got '" + variant.name + "'");
}

const VariantInfo &register_variant(VariantInfo info, Kernels kernels) {
    for (const Entry &e : entries()) {
        if (e.info.name == info.name) throw Error("variant", "'" + info.name + "' is already registered");
    }
    Entry entry = make_entry(info.schedule.c_str(), info.isa.c_str(), info.target.c_str(), kernels);
    entry.info.name = info.name;
    entry.registered = true;
    entries().push_back(std::move(entry));
    return entries().back().info;
}

}  // namespace detail
}  // namespace attn
