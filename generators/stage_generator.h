// Base of every attention generator: the `schedule` parameter picks the schedule
// source (see schedules/schedule_source.h); generate() in the subclass holds only the
// algorithm and its estimates.
#pragma once

#include "../schedules/schedule_source.h"
#include "attention_algorithm.h"

#include <string>

namespace attn_gen {

// Estimates: a BERT-base layer (H = 768, 12 heads, S = 128, B = 1).
constexpr int kEstimateHidden = 768;
constexpr int kEstimateHeads = 12;
constexpr int kEstimateSeq = 128;
constexpr int kEstimateBatch = 1;

template <typename T>
class StageGenerator : public Halide::Generator<T> {
public:
    Halide::GeneratorParam<std::string> schedule_source{"schedule", "manual"};

    void schedule() {
        if (this->using_autoscheduler()) return;
        T &self = *static_cast<T *>(this);
        const std::string name = self.stage_name();
        switch (attn_sched::schedule_kind(name, schedule_source, this->get_target())) {
        case attn_sched::ScheduleKind::manual_cpu:
            self.schedule_manual_cpu();
            break;
        case attn_sched::ScheduleKind::manual_gpu:
            throw Halide::CompileError("No hand-written GPU schedule for " + name + " yet.");
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
