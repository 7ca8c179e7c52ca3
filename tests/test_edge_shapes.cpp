// Every variant's every function on the shapes at the edges of its loops: one token, an
// empty sequence, and batches, lengths, head dims and widths that are multiples of no
// vector width (7, 13, 5, 20, 60), so that every split, vector and tile of every schedule
// (hand-written, autoscheduled, tuned) runs past an edge somewhere. A schedule may compute
// more than it needs there, but must read and write only inside its buffers and give the
// reference's results. Runs every variant this CPU (and OpenCL device) can run, AVX-512
// included where the CPU has it.
#include <algorithm>

#include "attn/generated/manifest.h"
#include "support/function_check.h"

namespace attn::testing {
namespace {

struct EdgeShape {
    const char *name;
    Problem problem;
};

std::vector<EdgeShape> edge_shapes() {
    auto make = [](int64_t batch, int64_t s_q, int64_t s_k, int64_t hidden, int64_t heads, Mask mask, bool causal,
                   bool bias) {
        Problem p;
        p.batch = batch, p.s_q = s_q, p.s_k = s_k, p.hidden = hidden, p.heads = heads;
        p.cross = s_q != s_k, p.mask = mask, p.causal = causal, p.bias = bias;
        return p;
    };
    return {
        {"one_token", make(1, 1, 1, 32, 2, Mask::none, false, false)},
        // Sequence 0 is empty (packed: a zero-length sequence), sequence 1 one token.
        {"empty_and_one_token", make(2, 1, 1, 32, 2, Mask::empty_batch, true, false)},
        // d = 20, H = 60: the head dim and width are multiples of no AVX vector.
        {"odd_lengths_padded_causal_bias", make(3, 7, 7, 60, 3, Mask::padding, true, true)},
        {"odd_batch_with_an_empty_sequence", make(5, 13, 13, 40, 2, Mask::empty_batch, false, false)},
        // d = 10, H = 30: of no vector at all (4 floats), so the last panel of the prepared
        // weights (attn_gen::WeightLayout::panels) ends in zeros on every ISA.
        {"cross_odd_lengths_causal", make(2, 5, 11, 30, 3, Mask::padding, true, false)},
    };
}

using VariantFunction = std::tuple<VariantInfo, std::string>;

std::vector<VariantFunction> variant_functions() {
    std::vector<VariantFunction> cases;
    for (const VariantInfo &v : tested_variants())
        for (const manifest::Function &f : manifest::kFunctions) cases.emplace_back(v, f.name);
    return cases;
}

class EdgeShapeTest : public ::testing::TestWithParam<VariantFunction> {};

TEST_P(EdgeShapeTest, MatchesReference) {
    const auto &[variant, function] = GetParam();
    ATTN_SKIP_IF_NOT_RUNNABLE(variant);
    for (const EdgeShape &shape : edge_shapes()) {
        if (!function_applies(function, shape.problem)) continue;
        SCOPED_TRACE(variant.name + " " + function + " on " + shape.name + " (" + shape.problem.name() + ")");
        check_function(variant, function, shape.problem);
        if (HasFatalFailure()) return;
    }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, EdgeShapeTest, ::testing::ValuesIn(variant_functions()),
                         [](const ::testing::TestParamInfo<VariantFunction> &info) {
                             return std::get<0>(info.param).name + "__" + std::get<1>(info.param);
                         });

// One test per variant, registered with CTest on its own (tests/CMakeLists.txt), so that
// ctest's summary lists each variant this machine cannot run as skipped, with the reason,
// while the suites above run their cases in one process each.
class VariantTest : public ::testing::TestWithParam<VariantInfo> {};

// The fp32 layer, or else the first layer the variant has (an ISA built for reduced
// precisions only: manifest.json's precisions); a variant with none must refuse the fp32 one.
TEST_P(VariantTest, RunsTheLayerHere) {
    ATTN_SKIP_IF_NOT_RUNNABLE(GetParam());
    const VariantInfo &v = GetParam();
    std::string layer = "attention_layer";
    const auto other = std::find_if(v.functions.begin(), v.functions.end(),
                                    [](const std::string &f) { return f.rfind("attention_layer", 0) == 0; });
    if (!v.provides(layer) && other != v.functions.end()) layer = *other;
    check_function(v, layer, edge_shapes().front().problem);
}

INSTANTIATE_TEST_SUITE_P(EachVariant, VariantTest, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<VariantInfo> &info) { return info.param.name; });

}  // namespace
}  // namespace attn::testing
