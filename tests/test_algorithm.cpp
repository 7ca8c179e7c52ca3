// Pieces of the algorithm checked alone, JIT-compiled for this machine.
#include "../algorithm/attention_algorithm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

using namespace Halide;

struct ExpError {
    double relative = 0, absolute = 0;
};

// The largest errors of `exp` over every 16th float in [-87, 0] (70 million of them, every
// exponent's), against exp in double.
ExpError exp_error(Expr (*exp)(Expr), const Target &target) {
    const uint32_t magnitude_87 = 0x42ae0000u;
    const int count = int(magnitude_87 / 16) + 1;
    Var i("i");
    Func t("t"), e("e");
    t(i) = reinterpret<float>(cast<uint32_t>(i * 16) | Expr(0x80000000u));  // -0 down to -87
    e(i) = exp(t(i));
    e.vectorize(i, 8);
    Buffer<float> out = e.realize({count}, target);
    ExpError worst;
    for (int n = 0; n < count; ++n) {
        const uint32_t bits = uint32_t(n) * 16u | 0x80000000u;
        float x;
        std::memcpy(&x, &bits, sizeof x);
        const double exact = std::exp(double(x)), error = std::abs(out(n) - exact);
        worst.relative = std::max(worst.relative, error / exact);
        worst.absolute = std::max(worst.absolute, error);
    }
    return worst;
}

Expr halide_fast_exp(Expr t) { return fast_exp(t); }

// attn_gen::exp_nonpositive's documented bounds (over every float of [-87, 0]: 4.25e-7
// relatively with fused multiply-adds, 4.22e-6 without, 1.79e-7 absolutely either way), and
// below Halide's fast_exp, which it replaced in the flash core, on each count.
void expect_within_bounds(const Target &target, double relative_bound) {
    const ExpError ours = exp_error(attn_gen::exp_nonpositive, target), theirs = exp_error(halide_fast_exp, target);
    EXPECT_LT(ours.relative, relative_bound);
    EXPECT_LT(ours.absolute, 1.8e-7);
    EXPECT_LT(ours.relative, theirs.relative);
    EXPECT_LT(ours.absolute, theirs.absolute);
}

TEST(ExpNonpositive, WithinItsBoundsWithFusedMultiplyAdds) {
    const Target host = get_jit_target_from_environment();
    if (!host.has_feature(Target::FMA) && host.arch == Target::X86) GTEST_SKIP() << "no FMA on this CPU";
    expect_within_bounds(host, 4.3e-7);
}

TEST(ExpNonpositive, WithinItsBoundsWithoutFusedMultiplyAdds) {
    if (get_jit_target_from_environment().arch != Target::X86)
        GTEST_SKIP() << "the unfused check JIT-compiles for x86's SSE4.1, which has no FMA";
    expect_within_bounds(Target("x86-64-linux-sse41-jit"), 4.3e-6);
}

}  // namespace
