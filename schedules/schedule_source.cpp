#include "schedule_source.h"

#include "attn/generated/manifest.h"

#include <map>
#include <regex>
#include <set>
#include <vector>

// The frozen schedules' headers, included once here at file scope (each is
// include-guarded, so the second inclusion of the registry below adds only its
// ATTN_FROZEN entries).
#define ATTN_FROZEN(...)
#include "../generated/frozen/registry.inc"
#undef ATTN_FROZEN

namespace attn_sched {

namespace {

struct FuncLookup {
    int index;
    const char *name;
};

struct FrozenSchedule {
    const char *source, *isa, *function;
    void (*apply)(Halide::Pipeline, Halide::Target);
    std::vector<FuncLookup> lookups;  // what the schedule expects pipeline.get_func(index) to be
};

const std::vector<FrozenSchedule> &frozen_schedules() {
#define ATTN_FROZEN(source, isa, function, apply, lookups) \
    {#source, #isa, #function, apply, std::vector<FuncLookup> lookups},
    static const std::vector<FrozenSchedule> all{
#include "../generated/frozen/registry.inc"
    };
#undef ATTN_FROZEN
    return all;
}

const attn::manifest::ScheduleSource *find_source(const std::string &source) {
    for (const attn::manifest::ScheduleSource &s : attn::manifest::kScheduleSources) {
        if (source == s.name) return &s;
    }
    return nullptr;
}

// Whether `target` has every feature of `isa_target` (same architecture and bits); CUDA
// capabilities do not count: a target for a newer GPU still runs a schedule frozen for an older.
bool has_features_of(const Halide::Target &target, const Halide::Target &isa_target, int *count) {
    if (target.arch != isa_target.arch || target.bits != isa_target.bits) return false;
    *count = 0;
    for (int f = 0; f < int(Halide::Target::FeatureEnd); ++f) {
        const auto feature = Halide::Target::Feature(f);
        if (!isa_target.has_feature(feature)) continue;
        if (Halide::Target::feature_to_name(feature).rfind("cuda_capability", 0) == 0) continue;
        if (!target.has_feature(feature)) return false;
        ++*count;
    }
    return true;
}

std::string regenerate_hint(const std::string &source, const std::string &isa, const std::string &function) {
    return "Regenerate it with: tools/freeze_schedules.sh --sources " + source + " --isas " + isa + " --functions " +
           function;
}

// The autoscheduler's emitter names a Func's variable after the Func, with
// characters C++ does not allow replaced.
std::string variable_name(const std::string &func_name) {
    return std::regex_replace(func_name, std::regex("[^A-Za-z0-9_]"), "_");
}

}  // namespace

void guard_every_split(Halide::Pipeline pipeline) {
    std::vector<Halide::Internal::Function> outputs;
    for (const Halide::Func &f : pipeline.outputs()) outputs.push_back(f.function());
    const std::map<std::string, Halide::Internal::Function> functions = Halide::Internal::build_environment(outputs);
    // Funcs inside whose loops another Func is computed.
    std::set<std::string> hosts;
    for (const auto &[name, function] : functions) {
        Halide::LoopLevel level = function.schedule().compute_level();
        level.lock();
        if (!level.is_root() && !level.is_inlined()) hosts.insert(level.func());
    }
    for (const auto &[name, function] : functions) {
        std::vector<Halide::Internal::Definition> stages{function.definition()};
        stages.insert(stages.end(), function.updates().begin(), function.updates().end());
        for (Halide::Internal::Definition &stage : stages) {
            bool on_gpu = false;
            for (const Halide::Internal::Dim &dim : stage.schedule().dims()) {
                on_gpu = on_gpu || Halide::Internal::is_gpu(dim.for_type);
            }
            if (on_gpu && hosts.count(name)) continue;
            for (Halide::Internal::Split &split : stage.schedule().splits()) {
                // RoundUp too on a CPU; on a GPU it rounds an inner Func's region, which
                // Halide 21 computes wrongly once guarded.
                const bool unguarded = split.tail == Halide::TailStrategy::ShiftInwards ||
                                       split.tail == Halide::TailStrategy::Auto ||
                                       (!on_gpu && split.tail == Halide::TailStrategy::RoundUp);
                if (split.split_type == Halide::Internal::Split::SplitVar && unguarded) {
                    split.tail = Halide::TailStrategy::GuardWithIf;
                }
            }
        }
    }
}

ScheduleKind schedule_kind(const std::string &source, const Halide::Target &target) {
    const attn::manifest::ScheduleSource *s = find_source(source);
    std::string kind = s ? s->kind : "";
    if (kind == "hand-written") return target.has_gpu_feature() ? ScheduleKind::manual_gpu : ScheduleKind::manual_cpu;
    if (kind == "frozen") return ScheduleKind::frozen;
    if (kind == "in-process") return ScheduleKind::autoscheduled;
    std::string known;
    for (const attn::manifest::ScheduleSource &k : attn::manifest::kScheduleSources) {
        if (std::string(k.kind) != "tuned") known += (known.empty() ? "" : ", ") + std::string(k.name);
    }
    throw Halide::CompileError("Unknown schedule source '" + source + "' (manifest.json has " + known +
                               "; a tuned variant is built as 'manual' with its parameters).");
}

std::string frozen_isa(const Halide::Target &target) {
    const attn::manifest::Isa *best = nullptr;
    int best_count = -1;
    for (const attn::manifest::Isa &isa : attn::manifest::kIsas) {
        int count = 0;
        if (has_features_of(target, Halide::Target(isa.halide_target), &count) && count > best_count) {
            best = &isa, best_count = count;
        }
    }
    if (!best) throw Halide::CompileError("No ISA of manifest.json matches the target " + target.to_string() + ".");
    return best->frozen_schedules_of;
}

bool takes_target_default(const char *name) {
    const attn::manifest::ManualParameter &p = attn::manifest::manual_parameter(name);
    return p.gpu_default != p.default_value || p.arm_default != p.default_value;
}

// GPU key_block: 64 keys per step ran 4-8% faster on an H100 (separate runs, not
// interleaved) but took more than the 48 KB of shared memory Halide 21 launches with at
// head_dim 80 (a launch failure that PoCL does not show), so 32 (its gpu_default).
int manual_parameter_for(const Halide::Target &target, const char *name, int given) {
    const attn::manifest::ManualParameter &p = attn::manifest::manual_parameter(name);
    if (given == 0 && takes_target_default(name)) {
        if (target.has_gpu_feature()) return p.gpu_default;
        return target.arch == Halide::Target::ARM ? p.arm_default : p.default_value;
    }
    // Halide does not hold a GeneratorParam to its range, and a 0 would divide by zero.
    if (given < p.min || given > p.max) {
        throw Halide::CompileError(std::string(name) + "=" + std::to_string(given) + ": expected " +
                                   std::to_string(p.min) + " to " + std::to_string(p.max) +
                                   (takes_target_default(name) ? ", or 0 for the target's default" : "") +
                                   " (manifest.json: manual_parameters)");
    }
    return given;
}

int key_chunk(const Halide::Target &target, int tile_vectors) {
    return target.has_gpu_feature() ? 32 : target.natural_vector_size<float>() * tile_vectors;
}

void apply_autoscheduler(const std::string &source, Halide::Pipeline pipeline, const Halide::Target &target) {
    const attn::manifest::ScheduleSource *s = find_source(source);
    if (!s || std::string(s->kind) != "in-process") {
        throw Halide::CompileError("No in-process autoscheduler '" + source + "' in manifest.json.");
    }
    Halide::AutoschedulerParams params(s->autoscheduler);
    for (const std::string pair : target.has_gpu_feature() ? s->gpu_params : s->cpu_params) {
        const std::size_t eq = pair.find('=');
        params.extra[pair.substr(0, eq)] = pair.substr(eq + 1);
    }
    pipeline.apply_autoscheduler(target, params);
    guard_every_split(pipeline);
}

void apply_frozen_schedule(const std::string &function, const std::string &source, Halide::Pipeline pipeline,
                           const Halide::Target &target) {
    if (function.empty())
        throw Halide::CompileError("A frozen schedule needs the generator parameter function=<name>.");
    const std::string isa = frozen_isa(target);
    const std::string path = "generated/frozen/" + source + "/" + isa + "/" + function + ".schedule.h";
    for (const FrozenSchedule &frozen : frozen_schedules()) {
        if (source != frozen.source || isa != frozen.isa || function != frozen.function) continue;
        // The schedule finds Funcs by their index in the pipeline: if the algorithm
        // changed, the index may now name another Func, and the schedule is stale.
        for (const FuncLookup &lookup : frozen.lookups) {
            std::string now;
            try {
                now = variable_name(pipeline.get_func(lookup.index).name());
            } catch (const Halide::Error &) {
                now = "(no such stage)";
            }
            if (now != lookup.name) {
                throw Halide::CompileError("Stale frozen schedule " + path + ": it expects pipeline stage " +
                                           std::to_string(lookup.index) + " to be '" + lookup.name +
                                           "', but the algorithm now has '" + now + "' there. " +
                                           regenerate_hint(source, isa, function));
            }
        }
        try {
            frozen.apply(pipeline, target);
        } catch (const Halide::Error &e) {
            throw Halide::CompileError("Frozen schedule " + path + " no longer applies to the algorithm (" + e.what() +
                                       "). " + regenerate_hint(source, isa, function));
        }
        guard_every_split(pipeline);
        return;
    }
    throw Halide::CompileError("No frozen schedule '" + source + "' for function '" + function + "' on " + isa + " (" +
                               path + "). " + regenerate_hint(source, isa, function));
}

}  // namespace attn_sched
