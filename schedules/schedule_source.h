// Picks how a generator's pipeline is scheduled, from its `schedule` generator
// parameter, a schedule source of manifest.json: a hand-written one ("manual": the CPU
// or GPU schedule for the target), a frozen one (autoscheduler output checked in under
// generated/frozen/, stamped with its target), or one run in process; nothing when
// Halide's autoscheduler runs. (A tuned source is built as "manual" with the tuned
// parameters.)
#pragma once

#include "Halide.h"

#include <string>

namespace attn_sched {

enum class ScheduleKind {
    manual_cpu,
    manual_gpu,
    frozen,         // checked-in autoscheduler output (generated/frozen/)
    autoscheduled,  // an autoscheduler run now, in process (li2018: its emitted schedules do not compile)
};

// Throws (as a Halide compile error) for a source manifest.json does not have, or a tuned one.
ScheduleKind schedule_kind(const std::string &source, const Halide::Target &target);

// The manifest ISA whose frozen schedules serve `target`: of the ISAs whose Halide target
// `target` has every feature of (CUDA capabilities aside), the one with the most.
std::string frozen_isa(const Halide::Target &target);

// Makes an autoscheduled schedule run every shape: the autoschedulers split loops with
// ShiftInwards or RoundUp tails (or Auto, which becomes one of them), which assume every
// extent is at least (RoundUp: a multiple of) the split factor; on another (S = 1,
// H = 64, 4 heads where a tile is 8) the loop reads or writes before or past the
// buffers and Halide refuses the call. GuardWithIf computes exactly the extent (the
// steady state of each loop stays as it was; only the last, partial tile is guarded).
// Nothing else changes: splits, order, placement, vectorization and parallelism.
// On a GPU, RoundUp tails stay, and a stage inside whose tiles another Func is computed
// keeps all its tails: Halide 21 then mis-sizes that Func's storage (valgrind under
// PoCL: writes past it) or computes wrong values, so those schedules keep minimum
// extents (manifest.json: min_shapes; below them the runtime runs the hand-written kernels).
void guard_every_split(Halide::Pipeline pipeline);

// Applies the frozen schedule of `source` for the manifest function `function` on `target`,
// then guards its splits.
void apply_frozen_schedule(const std::string &function, const std::string &source, Halide::Pipeline pipeline,
                           const Halide::Target &target);

// Whether a hand-written schedule's parameter has a default of its own on a GPU or on Arm
// (manifest.json): its generator parameter then starts at 0, "the target's default".
bool takes_target_default(const char *name);
// A hand-written schedule's parameter: `given`, which must lie in manifest.json's range
// (a CompileError names the parameter otherwise), or for 0 where takes_target_default,
// manifest.json's default for the target: gpu_default on a GPU, arm_default on Arm,
// default elsewhere. So the
// flash core's blocks are 64 queries by 512 keys on a CPU (a block's scores and
// exponentials, 128 KiB each, stay in L2) and 32 by 32 on a GPU (its running state and
// tiles stay in the 48 KB of shared memory that Halide 21 launches with, for head dims
// up to 64), and the register tile has 8 rows on Arm (24 of NEON's 32 registers).
int manual_parameter_for(const Halide::Target &target, const char *name, int given);
// Keys per chunk of the flash core: the width of a register tile of scores on a CPU
// (tile_vectors vectors), a warp's lanes on a GPU.
int key_chunk(const Halide::Target &target, int tile_vectors);

// Runs the in-process autoscheduler of `source` (its plugin loaded by the build) on the
// pipeline, with manifest.json's parameters for the target's device, then guards its splits.
void apply_autoscheduler(const std::string &source, Halide::Pipeline pipeline, const Halide::Target &target);

}  // namespace attn_sched
