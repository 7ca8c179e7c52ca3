// One call of one manifest function of a variant on a problem, checked against the
// double reference by the accuracy rule (and for writes outside its outputs): the body
// every per-function test shares. The call and its reference are the function's by-name
// entry (attn/function_calls.h); the stages take the plain float32 layer's intermediates
// as inputs, the packed functions the problem's real tokens (its mask's lengths), packed,
// with its bias as [heads, S, S].
#pragma once

#include "attn/function_calls.h"
#include "variant_param.h"

#include <string>

namespace attn::testing {

// Whether `function` has a call on `problem`: the packed ones are self-attention only.
bool function_applies(const std::string &function, const Problem &problem);

// Runs and checks; a variant that does not provide the function must refuse the call
// (ran_or_refused). Failures are reported through gtest.
void check_function(const VariantInfo &variant, const std::string &function, const Problem &problem);

// The same on inputs the caller made (a test's own hard cases), of these extents.
void check_function_on(const VariantInfo &variant, const std::string &function, const detail::CallShape &shape,
                       const detail::CallInputs &inputs);

}  // namespace attn::testing
