// The variant table (what this build compiled, attn/generated/compiled_functions.inc,
// described by manifest.json) and calling a compiled function by argument names.
#include "attn/generated/dispatch.h"
#include "attn/generated/manifest.h"
#include "attn/internal.h"

#include <algorithm>
#include <deque>
#include <string_view>
#include <vector>

// The compiled functions' headers (the table's macros are left undefined: only the includes).
#include "attn/generated/compiled_functions.inc"

namespace attn {

namespace {

struct Entry {
    VariantInfo info;
    detail::FunctionTable functions;
    int dispatch_rank = 0;      // of its ISA; 0: chosen by name only
    int dispatch_priority = 0;  // of its schedule source among an ISA's variants; 0: by name only
    bool registered = false;    // by detail::register_variant, not compiled in
};

Entry make_entry(const std::string &schedule, const std::string &isa, detail::FunctionTable functions) {
    Entry e{{}, std::move(functions)};
    e.info.schedule = schedule;
    e.info.isa = isa;
    e.info.name = schedule + "_" + isa;
    e.info.device = "cpu";
    manifest::Names isa_variants;  // the schedule sources the ISA is built with
    for (const manifest::Isa &i : manifest::kIsas) {
        if (isa != i.name) continue;
        e.info.target = i.halide_target;
        e.info.device = i.device;
        e.dispatch_rank = i.dispatch_rank;
        isa_variants = i.variants;
    }
    for (const manifest::ScheduleSource &s : manifest::kScheduleSources) {
        if (schedule != s.name) continue;
        e.dispatch_priority = s.dispatch_priority;
        e.info.bitwise_reproducible = !s.not_bitwise_reproducible_on.contains(isa);
        e.info.min_shapes_because = s.min_shapes_because;
    }
    for (const manifest::MinShape &m : manifest::kMinShapes) {
        if (schedule != m.source || isa != m.isa) continue;
        ProblemExtents &bound = e.info.min_shapes[m.function];
        for (std::size_t d = 0; d < std::size(kProblemDimensions); ++d)
            bound.*kProblemDimensions[d].extent = m.extents[d];
    }
    if (!e.info.min_shapes.empty()) {
        for (const manifest::ScheduleSource &s : manifest::kScheduleSources) {
            if (std::string(s.kind) == "hand-written" && isa_variants.contains(s.name)) {
                e.info.fallback = std::string(s.name) + "_" + isa;
            }
        }
    }
    for (const manifest::Function &f : manifest::kFunctions) {
        if (e.functions.count(f.name)) e.info.functions.push_back(f.name);
    }
    std::string missing;
    e.info.runnable = detail::cpu_supports(isa, &missing) && detail::device_available(e.info.device, &missing);
    e.info.not_runnable_reason = missing;
    return e;
}

// CUDA's JIT register cap for a schedule source's kernels (manifest.json: gpu_max_registers).
int gpu_max_registers(const char *source) {
    for (const manifest::ScheduleSource &s : manifest::kScheduleSources) {
        if (std::string(source) == s.name) return s.gpu_max_registers;
    }
    return manifest::kGpuMaxRegisters;
}

// The compiled variants in manifest order, then any registered at run time (a deque:
// references stay valid).
std::deque<Entry> &entries() {
    static std::deque<Entry> table = [] {
        std::map<std::string, detail::FunctionTable> functions;  // by variant name
#define ATTN_COMPILED(source, isa, function, max_seq, symbol) \
    functions[#source "_" #isa][#function].push_back(         \
        {max_seq, symbol##_argv, symbol##_metadata, gpu_max_registers(#source)});
#include "attn/generated/compiled_functions.inc"
#undef ATTN_COMPILED
        std::deque<Entry> t;
#define ATTN_VARIANT(source, isa) t.push_back(make_entry(#source, #isa, functions[#source "_" #isa]));
#include "attn/generated/compiled_functions.inc"
#undef ATTN_VARIANT
        return t;
    }();
    return table;
}

std::string variant_names() {
    std::string names;
    for (const Entry &e : entries()) names += (names.empty() ? "" : ", ") + e.info.name;
    return names;
}

const Entry &runnable_entry(const VariantInfo &variant) {
    for (const Entry &e : entries()) {
        if (e.info.name != variant.name) continue;
        if (!e.info.runnable) {
            throw Error("variant", "'" + variant.name + "' cannot run here: " + e.info.not_runnable_reason);
        }
        return e;
    }
    throw Error("variant", "expected one of {" + variant_names() + "}, got '" + variant.name + "'");
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

bool VariantInfo::provides(const std::string &function) const {
    return std::find(functions.begin(), functions.end(), function) != functions.end();
}

bool VariantInfo::runs_own_kernels(const std::string &function, const ProblemExtents &call) const {
    const auto found = min_shapes.find(function);
    if (found == min_shapes.end()) return true;
    return std::all_of(std::begin(kProblemDimensions), std::end(kProblemDimensions),
                       [&](const ProblemDimension &d) { return call.*d.extent >= found->second.*d.extent; });
}

namespace {

struct DefaultChoice {
    const Entry *entry = nullptr;
    std::string reason;
    // Per shape class (manifest::kShapeClasses, in order): the measured pick, null where
    // there is none (then `entry`). Derived once, with the default.
    std::vector<const Entry *> class_picks;
};

// The first runnable compiled variant of `order`, if any; `dispatched`: only of those a
// default may be (a dispatch rank and priority: no GPU, no autoscheduled source).
const Entry *first_runnable(const manifest::Names &order, bool dispatched = false) {
    for (const char *name : order) {
        for (const Entry &e : entries()) {
            if (e.info.name == name && e.info.runnable && !e.registered &&
                (!dispatched || (e.dispatch_rank && e.dispatch_priority)))
                return &e;
        }
    }
    return nullptr;
}

// A measurement's ranking of one shape class; null if it timed none of the class's problems.
const manifest::ClassOrder *class_ranking(const manifest::MeasuredOrder &m, std::string_view shape_class) {
    for (const manifest::ClassOrder &c : m.classes) {
        if (shape_class == c.shape_class) return &c;
    }
    return nullptr;
}

// The default variant, and why: a measurement of this CPU (generated/dispatch.json) that
// covered its widest instruction set, else the rule: the runnable variant of the highest
// ISA dispatch rank, then of the highest schedule source priority (manifest.json); a rank
// or priority of 0 is chosen by name only.
DefaultChoice choose_default() {
    DefaultChoice rule;
    for (const Entry &e : entries()) {
        if (e.registered || !e.info.runnable || !e.dispatch_rank || !e.dispatch_priority) continue;
        if (!rule.entry || std::pair(e.dispatch_rank, e.dispatch_priority) >
                               std::pair(rule.entry->dispatch_rank, rule.entry->dispatch_priority)) {
            rule.entry = &e;
        }
    }
    if (!rule.entry) return rule;
    const std::string model = detail::cpu_model(), id = detail::cpu_id(), widest = rule.entry->info.isa;
    for (const manifest::MeasuredOrder *measured : detail::measurements_of_this_cpu(widest)) {
        const manifest::MeasuredOrder &m = *measured;
        const Entry *e = first_runnable(m.order);
        if (!e) continue;
        std::string reason = "measured: the variant closest to the fastest on every fused-layer problem of " +
                             std::string(m.source) + " (" + m.date + "), on this CPU (" + model +
                             (*m.cpu_id ? ", " + id : "; any family and model, which that measurement did not record") +
                             ") with " + widest + " its widest instruction set";
        std::string by_class;
        std::vector<const Entry *> picks;
        for (const manifest::ShapeClass &c : manifest::kShapeClasses) {
            // The class's pick: the first of its ranking that runs here and is a hand-written or
            // tuned CPU variant (those provide every layer function, and read the same prepared
            // weights).
            const manifest::ClassOrder *ranked = class_ranking(m, c.name);
            const Entry *pick = picks.emplace_back(ranked ? first_runnable(ranked->order, true) : nullptr);
            by_class += std::string(by_class.empty() ? "" : ", ") + c.name +
                        (c.max_seq ? " (max(S_q, S_k) <= " + std::to_string(c.max_seq) + ")" : std::string()) + " " +
                        (pick     ? pick->info.name
                         : ranked ? e->info.name + " (no variant of the class's ranking qualifies)"
                                  : e->info.name + " (that measurement timed none of the class's problems)");
        }
        return {e,
                reason +
                    "; an Attention made without naming a variant runs each call with the closest of "
                    "its shape class's problems: " +
                    by_class,
                std::move(picks)};
    }
    rule.reason = "by rule, as no measurement in generated/dispatch.json is of this CPU (" + model +
                  (id.empty() ? "" : ", " + id) + ") with " +
                  widest + " measured: the widest instruction set (" + widest +
                  "), then the schedule source of highest dispatch_priority (manifest.json)";
    return rule;
}

const DefaultChoice &default_choice() {
    static const DefaultChoice choice = choose_default();
    return choice;
}

}  // namespace

const VariantInfo &default_variant_for(int64_t seq) {
    const DefaultChoice &c = default_choice();
    // The call's shape class: the first whose bound holds (manifest.json).
    for (std::size_t i = 0; i < c.class_picks.size(); ++i) {
        const int max_seq = manifest::kShapeClasses[i].max_seq;
        if (max_seq == 0 || seq <= max_seq) {
            if (c.class_picks[i]) return c.class_picks[i]->info;
            break;
        }
    }
    return select_variant();
}

std::vector<const VariantInfo *> detail::default_class_picks() {
    std::vector<const VariantInfo *> picks;
    for (const Entry *pick : default_choice().class_picks)
        if (pick) picks.push_back(&pick->info);
    return picks;
}

std::string default_variant_reason() {
    const DefaultChoice &c = default_choice();
    return c.entry ? c.entry->info.name + ": " + c.reason : "no compiled variant can run on this CPU";
}

const char *precision_name(Precision precision) {
    return precision == Precision::fp32 ? "fp32" : reduced_precision(precision).name;
}

std::string precision_names() {
    std::string names = "fp32";
    for (std::size_t i = 0; i < std::size(kReducedPrecisions); ++i)
        names += std::string(i + 1 == std::size(kReducedPrecisions) ? " or " : ", ") + kReducedPrecisions[i].name;
    return names;
}

Precision precision_from_name(const std::string &name, const std::string &argument) {
    if (name == "fp32") return Precision::fp32;
    for (const ReducedPrecision &p : kReducedPrecisions) {
        if (name == p.name) return p.precision;
    }
    throw Error(argument, "expected " + precision_names() + ", got '" + name + "'");
}

const ReducedPrecision &reduced_precision(Precision precision) {
    for (const ReducedPrecision &p : kReducedPrecisions) {
        if (p.precision == precision) return p;
    }
    throw Error("precision", "expected bf16 or int8 (a reduced precision), got " +
                                 (precision == Precision::fp32 ? std::string("fp32") : std::to_string(int(precision))));
}

bool ReducedPrecision::bf16_core() const {
    for (const manifest::Function &f : manifest::kFunctions)
        if (std::string(f.name) == layer) return f.params.contains("core_precision=bf16");
    return false;
}

bool computes_natively(const VariantInfo &variant, Precision precision) {
    if (precision == Precision::fp32) return true;
    for (const manifest::Isa &i : manifest::kIsas) {
        if (variant.isa == i.name) return i.cpu_features.contains(reduced_precision(precision).cpu_feature);
    }
    return false;
}

std::vector<const VariantInfo *> precision_variants(Precision precision) {
    std::vector<const VariantInfo *> out;
    for (const VariantInfo &v : variants()) {
        // (fp32's: every variant but those of an ISA built for reduced precisions only)
        if (v.provides(precision == Precision::fp32 ? "attention_layer" : reduced_precision(precision).layer))
            out.push_back(&v);
    }
    return out;
}

bool computes_bf16(const VariantInfo &variant) { return computes_natively(variant, Precision::bf16); }
std::vector<const VariantInfo *> bf16_variants() { return precision_variants(Precision::bf16); }

const VariantInfo &select_variant(const std::string &name) {
    if (name.empty()) {
        const DefaultChoice &c = default_choice();
        if (!c.entry)
            throw Error("variant", "no compiled variant can run on this CPU (compiled: " + variant_names() + ")");
        return c.entry->info;
    }
    for (const Entry &e : entries()) {
        if (e.info.name != name) continue;
        if (!e.info.runnable) throw Error("variant", "'" + name + "' cannot run here: " + e.info.not_runnable_reason);
        return e.info;
    }
    throw Error("variant", "expected one of {" + variant_names() + "}, got '" + name + "'");
}

namespace detail {

std::vector<const manifest::MeasuredOrder *> measurements_of_this_cpu(const std::string &widest) {
    const std::string model = cpu_model(), id = cpu_id();
    std::vector<const manifest::MeasuredOrder *> same_id, same_name;
    for (const manifest::MeasuredOrder &m : manifest::kMeasuredOrders) {
        if (model != m.cpu_model || !m.isas.contains(widest)) continue;
        if (!*m.cpu_id) {
            same_name.push_back(&m);
        } else if (id == m.cpu_id) {
            same_id.push_back(&m);
        }
    }
    same_id.insert(same_id.end(), same_name.begin(), same_name.end());
    return same_id;
}

Arguments &Arguments::add(const std::string &name, halide_buffer_t *buffer, halide_type_t type,
                          halide_scalar_value_t scalar) {
    values_.push_back({name, buffer, type, scalar});
    return *this;
}
Arguments &Arguments::buffer(const std::string &name, halide_buffer_t *buffer) {
    return add(name, buffer, halide_type_t(), halide_scalar_value_t());
}
Arguments &Arguments::scalar(const std::string &name, bool value) {
    halide_scalar_value_t v;
    v.u.b = value;
    return add(name, nullptr, halide_type_t(halide_type_uint, 1), v);
}
Arguments &Arguments::scalar(const std::string &name, int32_t value) {
    halide_scalar_value_t v;
    v.u.i32 = value;
    return add(name, nullptr, halide_type_t(halide_type_int, 32), v);
}
Arguments &Arguments::scalar(const std::string &name, float value) {
    halide_scalar_value_t v;
    v.u.f32 = value;
    return add(name, nullptr, halide_type_t(halide_type_float, 32), v);
}
const Arguments::Value *Arguments::find(const char *name) const {
    for (const Value &v : values_) {
        if (v.name == name) return &v;
    }
    return nullptr;
}

int call(const CompiledFunction &function, const Arguments &arguments, const std::string &what) {
    const halide_filter_metadata_t *metadata = function.metadata();
    std::vector<void *> argv(std::size_t(metadata->num_arguments));
    for (int i = 0; i < metadata->num_arguments; ++i) {
        const halide_filter_argument_t &a = metadata->arguments[i];
        const Arguments::Value *v = arguments.find(a.name);
        const bool buffer = a.kind != halide_argument_kind_input_scalar;
        if (!v || buffer != (v->buffer != nullptr) || (!buffer && !(v->type == a.type))) {
            throw Error("variant", what + " takes the " + (buffer ? "buffer" : "scalar") + " argument '" + a.name +
                                       "', which the runtime " +
                                       (v ? "passes as another kind or type" : "does not pass") +
                                       " (manifest.json and the generator disagree)");
        }
        argv[std::size_t(i)] =
            buffer ? static_cast<void *>(v->buffer) : const_cast<halide_scalar_value_t *>(&v->scalar);
    }
    for (const Arguments::Value &v : arguments.values()) {
        const auto *end = metadata->arguments + metadata->num_arguments;
        if (std::none_of(metadata->arguments, end,
                         [&](const halide_filter_argument_t &a) { return v.name == a.name; })) {
            throw Error("variant", what + " takes no argument '" + v.name +
                                       "', which the runtime passes (manifest.json and the generator disagree)");
        }
    }
    return function.argv(argv.data());
}

const FunctionTable &compiled_functions(const VariantInfo &variant) {
    for (const Entry &e : entries()) {
        if (e.info.name == variant.name) return e.functions;
    }
    throw Error("variant", "expected one of {" + variant_names() + "}, got '" + variant.name + "'");
}

const FunctionTable &runnable_functions(const VariantInfo &variant) { return runnable_entry(variant).functions; }

const CompiledFunction &function_for(const VariantInfo &variant, const std::string &function,
                                     const ProblemExtents &call) {
    const FunctionTable &table = runnable_functions(variant);
    const auto found = table.find(function);
    if (found == table.end()) {
        // A tuning candidate (attn::detail::load_candidate) is a library that may hold only
        // the functions it was compiled for; a built variant lacks only what its source cannot.
        const std::string prefix = "candidate_";
        const std::string why = variant.schedule == "candidate" && variant.name.rfind(prefix, 0) == 0
                                    ? " (its library " + variant.target + " has no attn_" + function + "_" +
                                          variant.name.substr(prefix.size()) + ")"
                                    : " (its schedule source or ISA cannot; see not_provided, built_for and the ISA's "
                                      "precisions in manifest.json)";
        throw Error("variant", "'" + variant.name + "' does not provide " + function + why);
    }
    if (!variant.runs_own_kernels(function, call))
        return function_for(select_variant(variant.fallback), function, call);
    const int64_t seq = std::max(call.seq_q, call.seq_k);
    for (const CompiledFunction &f : found->second) {
        if (f.max_seq == 0 || seq <= f.max_seq) return f;
    }
    throw Error("variant", "'" + variant.name + "' has no " + function + " for sequences of " + std::to_string(seq));
}

std::vector<const VariantInfo *> compiled_and_registered_variants() {
    std::vector<const VariantInfo *> out;
    for (const Entry &e : entries()) out.push_back(&e.info);
    return out;
}

const VariantInfo &register_variant(VariantInfo info, FunctionTable functions) {
    for (const Entry &e : entries()) {
        if (e.info.name == info.name) throw Error("variant", "'" + info.name + "' is already registered");
    }
    Entry entry = make_entry(info.schedule, info.isa, std::move(functions));
    entry.info.name = info.name;
    entry.info.target = info.target;
    entry.registered = true;
    entries().push_back(std::move(entry));
    return entries().back().info;
}

}  // namespace detail
}  // namespace attn
