// The tests' main: GoogleTest's, except that a run whose every test skipped (a suite of
// variants this machine cannot run) exits with 77, which CTest reports as skipped
// (SKIP_RETURN_CODE); a run with any failure still fails, and one with any pass passes.
#include <gtest/gtest.h>

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    const int status = RUN_ALL_TESTS();
    const ::testing::UnitTest &run = *::testing::UnitTest::GetInstance();
    if (status == 0 && run.successful_test_count() == 0 && run.skipped_test_count() > 0) return 77;
    return status;
}
