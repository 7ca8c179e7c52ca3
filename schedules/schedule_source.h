// Picks how a generator's pipeline is scheduled, from its `schedule` generator
// parameter: "manual" (the hand-written CPU or GPU schedule for the target), or the
// name of a frozen schedule under schedules/frozen/ (autoscheduler or autotuner
// output, stamped with its target), or nothing when Halide's autoscheduler runs.
#pragma once

#include "Halide.h"

#include <string>

namespace attn_sched {

enum class ScheduleKind {
    manual_cpu,
    manual_gpu,
    frozen,          // checked-in autoscheduler output (schedules/frozen/)
    autoscheduled,   // an autoscheduler run now, in process (li2018: its emitted schedules do not compile)
};

// Throws (as a Halide user error) for a source with no schedule for this target.
ScheduleKind schedule_kind(const std::string &generator, const std::string &source,
                           const Halide::Target &target);

// Applies the frozen schedule `source` for `generator` on `target`.
void apply_frozen_schedule(const std::string &generator, const std::string &source,
                           Halide::Pipeline pipeline, const Halide::Target &target);

// Runs the autoscheduler `source` (its plugin loaded by the build) on the pipeline.
void apply_autoscheduler(const std::string &source, Halide::Pipeline pipeline, const Halide::Target &target);

}  // namespace attn_sched
