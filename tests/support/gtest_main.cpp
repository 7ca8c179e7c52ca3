// The tests' main: GoogleTest's, except that a run whose every test skipped (a suite of
// variants this machine cannot run) exits with 77, which CTest reports as skipped
// (SKIP_RETURN_CODE); a run with any failure still fails, and one with any pass passes.
// The variant tests' main (ATTN_TESTS_TAKE_CANDIDATES) also takes --candidate=LIBRARY:SUFFIX:ISA
// (repeatable), as attn_bench does: a tuning candidate's library, registered before GoogleTest
// instantiates its suites, so that the variant suites run it beside the compiled variants
// (support/variant_param.h, tested_variants).
#include <gtest/gtest.h>

#ifdef ATTN_TESTS_TAKE_CANDIDATES
#include "attn/internal.h"

#include <cstdio>
#endif

int main(int argc, char **argv) {
#ifdef ATTN_TESTS_TAKE_CANDIDATES
    try {
        for (const attn::VariantInfo &v : attn::detail::take_candidates(argc, argv))
            std::printf("candidate %s (%s): %s\n", v.name.c_str(), v.isa.c_str(),
                        v.runnable ? "runs here" : v.not_runnable_reason.c_str());
    } catch (const attn::Error &e) {
        std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
        return 1;
    }
#endif
    ::testing::InitGoogleTest(&argc, argv);
    const int status = RUN_ALL_TESTS();
    const ::testing::UnitTest &run = *::testing::UnitTest::GetInstance();
    if (status == 0 && run.successful_test_count() == 0 && run.skipped_test_count() > 0) return 77;
    return status;
}
