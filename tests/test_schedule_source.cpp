// The schedule-source switch: a frozen schedule that no longer matches the algorithm,
// or one that was never frozen, fails generation with the command that regenerates it.
#include "../schedules/schedule_source.h"

#include <gtest/gtest.h>

namespace {

const Halide::Target kAvx2("x86-64-linux-sse41-avx-avx2-fma-f16c");

std::string compile_error(const std::string &generator, const std::string &source, Halide::Pipeline pipeline,
                          const Halide::Target &target) {
    try {
        attn_sched::apply_frozen_schedule(generator, source, pipeline, target);
    } catch (const Halide::CompileError &e) {
        return e.what();
    }
    return "";
}

TEST(FrozenSchedule, StaleScheduleFailsWithTheRegenerateCommand) {
    // Not the attention_scores algorithm: stage 6 (the frozen schedule's `dot`) is missing.
    Halide::Var x("x");
    Halide::Func renamed("renamed");
    renamed(x) = x;
    const std::string error = compile_error("attention_scores", "adams2019", Halide::Pipeline(renamed), kAvx2);
    EXPECT_NE(error.find("Stale frozen schedule schedules/frozen/adams2019/avx2/attention_scores.schedule.h"),
              std::string::npos) << error;
    EXPECT_NE(error.find("tools/freeze_schedules.sh --sources adams2019 --isas avx2 --stages attention_scores"),
              std::string::npos) << error;
}

TEST(FrozenSchedule, MissingScheduleNamesTheFileAndTheCommand) {
    Halide::Var x("x");
    Halide::Func f("f");
    f(x) = x;
    const Halide::Target skylake("x86-64-linux-sse41-avx-avx2-fma-f16c-avx512-avx512_skylake");
    const std::string error = compile_error("self_attention", "mullapudi2016", Halide::Pipeline(f), skylake);
    EXPECT_NE(error.find("schedules/frozen/mullapudi2016/avx512_skylake/self_attention.schedule.h"),
              std::string::npos) << error;
    EXPECT_NE(error.find("tools/freeze_schedules.sh --sources mullapudi2016 --isas avx512_skylake"),
              std::string::npos) << error;
}

TEST(ScheduleKind, ManualIsHandWrittenAndOtherSourcesAreFrozenOrAutoscheduled) {
    EXPECT_EQ(attn_sched::schedule_kind("self_attention", "manual", kAvx2), attn_sched::ScheduleKind::manual_cpu);
    EXPECT_EQ(attn_sched::schedule_kind("self_attention", "adams2019", kAvx2), attn_sched::ScheduleKind::frozen);
    EXPECT_EQ(attn_sched::schedule_kind("self_attention", "li2018", kAvx2), attn_sched::ScheduleKind::autoscheduled);
}

}  // namespace
