// Test parameters: every variant in the variant list × a problem list. Tests for a
// variant this CPU cannot run are skipped with the reason, never passed silently.
#pragma once

#include "attn/internal.h"
#include "problems/problem.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <ostream>
#include <vector>
#include <tuple>

namespace attn::testing {

using VariantProblem = std::tuple<VariantInfo, Problem>;

// The variants the variant suites run: the compiled ones, then any tuning candidate the
// run was given (--candidate=LIBRARY:SUFFIX:ISA, support/gtest_main.cpp).
inline std::vector<VariantInfo> tested_variants() {
    std::vector<VariantInfo> out;
    for (const VariantInfo *v : detail::compiled_and_registered_variants()) out.push_back(*v);
    return out;
}

// Readable parameters in test output.
inline void PrintTo(const Problem &p, std::ostream *os) { *os << p.name(); }

inline std::string variant_problem_name(const ::testing::TestParamInfo<VariantProblem> &info) {
    return std::get<0>(info.param).name + "__" + std::get<1>(info.param).name();
}

#define ATTN_SKIP_IF_NOT_RUNNABLE(variant)                                   \
    if (!(variant).runnable)                                                 \
    GTEST_SKIP() << "variant " << (variant).name << " (" << (variant).target \
                 << ") cannot run on this machine: " << (variant).not_runnable_reason

// Runs `call`, a call of the variant's `function`; false when the variant does not
// provide the function (manifest.json: not_provided), and then the call must be refused
// with attn::Error("variant") saying so. Every variant runs every shape of a function it
// provides (below a variant's min_shapes, with its fallback's kernels): any error there
// fails the test.
template <typename Call>
bool ran_or_refused(const VariantInfo &variant, const std::string &function, Call &&call) {
    if (variant.provides(function)) {
        call();
        return true;
    }
    const std::string refusal = "does not provide " + function;
    try {
        call();
    } catch (const Error &e) {
        EXPECT_EQ(e.argument(), "variant") << e.what();
        EXPECT_NE(std::string(e.what()).find(refusal), std::string::npos) << e.what();
        std::cout << "[ REFUSED  ] " << variant.name << " (" << refusal << "): " << e.what() << "\n";
        return false;
    }
    ADD_FAILURE() << variant.name << " ran " << function << ", which manifest.json says it does not provide";
    return false;
}
#define ATTN_RUN_OR_REFUSE(variant, function, ...) \
    if (!::attn::testing::ran_or_refused((variant), (function), [&] { __VA_ARGS__; })) return

// The declared minimum of every variant with min_shapes (manifest.json), as test cases:
// for each function it bounds (the fused layer's, or the stages'), the variant with the
// smallest problem its own kernels run (d raised where heads·d must reach H). The tests
// run them against the reference, so a minimum declared too low fails; below it, the
// matrix runs the fallback.
inline std::vector<VariantProblem> min_shape_cases(bool fused_layer) {
    std::vector<VariantProblem> cases;
    for (const VariantInfo &v : variants()) {
        for (const auto &[function, m] : v.min_shapes) {
            if ((function.rfind("attention_layer", 0) == 0) != fused_layer) continue;
            Problem p;
            p.batch = m.batch, p.s_q = m.seq_q, p.s_k = m.seq_k, p.heads = m.heads;
            p.hidden = std::max(m.head_dim, (m.hidden + m.heads - 1) / m.heads) * m.heads;
            p.cross = p.s_q != p.s_k;
            const bool seen = std::any_of(cases.begin(), cases.end(), [&](const VariantProblem &c) {
                return std::get<0>(c).name == v.name && std::get<1>(c).name() == p.name();
            });
            if (!seen) cases.emplace_back(v, p);
        }
    }
    return cases;
}

// The fused layer's function for a call with or without the probabilities.
inline std::string layer_function(bool with_probs) { return with_probs ? "attention_layer_probs" : "attention_layer"; }

// The variants with a layer in `precision` (attn::precision_variants()), as test parameters.
inline std::vector<VariantInfo> precision_variant_list(Precision precision) {
    std::vector<VariantInfo> out;
    for (const VariantInfo *v : precision_variants(precision)) out.push_back(*v);
    return out;
}

// The double reference and the plain float32 run of a problem, computed once per problem.
struct ReferenceRun {
    reference::LayerOutputs<double> exact;
    reference::LayerOutputs<float> float32;
};
const ReferenceRun &reference_run(const LayerData &data);
// The same for packed sequences, computed once per `key` (which names the data).
struct PackedReferenceRun {
    reference::PackedOutputs<double> exact;
    reference::PackedOutputs<float> float32;
};
const PackedReferenceRun &packed_reference_run(const std::string &key, const Config &config,
                                               const LayerWeights &weights, const PackedInputs &inputs);

// Applies the accuracy rule to an output and checks nothing was written around it.
inline void expect_matches_reference(const char *what, const GuardedOutput &out, const std::vector<double> &exact,
                                     const std::vector<float> &float32, const std::vector<double> &allowance = {}) {
    const Accuracy a = check_accuracy(out.data(), exact, float32, allowance);
    EXPECT_TRUE(a.ok) << a.report(what);
    EXPECT_TRUE(out.guards_intact()) << what << ": written outside its buffer";
}

}  // namespace attn::testing

namespace attn {
inline void PrintTo(const VariantInfo &v, std::ostream *os) { *os << v.name; }
}  // namespace attn
