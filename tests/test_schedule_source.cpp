// The schedule-source switch: a frozen schedule that no longer matches the algorithm,
// or one that was never frozen, fails generation with the command that regenerates it.
#include "../schedules/schedule_source.h"

#include "attn/generated/manifest.h"

#include <gtest/gtest.h>

namespace {

const Halide::Target kAvx2("x86-64-linux-sse41-avx-avx2-fma-f16c");

std::string compile_error(const std::string &function, const std::string &source, Halide::Pipeline pipeline,
                          const Halide::Target &target) {
    try {
        attn_sched::apply_frozen_schedule(function, source, pipeline, target);
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
    EXPECT_NE(error.find("Stale frozen schedule generated/frozen/adams2019/avx2/attention_scores.schedule.h"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("tools/freeze_schedules.sh --sources adams2019 --isas avx2 --functions attention_scores"),
              std::string::npos)
        << error;
}

TEST(FrozenSchedule, MissingScheduleNamesTheFileAndTheCommand) {
    Halide::Var x("x");
    Halide::Func f("f");
    f(x) = x;
    const Halide::Target skylake("x86-64-linux-sse41-avx-avx2-fma-f16c-avx512-avx512_skylake");
    const std::string error = compile_error("attention_layer", "mullapudi2016", Halide::Pipeline(f), skylake);
    EXPECT_NE(error.find("generated/frozen/mullapudi2016/avx512_skylake/attention_layer.schedule.h"), std::string::npos)
        << error;
    EXPECT_NE(error.find("tools/freeze_schedules.sh --sources mullapudi2016 --isas avx512_skylake"), std::string::npos)
        << error;
}

TEST(ScheduleKind, ComesFromTheSourceKindInTheManifest) {
    const Halide::Target cuda("x86-64-linux-sse41-cuda-cuda_capability_80");
    EXPECT_EQ(attn_sched::schedule_kind("manual", kAvx2), attn_sched::ScheduleKind::manual_cpu);
    EXPECT_EQ(attn_sched::schedule_kind("manual", cuda), attn_sched::ScheduleKind::manual_gpu);
    EXPECT_EQ(attn_sched::schedule_kind("adams2019", kAvx2), attn_sched::ScheduleKind::frozen);
    EXPECT_EQ(attn_sched::schedule_kind("li2018", kAvx2), attn_sched::ScheduleKind::autoscheduled);
    for (const char *not_a_source : {"autotuned", "best"}) {  // a tuned variant is built as manual
        try {
            attn_sched::schedule_kind(not_a_source, kAvx2);
            ADD_FAILURE() << not_a_source << " was accepted";
        } catch (const Halide::CompileError &e) {
            EXPECT_NE(std::string(e.what()).find("manifest.json has manual, mullapudi2016"), std::string::npos)
                << e.what();
        }
    }
}

TEST(FrozenIsa, IsTheManifestIsaWithMostOfTheTargetsFeatures) {
    EXPECT_EQ(attn_sched::frozen_isa(Halide::Target("x86-64-linux-sse41")), "sse41");
    EXPECT_EQ(attn_sched::frozen_isa(kAvx2), "avx2");
    EXPECT_EQ(attn_sched::frozen_isa(Halide::Target("x86-64-linux-sse41-avx-avx2-fma-f16c-avx512-avx512_skylake-"
                                                    "avx512_cannonlake-avx512_zen4")),
              "avx512_zen4");
    // A GPU target of another capability still takes the CUDA schedules; OpenCL reuses them.
    EXPECT_EQ(attn_sched::frozen_isa(Halide::Target("x86-64-linux-sse41-cuda-cuda_capability_86")), "cuda");
    EXPECT_EQ(attn_sched::frozen_isa(Halide::Target("x86-64-linux-sse41-opencl")), "cuda");
    EXPECT_EQ(attn_sched::frozen_isa(Halide::Target("arm-64-linux")), "arm64");
}

// The runtime prepares a CPU layer's fp32 weights in panels of the manifest's f32_lanes
// (tools/manifest.py), which the layer generator reads in panels of Halide's vector of floats.
TEST(Manifest, F32LanesAreHalides) {
    for (const attn::manifest::Isa &isa : attn::manifest::kIsas) {
        const Halide::Target target(isa.halide_target);
        EXPECT_EQ(isa.f32_lanes, target.has_gpu_feature() ? 0 : target.natural_vector_size<float>()) << isa.name;
    }
}

TEST(ManualParameter, OutOfRangeFailsNamingTheParameterAndZeroTakesTheTargetsDefault) {
    const Halide::Target cpu("x86-64-linux-avx2"), gpu("x86-64-linux-sse41-cuda"), arm("arm-64-linux");
    EXPECT_EQ(attn_sched::manual_parameter_for(cpu, "tile_vectors", 4), 4);
    try {
        attn_sched::manual_parameter_for(cpu, "tile_vectors", 0);  // would divide by zero in the schedule
        FAIL() << "tile_vectors=0 accepted";
    } catch (const Halide::CompileError &e) {
        EXPECT_NE(std::string(e.what()).find("tile_vectors=0: expected 1 to 6 (manifest.json: manual_parameters)"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_THROW(attn_sched::manual_parameter_for(cpu, "query_block", 2048), Halide::CompileError);
    EXPECT_EQ(attn_sched::manual_parameter_for(gpu, "query_block", 0), 16);
    EXPECT_EQ(attn_sched::manual_parameter_for(cpu, "query_block", 0), 64);
    EXPECT_EQ(attn_sched::manual_parameter_for(arm, "tile_rows", 0), 8);
}

}  // namespace
