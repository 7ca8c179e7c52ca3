// One problem descriptor for tests and benchmarks (benchdnn style): its name, e.g.
// "b1_s128_h768_n12_pad", says the shape and masks, and it builds seeded inputs.
#pragma once

#include "attn/attention.h"
#include "attn/reference.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace attn::testing {

enum class Mask {
    none,
    padding,      // each batch keeps a seeded number of real tokens, at least one
    one_real,     // only the first key is real
    empty_batch,  // batch 0 has no real key: every row of it is fully masked
    squad,        // seeded lengths like SQuAD's BERT features (see problem.cpp)
};

struct Problem {
    int64_t batch = 1, s_q = 128, s_k = 128, hidden = 768, heads = 12;
    bool cross = false;  // keys and values from a separate kv of length s_k
    bool causal = false;
    Mask mask = Mask::none;
    bool bias = false;  // additive bias [1, heads, S_q, S_k]
    // Packed variable-length sequences: the real tokens of the padded batch this problem
    // otherwise is (its mask's lengths), run by Attention::forward_packed. Self-attention.
    bool packed = false;

    std::string name() const;
    Config config() const;
    ProblemExtents extents() const;  // of a dense call (a packed one's depend on its lengths)
};

// Seeded inputs for a problem, with views for the API.
struct LayerData {
    Problem problem;
    std::vector<float> x, kv, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, gamma, beta, bias;
    std::vector<uint8_t> mask;

    explicit LayerData(const Problem &problem, uint32_t seed = 1234);
    LayerWeights weights() const;
    AttentionInputs inputs() const;
    // Each sequence's real length (the mask's), and the real tokens packed (attn::pack).
    std::vector<int64_t> lengths() const;
    PackedBatch packed() const;
};

// Output storage with guard zones before and after, filled with a sentinel, to
// catch out-of-bounds writes.
class GuardedOutput {
public:
    explicit GuardedOutput(Shape shape);
    MutableTensor view() { return {data_.data() + kGuard, size_, shape_}; }
    const float *data() const { return data_.data() + kGuard; }
    std::size_t size() const { return size_; }
    bool guards_intact() const;

private:
    static constexpr std::size_t kGuard = 64;
    Shape shape_;
    std::size_t size_;
    std::vector<float> data_;
};

// The accuracy rule of DESIGN.md: the error of `actual` against the double reference
// may be at most twice that of the plain float32 implementation, plus a small floor.
// max_error: the worst element's (the largest error; with an allowance, the error nearest its
// own tolerance), tolerance and allowance: that element's.
struct Accuracy {
    double max_error = 0, mean_error = 0, tolerance = 0, allowance = 0;
    std::size_t worst_index = 0;
    double worst_actual = 0, worst_reference = 0;
    bool ok = false;
    bool per_element = false;  // an allowance per element was given
    std::string report(const std::string &what) const;
};
constexpr double kAbsoluteFloor = 1e-5;
// `allowance`: per element, added to its tolerance for a reduced precision's rounding of a
// computed activation (reference::context_allowance); empty in fp32. With one, the worst
// element is the one nearest its own tolerance, and the report states its allowance.
Accuracy check_accuracy(const float *actual, const std::vector<double> &reference,
                        const std::vector<float> &plain_float32, const std::vector<double> &allowance = {});

double median(std::vector<double> samples);
// A distribution-free confidence interval of the median: the order statistics
// x_(k), x_(n+1-k) that cover it with probability at least `level` (bench/report.py
// computes the same).
std::pair<double, double> median_interval(std::vector<double> samples, double level = 0.9);

// The problem list shared by the tests and the benchmarks (benchdnn style). Each
// entry says which model it comes from; `reference_checked` entries are cheap
// enough for the double reference in every test run (long contexts are not: they
// are checked in the tests at a smaller hidden size, see test_layer.cpp).
struct ListedProblem {
    Problem problem;
    const char *model;
    bool reference_checked;
};
const std::vector<ListedProblem> &problem_list();

}  // namespace attn::testing
