// Test parameters: every variant in the variant list × a problem list. Tests for a
// variant this CPU cannot run are skipped with the reason, never passed silently.
#pragma once

#include "problem.h"

#include <gtest/gtest.h>

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
