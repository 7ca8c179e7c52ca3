// One call of one manifest function of a variant on a problem, checked against the
// double reference by the accuracy rule (and for writes outside its outputs): the body
// every per-function test shares. The stages take the plain float32 layer's
// intermediates as inputs, as the reference stage does; the packed functions take the
// problem's real tokens (its mask's lengths), packed, and its bias as [heads, S, S].
#pragma once

#include "variant_param.h"

#include <string>

namespace attn::testing {

// Whether `function` has a call on `problem`: the packed ones are self-attention only.
bool function_applies(const std::string &function, const Problem &problem);

// Whether check_function knows the manifest function (tests/test_manifest.cpp holds every
// manifest function to it).
bool has_function_check(const std::string &function);

// Runs and checks; a variant that does not provide the function must refuse the call
// (ran_or_refused). Failures are reported through gtest.
void check_function(const VariantInfo &variant, const std::string &function, const Problem &problem);

}  // namespace attn::testing
