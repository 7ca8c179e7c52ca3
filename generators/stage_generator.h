// Base of every attention generator: the `schedule` parameter picks the schedule
// source (see schedules/schedule_source.h); generate() in the subclass holds only the
// algorithm and its estimates.
#pragma once

#include "../schedules/cpu_manual.h"
#include "../schedules/gpu_manual.h"
#include "../schedules/schedule_source.h"
#include "attention_algorithm.h"

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

template <typename T>
class StageGenerator : public Halide::Generator<T> {
public:
    Halide::GeneratorParam<std::string> schedule_source{"schedule", "manual"};
    // The hand-written schedule's parameters (schedules/cpu_manual.h); other sources ignore them.
    Halide::GeneratorParam<int> tile_rows{"tile_rows", attn_sched::CpuTiling{}.tile_rows, 1, 8};
    Halide::GeneratorParam<int> tile_vectors{"tile_vectors", attn_sched::CpuTiling{}.tile_vectors, 1, 6};
    // 0: the target's default (attn_sched::default_query_block).
    Halide::GeneratorParam<int> query_block{"query_block", 0, 0, 1024};
    Halide::GeneratorParam<int> context_vectors{"context_vectors", attn_sched::CpuTiling{}.context_vectors, 1, 6};
    // Keys per block of the flash core (the fused layer without probabilities; its query
    // blocks are query_block); 0: the target's default (attn_sched::default_key_block).
    Halide::GeneratorParam<int> key_block{"key_block", 0, 0, 4096};

    attn_sched::CpuTiling tiling() const {
        const attn_gen::Blocking b = blocking();
        return {int(tile_rows), int(tile_vectors), b.query_block, b.key_block, int(context_vectors)};
    }
    attn_gen::Blocking blocking() const {
        const Halide::Target &t = this->get_target();
        return {attn_sched::default_query_block(t, query_block), attn_sched::default_key_block(t, key_block),
                attn_sched::key_chunk(t, tile_vectors)};
    }

    int estimate_batch() const {
        return this->get_target().has_gpu_feature() ? kEstimateBatchGpu : kEstimateBatchCpu;
    }
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
        const std::string name = self.stage_name();
        switch (attn_sched::schedule_kind(name, schedule_source, this->get_target())) {
        case attn_sched::ScheduleKind::manual_cpu:
            self.schedule_manual_cpu();
            break;
        case attn_sched::ScheduleKind::manual_gpu:
            self.schedule_manual_gpu();
            break;
        case attn_sched::ScheduleKind::frozen:
            attn_sched::apply_frozen_schedule(name, schedule_source, this->get_pipeline(),
                                              this->get_target());
            break;
        case attn_sched::ScheduleKind::autoscheduled:
            attn_sched::apply_autoscheduler(schedule_source, this->get_pipeline(), this->get_target());
            break;
        }
    }
};

}  // namespace attn_gen
