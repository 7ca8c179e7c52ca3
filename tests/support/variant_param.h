// Test parameters: every variant in the variant list × a problem list. Tests for a
// variant this CPU cannot run are skipped with the reason, never passed silently.
#pragma once

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

// Runs `call`, a call of the variant's `function`; false when the variant does not run
// it, in one of two ways manifest.json declares, each checked:
// - the variant does not provide the function (not_provided): the call must be refused
//   with attn::Error("variant") saying so;
// - the variant's tiles limit its shapes (shape_limited_on, VariantInfo::runs_every_shape()
//   false): a shape smaller than its tiles may be refused with attn::Error("variant")
//   saying so, and nothing else.
// Every other variant runs every shape: any error fails the test.
template <typename Call>
bool ran_or_refused(const VariantInfo &variant, const std::string &function, Call &&call) {
    const bool provided = provides(variant, function);
    if (provided && variant.runs_every_shape()) {
        call();
        return true;
    }
    const std::string refusal = provided ? "cannot run this shape" : "does not provide " + function;
    try {
        call();
    } catch (const Error &e) {
        EXPECT_EQ(e.argument(), "variant") << e.what();
        EXPECT_NE(std::string(e.what()).find(refusal), std::string::npos) << e.what();
        std::cout << "[ REFUSED  ] " << variant.name << " (" << refusal << "): " << e.what() << "\n";
        return false;
    }
    if (!provided) ADD_FAILURE() << variant.name << " ran " << function << ", which manifest.json says it does not provide";
    return provided;
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
