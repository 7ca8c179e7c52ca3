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

// The query and key blocks of the flash core when the query_block and key_block
// generator parameters are 0: on a CPU, attn_sched::CpuTiling's (64 queries by 512 keys:
// a block's scores and exponentials, 128 KiB each, stay in L2); on a GPU, 32 by 32,
// whose running state and tiles stay in the 48 KB of shared memory that Halide 21
// launches with (for head dims up to 64).
int default_query_block(const Halide::Target &target, int query_block);
int default_key_block(const Halide::Target &target, int key_block);
// Keys per chunk of the flash core: the width of a register tile of scores on a CPU
// (tile_vectors vectors), a warp's lanes on a GPU.
int key_chunk(const Halide::Target &target, int tile_vectors);

// Runs the autoscheduler `source` (its plugin loaded by the build) on the pipeline.
void apply_autoscheduler(const std::string &source, Halide::Pipeline pipeline, const Halide::Target &target);

}  // namespace attn_sched
