#include "schedule_source.h"

namespace attn_sched {

ScheduleKind schedule_kind(const std::string &generator, const std::string &source,
                           const Halide::Target &target) {
    if (source == "manual") {
        return target.has_gpu_feature() ? ScheduleKind::manual_gpu : ScheduleKind::manual_cpu;
    }
    return ScheduleKind::frozen;
}

void apply_frozen_schedule(const std::string &generator, const std::string &source,
                           Halide::Pipeline, const Halide::Target &target) {
    // Frozen schedules are registered here as they are checked in (see schedules/README.md).
    throw Halide::CompileError("No frozen schedule '" + source + "' for generator '" + generator +
                               "' and target " + target.to_string() + ". Known sources: manual.");
}

}  // namespace attn_sched
