#include "schedule_source.h"

#include "cpu_manual.h"

#include <regex>
#include <vector>

// The frozen schedules' headers, included once here at file scope (each is
// include-guarded, so the second inclusion of the registry below adds only its
// ATTN_FROZEN entries).
#define ATTN_FROZEN(...)
#include "frozen/registry.inc"
#undef ATTN_FROZEN

namespace attn_sched {

namespace {

struct FuncLookup {
    int index;
    const char *name;
};

struct FrozenSchedule {
    const char *source, *isa, *stage;
    void (*apply)(Halide::Pipeline, Halide::Target);
    std::vector<FuncLookup> lookups;  // what the schedule expects pipeline.get_func(index) to be
};

const std::vector<FrozenSchedule> &frozen_schedules() {
#define ATTN_FROZEN(source, isa, stage, apply, lookups) \
    {#source, #isa, #stage, apply, std::vector<FuncLookup> lookups},
    static const std::vector<FrozenSchedule> all{
#include "frozen/registry.inc"
    };
#undef ATTN_FROZEN
    return all;
}

// The ISA a target was built for, as named in cmake/AttnTargets.cmake.
std::string isa_of(const Halide::Target &t) {
    using T = Halide::Target;
    if (t.has_feature(T::CUDA)) return "cuda";
    if (t.has_feature(T::OpenCL)) return "opencl";
    if (t.arch == T::ARM) return "arm64";
    if (t.has_feature(T::AVX512_Zen4)) return "avx512_zen4";
    if (t.has_feature(T::AVX512_Skylake)) return "avx512_skylake";
    if (t.has_feature(T::AVX2)) return "avx2";
    return "sse41";
}

std::string regenerate_hint(const std::string &source, const std::string &isa, const std::string &stage) {
    return "Regenerate it with: tools/freeze_schedules.sh --sources " + source + " --isas " + isa +
           " --stages " + stage;
}

// The autoscheduler's emitter names a Func's variable after the Func, with
// characters C++ does not allow replaced.
std::string variable_name(const std::string &func_name) {
    return std::regex_replace(func_name, std::regex("[^A-Za-z0-9_]"), "_");
}

}  // namespace

ScheduleKind schedule_kind(const std::string &generator, const std::string &source,
                           const Halide::Target &target) {
    if (source == "manual") {
        return target.has_gpu_feature() ? ScheduleKind::manual_gpu : ScheduleKind::manual_cpu;
    }
    if (source == "li2018") return ScheduleKind::autoscheduled;
    return ScheduleKind::frozen;
}

int default_query_block(const Halide::Target &target, int query_block) {
    if (query_block > 0) return query_block;
    return target.has_gpu_feature() ? 32 : CpuTiling{}.query_block;
}

// GPU: 64 keys per step ran 4-8% faster on an H100 (separate runs, not interleaved) but
// took more than the 48 KB of shared memory Halide 21 launches with at head_dim 80 (a
// launch failure that PoCL does not show), so 32.
int default_key_block(const Halide::Target &target, int key_block) {
    if (key_block > 0) return key_block;
    return target.has_gpu_feature() ? 32 : CpuTiling{}.key_block;
}

int key_chunk(const Halide::Target &target, int tile_vectors) {
    return target.has_gpu_feature() ? 32 : target.natural_vector_size<float>() * tile_vectors;
}

void apply_autoscheduler(const std::string &source, Halide::Pipeline pipeline, const Halide::Target &target) {
    if (source != "li2018") throw Halide::CompileError("No in-process autoscheduler '" + source + "'.");
    // The dev machine's 2 cores; on a GPU, an H100 SXM's 132 SMs.
    const std::string parallelism = target.has_gpu_feature() ? "132" : "2";
    pipeline.apply_autoscheduler(target, Halide::AutoschedulerParams("Li2018", {{"parallelism", parallelism}}));
}

void apply_frozen_schedule(const std::string &generator, const std::string &source, Halide::Pipeline pipeline,
                           const Halide::Target &target) {
    // The GPU schedules are device-neutral (gpu_blocks, gpu_threads): the OpenCL
    // variants, which run them on PoCL in CI, use the ones frozen for CUDA.
    const std::string isa = isa_of(target) == "opencl" ? "cuda" : isa_of(target);
    const std::string path = "schedules/frozen/" + source + "/" + isa + "/" + generator + ".schedule.h";
    for (const FrozenSchedule &frozen : frozen_schedules()) {
        if (source != frozen.source || isa != frozen.isa || generator != frozen.stage) continue;
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
                                           regenerate_hint(source, isa, generator));
            }
        }
        try {
            frozen.apply(pipeline, target);
        } catch (const Halide::Error &e) {
            throw Halide::CompileError("Frozen schedule " + path + " no longer applies to the algorithm (" +
                                       e.what() + "). " + regenerate_hint(source, isa, generator));
        }
        return;
    }
    throw Halide::CompileError("No frozen schedule '" + source + "' for generator '" + generator + "' on " + isa +
                               " (" + path + "). " + regenerate_hint(source, isa, generator));
}

}  // namespace attn_sched
