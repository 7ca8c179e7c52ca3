// Base of every generator: generate() in the subclass holds only the algorithm
// (algorithm/) and its estimates; schedule() applies the schedule source named by the
// `schedule` generator parameter (schedules/schedule_source.h), one of manifest.json's.
// The dependencies go one way: generators/ -> schedules/ -> algorithm/.
#pragma once

#include "../algorithm/attention_algorithm.h"
#include "../schedules/cpu_manual.h"
#include "../schedules/gpu_manual.h"
#include "../schedules/schedule_source.h"
#include "attn/generated/manifest.h"
#include "gpu_shared_memory.h"

#include <string>

namespace attn_gen {

// Estimates: a BERT-base layer (H = 768, 12 heads, S = 128), one sequence on a CPU and
// a batch of 8 on a GPU (a GPU needs the batch to fill its SMs; and Halide 21's
// Mullapudi2016 GPU schedule fails on a dimension of extent 1).
constexpr int kEstimateHidden = 768;
constexpr int kEstimateHeads = 12;
constexpr int kEstimateSeq = 128;
constexpr int kEstimateBatchCpu = 1;
constexpr int kEstimateBatchGpu = 8;

// A generator parameter of the hand-written schedule, declared in manifest.json. One with a
// default of its own on a GPU or on Arm starts at 0: the target's default
// (attn_sched::manual_parameter_for).
inline Halide::GeneratorParam<int> manual_parameter(const char *name) {
    const attn::manifest::ManualParameter &p = attn::manifest::manual_parameter(name);
    return attn_sched::takes_target_default(name) ? Halide::GeneratorParam<int>(name, 0, 0, p.max)
                                                  : Halide::GeneratorParam<int>(name, p.default_value, p.min, p.max);
}

template <typename T>
class AttentionGenerator : public Halide::Generator<T> {
public:
    // The manifest function this build is (its frozen schedule's name), and its schedule source.
    Halide::GeneratorParam<std::string> function{"function", ""};
    Halide::GeneratorParam<std::string> schedule_source{"schedule", "manual"};
    // The hand-written schedule's parameters (schedules/cpu_manual.h); other sources ignore
    // them. The register tiles', then the attention core's blocks.
    Halide::GeneratorParam<int> tile_rows = manual_parameter("tile_rows");
    Halide::GeneratorParam<int> tile_vectors = manual_parameter("tile_vectors");
    Halide::GeneratorParam<int> context_vectors = manual_parameter("context_vectors");
    Halide::GeneratorParam<int> query_block = manual_parameter("query_block");
    Halide::GeneratorParam<int> key_block = manual_parameter("key_block");
    // The precision of the function's products (attn_gen::Precision); each generator takes
    // the ones it has through checked_precision().
    Halide::GeneratorParam<Precision> precision{
        "precision",
        Precision::fp32,
        {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}, {"int8", Precision::int8}}};
    // The GPU schedule's own: its projections' register tiles, blocks, reduction split and
    // unrolled steps, and
    // the flash core's threads a query and queries a thread.
    Halide::GeneratorParam<int> gpu_thread_rows = manual_parameter("gpu_thread_rows");
    Halide::GeneratorParam<int> gpu_col_threads = manual_parameter("gpu_col_threads");
    Halide::GeneratorParam<int> gpu_row_threads = manual_parameter("gpu_row_threads");
    Halide::GeneratorParam<int> gpu_split_k = manual_parameter("gpu_split_k");
    Halide::GeneratorParam<int> gpu_unroll_k = manual_parameter("gpu_unroll_k");
    Halide::GeneratorParam<int> gpu_query_lanes = manual_parameter("gpu_query_lanes");
    Halide::GeneratorParam<int> gpu_thread_queries = manual_parameter("gpu_thread_queries");

    attn_sched::CpuTiling tiling() const {
        const attn_gen::Blocking b = blocking();
        const Halide::Target &t = this->get_target();
        return {attn_sched::manual_parameter_for(t, "tile_rows", tile_rows),
                attn_sched::manual_parameter_for(t, "tile_vectors", tile_vectors), b.query_block,
                attn_sched::manual_parameter_for(t, "context_vectors", context_vectors)};
    }
    attn_sched::GpuTiling gpu_tiling() const {
        const Halide::Target &t = this->get_target();
        return {attn_sched::manual_parameter_for(t, "gpu_thread_rows", gpu_thread_rows),
                attn_sched::manual_parameter_for(t, "gpu_col_threads", gpu_col_threads),
                attn_sched::manual_parameter_for(t, "gpu_row_threads", gpu_row_threads),
                attn_sched::manual_parameter_for(t, "gpu_split_k", gpu_split_k),
                attn_sched::manual_parameter_for(t, "gpu_unroll_k", gpu_unroll_k),
                attn_sched::manual_parameter_for(t, "gpu_query_lanes", gpu_query_lanes),
                attn_sched::manual_parameter_for(t, "gpu_thread_queries", gpu_thread_queries)};
    }
    // The flash core's blocks; its chunks of keys are a bf16 AMX tile product's with amx_core
    // (a bf16 core's Bf16Core::amx_tiles).
    attn_gen::Blocking blocking(bool amx_core = false) const {
        const Halide::Target &t = this->get_target();
        const int queries = attn_sched::manual_parameter_for(t, "query_block", query_block);
        if (amx_core && queries % kAmxTileColumns != 0)
            throw Halide::CompileError("query_block=" + std::to_string(queries) + ": the flash core's AMX tiles take " +
                                       std::to_string(kAmxTileColumns) + " queries each: expected a multiple of " +
                                       std::to_string(kAmxTileColumns));
        return {queries, attn_sched::manual_parameter_for(t, "key_block", key_block),
                amx_core ? kAmxTileStep
                         : attn_sched::key_chunk(t, attn_sched::manual_parameter_for(t, "tile_vectors", tile_vectors)),
                hand_written_cpu_schedule()};
    }
    // Whether the hand-written CPU schedule (schedules/cpu_manual.cpp) schedules this pipeline:
    // neither an autoscheduler nor a frozen schedule, and not a GPU target.
    bool hand_written_cpu_schedule() const {
        return !this->using_autoscheduler() &&
               attn_sched::schedule_kind(schedule_source, this->get_target()) == attn_sched::ScheduleKind::manual_cpu;
    }
    // Projections in AMX tiles (attn_gen::Linear::amx_tile: bf16 and int8) where the target has
    // them (a bf16 flash core's tiles: bf16_core).
    bool amx_projections(Precision precision) const {
        return precision != Precision::fp32 && attn_sched::amx_tiles(this->get_target());
    }
    // How a bf16 flash core is written for the target (attn_gen::Bf16Core): its products in AMX
    // tiles where the CPU has them, as f32 values where it has neither those nor vdpbf16ps, and
    // its exponentials rounded by vcvtne2ps2bf16 where it has avx512bf16 and the hand-written
    // schedule vectorizes them (in 16 f32 lanes on AVX-512).
    attn_gen::Bf16Core bf16_core(Precision core_precision) const {
        const Halide::Target &t = this->get_target();
        attn_gen::Bf16Core core;
        if (core_precision != Precision::bf16 || t.has_gpu_feature()) return core;
        core.amx_tiles = attn_sched::amx_tiles(t);
        core.widened = !attn_sched::native_bf16(t) && !core.amx_tiles;
        core.rounding_instruction =
            t.has_feature(Halide::Target::AVX512_Zen4) && hand_written_cpu_schedule();
        return core;
    }
    // int8's products in quads (vpdpbusd) or in 16-bit pairs (attn_gen::Int8Sum), as the target has them.
    Int8Sum int8_sum() const {
        return attn_sched::native_int8(this->get_target()) ? Int8Sum::quads : Int8Sum::pairs_in_i16;
    }

    // `precision`, once checked: fp32 everywhere; bf16 where the generator has it (`bf16`),
    // int8 likewise; both on CPUs only.
    Precision checked_precision(const char *generator, bool bf16, bool int8) const {
        const Precision p = precision;
        const char *name = p == Precision::bf16 ? "bf16" : "int8";
        if (p == Precision::fp32) return p;
        if ((p == Precision::bf16 && !bf16) || (p == Precision::int8 && !int8))
            _halide_user_error << generator << ": has no precision=" << name << "\n";
        if (this->get_target().has_gpu_feature())
            _halide_user_error << generator << ": precision=" << name << " is built for CPUs only, not for "
                               << this->get_target() << "\n";
        return p;
    }

    int estimate_batch() const { return this->get_target().has_gpu_feature() ? kEstimateBatchGpu : kEstimateBatchCpu; }
    // The estimates of a [B, S, H] activation and of [B, heads, S_q, S_k] scores.
    template <typename Buffer3>
    void estimate_activation(Buffer3 &buffer) const {
        buffer.set_estimates({{0, kEstimateHidden}, {0, kEstimateSeq}, {0, estimate_batch()}});
    }
    Halide::Region score_estimate() const {
        return {{0, kEstimateSeq}, {0, kEstimateSeq}, {0, kEstimateHeads}, {0, estimate_batch()}};
    }

    void schedule() {
        if (this->using_autoscheduler()) return;
        T &self = *static_cast<T *>(this);
        switch (attn_sched::schedule_kind(schedule_source, this->get_target())) {
            case attn_sched::ScheduleKind::manual_cpu:
                self.schedule_manual_cpu();
                break;
            case attn_sched::ScheduleKind::manual_gpu:
                self.schedule_manual_gpu();
                break;
            case attn_sched::ScheduleKind::frozen:
                attn_sched::apply_frozen_schedule(function, schedule_source, this->get_pipeline(), this->get_target());
                break;
            case attn_sched::ScheduleKind::autoscheduled:
                attn_sched::apply_autoscheduler(schedule_source, this->get_pipeline(), this->get_target());
                break;
        }
        check_gpu_shared_memory(this->get_pipeline(), this->get_target(),
                                std::string(function) + " (" + std::string(schedule_source) + ")");
    }
};

}  // namespace attn_gen
