// Test parameters: every variant in the variant list × a problem list. Tests for a
// variant this CPU cannot run are skipped with the reason, never passed silently.
#pragma once

#include "problem.h"

#include <gtest/gtest.h>

#include <iostream>
#include <ostream>
#include <tuple>

namespace attn::testing {

using VariantProblem = std::tuple<VariantInfo, Problem>;

// Readable parameters in test output.
inline void PrintTo(const Problem &p, std::ostream *os) { *os << p.name(); }

inline std::string variant_problem_name(const ::testing::TestParamInfo<VariantProblem> &info) {
    return std::get<0>(info.param).name + "__" + std::get<1>(info.param).name();
}

#define ATTN_SKIP_IF_NOT_RUNNABLE(variant)                                                          \
    if (!(variant).runnable)                                                                       \
    GTEST_SKIP() << "variant " << (variant).name << " (" << (variant).target                        \
                 << ") cannot run on this machine: " << (variant).not_runnable_reason

// Autoscheduled variants come from schedules made for BERT-base sizes (H=768, S=128):
// their tiles (ShiftInwards splits) assume every extent is at least a tile, and on a
// smaller shape Halide refuses the call before computing anything, naming the buffer
// ("... is accessed at -63, which is before the min (0) ...", or "at 6, which is beyond
// the max (3)" for 4 heads in a tile of 8). For those variants that
// refusal is the checked outcome on such shapes: ran_or_refused() returns false and
// the test ends there as passed, after its outputs are checked untouched by the
// caller. A refusal from a hand-written or autotuned variant, or any other error,
// propagates.
template <typename Call>
bool ran_or_refused(const VariantInfo &variant, Call &&call) {
    try {
        call();
        return true;
    } catch (const Error &e) {
        const std::string what = e.what();
        // Hand-written and autotuned (hand-written parameters) schedules run every shape.
        const bool autoscheduled = variant.schedule != "manual" && variant.schedule != "autotuned";
        const bool small_shape_refusal = autoscheduled && e.argument() == "halide" &&
                                         what.find(" is accessed at ") != std::string::npos;
        // A function the autoscheduler could not schedule (ATTN_MISSING_<source> in
        // cmake/AttnVariants.cmake) is reported, never computed.
        const bool not_provided = autoscheduled && e.argument() == "halide" &&
                                  what.find("does not provide this function") != std::string::npos;
        if (not_provided) {
            std::cout << "[ REFUSED  ] " << variant.name << " does not provide this function: " << what << "\n";
            return false;
        }
        if (!small_shape_refusal) throw;
        ::testing::Test::RecordProperty("refused", what);
        std::cout << "[ REFUSED  ] " << variant.name << " refuses this shape (smaller than its tiles): " << what
                  << "\n";
        return false;
    }
}
#define ATTN_RUN_OR_REFUSE(variant, ...) \
    if (!::attn::testing::ran_or_refused((variant), [&] { __VA_ARGS__; })) return

// Whether a variant gives the same bits for the same input on every run. Li2018's GPU
// schedules sum the LayerNorm statistics with float atomics (compare-and-swap loops
// across GPU threads), so the order of those additions, and the last bits of the
// output, vary from run to run; every other schedule is reproducible.
inline bool bitwise_reproducible(const VariantInfo &variant) {
    return !(variant.schedule == "li2018" && variant.device != "cpu");
}

// The double reference and the plain float32 run of a problem, computed once per problem.
struct ReferenceRun {
    reference::LayerOutputs<double> exact;
    reference::LayerOutputs<float> float32;
};
const ReferenceRun &reference_run(const LayerData &data);

// Applies the accuracy rule to an output and checks nothing was written around it.
inline void expect_matches_reference(const char *what, const GuardedOutput &out, const std::vector<double> &exact,
                                     const std::vector<float> &float32) {
    const Accuracy a = check_accuracy(out.data(), exact, float32);
    EXPECT_TRUE(a.ok) << a.report(what);
    EXPECT_TRUE(out.guards_intact()) << what << ": written outside its buffer";
}

}  // namespace attn::testing

namespace attn {
inline void PrintTo(const VariantInfo &v, std::ostream *os) { *os << v.name; }
}  // namespace attn
