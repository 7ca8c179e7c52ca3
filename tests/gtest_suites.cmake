# Registers a GoogleTest executable with CTest as one test per suite instance (e.g.
# "AllVariants/LayerTest"), each running that suite's cases in one process, instead of
# one process per case (gtest_discover_tests): a process here pays for loading the
# kernels, the OpenCL device and every reference it computes, which cost more than most
# cases, and the cases of a suite share their problems' references. A failing test's
# output names the failing cases (ctest --output-on-failure); a suite whose every case
# skips is reported as skipped (the executable's main, support/gtest_main.cpp, exits 77). The suites matching SPLIT (a regex) are registered one
# test per case instead, so that each case's skip shows in ctest's summary.
#
#   attn_add_gtest_suites(<target> [SPLIT <regex>])
#
# Run as a script (-P), it lists the executable's suites and writes the CTest include
# file, as gtest_discover_tests does after each build (through the cross build's emulator).

if (CMAKE_SCRIPT_MODE_FILE)
    string(REPLACE "|" ";" EMULATOR "${EMULATOR}")  # a list, passed with | for ;
    execute_process(COMMAND ${EMULATOR} "${TEST_EXECUTABLE}" --gtest_list_tests OUTPUT_VARIABLE listing
                    RESULT_VARIABLE failed)
    if (failed)
        message(FATAL_ERROR "${TEST_EXECUTABLE} --gtest_list_tests failed: ${failed}")
    endif ()
    set(emulator "")
    foreach (part IN LISTS EMULATOR)
        string(APPEND emulator "[=[${part}]=] ")
    endforeach ()
    string(REPLACE "\n" ";" lines "${listing}")
    set(script "")
    set(suite "")
    foreach (line IN LISTS lines)
        set(test "")
        if (line MATCHES "^([A-Za-z0-9_/]+)\\.$")
            set(suite "${CMAKE_MATCH_1}")
            if (NOT (SPLIT AND suite MATCHES "${SPLIT}"))
                set(test "${suite}")
                set(filter "${suite}.*")
            endif ()
        elseif (SPLIT AND suite MATCHES "${SPLIT}" AND line MATCHES "^  ([A-Za-z0-9_/]+)")
            set(test "${suite}.${CMAKE_MATCH_1}")  # the last MATCHES sets CMAKE_MATCH_1
            set(filter "${test}")
        endif ()
        if (test)
            string(APPEND script
                   "add_test([=[${test}]=] ${emulator} [=[${TEST_EXECUTABLE}]=] [=[--gtest_filter=${filter}]=])\n"
                   "set_tests_properties([=[${test}]=] PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1500)\n")
        endif ()
    endforeach ()
    file(WRITE "${OUTPUT}" "${script}")
    return()
endif ()

function(attn_add_gtest_suites target)
    cmake_parse_arguments(PARSE_ARGV 1 ARG "" "SPLIT" "")
    set(output "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
    string(REPLACE ";" "|" emulator "${CMAKE_CROSSCOMPILING_EMULATOR}")
    add_custom_command(TARGET ${target} POST_BUILD
                       COMMAND ${CMAKE_COMMAND} -D TEST_EXECUTABLE=$<TARGET_FILE:${target}> -D OUTPUT=${output}
                               "-DEMULATOR=${emulator}"
                               "-DSPLIT=${ARG_SPLIT}" -P ${CMAKE_CURRENT_FUNCTION_LIST_FILE}
                       BYPRODUCTS ${output} VERBATIM)
    # Before the first build there is no list: one failing test says so.
    set(include "${CMAKE_CURRENT_BINARY_DIR}/${target}_include.cmake")
    file(WRITE "${include}"
         "if (EXISTS [=[${output}]=])\n  include([=[${output}]=])\nelse ()\n"
         "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\nendif ()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include}")
    # A change to this script relinks, which lists the suites again.
    set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${CMAKE_CURRENT_FUNCTION_LIST_FILE}")
endfunction()
