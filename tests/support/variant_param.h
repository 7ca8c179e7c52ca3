// Test parameters: every variant in the variant list × a problem list. Tests for a
// variant this CPU cannot run are skipped with the reason, never passed silently.
#pragma once

#include "attn/generated/manifest.h"
#include "problems/problem.h"

#include <gtest/gtest.h>

#include <algorithm>
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

#define ATTN_SKIP_IF_NOT_RUNNABLE(variant)                                   \
    if (!(variant).runnable)                                                 \
    GTEST_SKIP() << "variant " << (variant).name << " (" << (variant).target \
                 << ") cannot run on this machine: " << (variant).not_runnable_reason

// Whether the variant provides the manifest function (VariantInfo::functions, from
// manifest.json's not_provided).
inline bool provides(const VariantInfo &variant, const std::string &function) {
    return std::find(variant.functions.begin(), variant.functions.end(), function) != variant.functions.end();
}

// Runs `call`, a call of the variant's `function`; false when the variant does not run it,
// in one of two checked ways:
// - the variant does not provide the function (manifest.json): the call must be refused
//   with attn::Error("variant") saying so;
// - an autoscheduled variant (a frozen or in-process schedule source) and a shape smaller
//   than the tiles of its schedule, made for BERT-base sizes (H=768, S=128): their
//   ShiftInwards splits assume every extent is at least a tile, and Halide refuses the
//   call before computing anything, naming the buffer ("... is accessed at -63, which is
//   before the min (0) ..."). (Comparisons issue, part 2, makes these shapes run.)
// A refusal from a hand-written or tuned variant, or any other error, propagates.
template <typename Call>
bool ran_or_refused(const VariantInfo &variant, const std::string &function, Call &&call) {
    if (!provides(variant, function)) {
        try {
            call();
        } catch (const Error &e) {
            EXPECT_EQ(e.argument(), "variant") << e.what();
            EXPECT_NE(std::string(e.what()).find("does not provide " + function), std::string::npos) << e.what();
            std::cout << "[ REFUSED  ] " << variant.name << " does not provide " << function << ": " << e.what()
                      << "\n";
            return false;
        }
        ADD_FAILURE() << variant.name << " ran " << function << ", which manifest.json says it does not provide";
        return false;
    }
    try {
        call();
        return true;
    } catch (const Error &e) {
        const std::string what = e.what();
        bool autoscheduled = false;
        for (const manifest::ScheduleSource &s : manifest::kScheduleSources) {
            if (variant.schedule == s.name) autoscheduled = s.autoscheduler[0] != '\0';
        }
        const bool small_shape_refusal =
            autoscheduled && e.argument() == "halide" && what.find(" is accessed at ") != std::string::npos;
        if (!small_shape_refusal) throw;
        ::testing::Test::RecordProperty("refused", what);
        std::cout << "[ REFUSED  ] " << variant.name << " refuses this shape (smaller than its tiles): " << what
                  << "\n";
        return false;
    }
}
#define ATTN_RUN_OR_REFUSE(variant, function, ...) \
    if (!::attn::testing::ran_or_refused((variant), (function), [&] { __VA_ARGS__; })) return

// The fused layer's function for a call with or without the probabilities.
inline std::string layer_function(bool with_probs) { return with_probs ? "attention_layer_probs" : "attention_layer"; }

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
