// The comparison's cases: <function>/<implementation>/<problem> (functions of
// manifest.json), e.g. attention_layer/manual_avx2/b1_s128_h768_n12, each made ready on
// demand: its problem's inputs and reference (built once per problem), the call, and the
// check of its first result against the reference (DESIGN.md's accuracy rule) before it
// is timed. The timing itself is the caller's (serve.cpp, attn_bench.cpp).
#pragma once

#include "attn/function_calls.h"
#include "problems/problem.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace attn::bench {

// The fused layer's function.
inline const char *const kLayerFunction = "attention_layer";

// The work of a function's call on a problem (its by-name call's: GEMM FLOPs and bytes);
// of a packed problem, the sum over its sequences.
using Work = detail::CallWork;
Work work(const std::string &function, const testing::Problem &p);

// Each sequence's real length, per problem (built once: LayerData draws the inputs).
const std::vector<int64_t> &lengths_of(const testing::Problem &p);

// One implementation made ready on one problem: `run` does the timed work once; `error`
// says why it is not timed (it refused the shape, or its output broke the accuracy rule).
struct Prepared {
    std::function<void()> run;
    std::string error;
    double max_error = -1;  // against the reference; -1 when the problem has none
};

// A problem's inputs for every function and their references, built on first use: its
// data; the stages' inputs (x for q, k, v and ctx, seeded scores and probabilities of the
// S×S shape at short contexts); a packed problem's real tokens.
struct Fixture {
    testing::LayerData data;
    bool reference_checked;
    std::vector<float> scores, probs;
    PackedBatch packed;
    detail::CallInputs inputs;  // host memory

    explicit Fixture(const testing::ListedProblem &lp);
    // The reference of a function's outputs on these inputs (computed once), or null when
    // the problem is too large for the double reference.
    const detail::CallReference *reference(const std::string &function);

private:
    std::map<std::string, std::unique_ptr<detail::CallReference>> references;
};
Fixture &fixture(const testing::ListedProblem &lp);
// Frees every fixture; the cases prepared on them must be gone first.
void release_fixtures();

// Applies the accuracy rule when there is a reference (`exact` not empty): an error
// message when the output is wrong, "" otherwise.
// `allowance`: a reduced precision's (detail::CallReference::allowance).
std::string accuracy_error(Prepared &prepared, const float *actual, const std::vector<double> &exact,
                           const std::vector<float> &plain, const std::string &who,
                           const std::vector<double> &allowance = {});

// One benchmark case, made ready on demand.
struct Case {
    std::string name, function;
    const testing::ListedProblem *problem;
    std::function<Prepared()> prepare;
};

// Every case: each variant (OpenCL ones aside: they run the GPU schedules on PoCL in
// CI, to check them; a CPU's OpenCL says nothing about a GPU) fused and by stage, and
// the OpenBLAS peers beside them.
std::vector<Case> all_cases(const std::vector<VariantInfo> &variant_list);

}  // namespace attn::bench
