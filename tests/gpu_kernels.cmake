# The CUDA kernels judged without a GPU (tools/gpu_kernels.py): no kernel of any CUDA variant
# needs more registers for its block than an SM has (it could not launch); no kernel of a hand-written
# or tuned CUDA variant spills, asks for more shared memory per block than manifest.json's
# gpu_shared_memory_per_block, or transposes a fused layer's weight on every call (ptxas -v
# for sm_90 on the PTX of the build's objects, and the launches of the lowered stmt the
# build writes beside each); skipped (77) without ptxas or a CUDA variant. And the check
# itself fails where it should: a hand-written PTX kernel that spills, a launch over the
# limit, a fused layer's weight transpose, a block that cannot launch. The first run after
# the CUDA objects change assembles them again (about 10 s on 2 cores); later runs read the
# cache. A sanitizer build has no CUDA variant; a cross build's generators are the host
# build's, which checks them.
if (NOT ATTN_SANITIZE AND NOT CMAKE_CROSSCOMPILING)
    add_test(NAME gpu_kernels.check
             COMMAND ${Python3_EXECUTABLE} "${PROJECT_SOURCE_DIR}/tools/gpu_kernels.py"
                     --build "${PROJECT_BINARY_DIR}" --check
                     --cache "${CMAKE_CURRENT_BINARY_DIR}/gpu_kernels/cache")
    add_test(NAME gpu_kernels.check_fails
             COMMAND ${Python3_EXECUTABLE} "${CMAKE_CURRENT_SOURCE_DIR}/tools/test_gpu_kernels.py"
                     "${CMAKE_CURRENT_BINARY_DIR}/gpu_kernels")
    set_tests_properties(gpu_kernels.check gpu_kernels.check_fails PROPERTIES SKIP_RETURN_CODE 77)
endif ()

# The GPU flash core refuses more queries a block than its threads allow (16 a query, at most
# 512 a block at one query a thread, 256 at more, whose threads take more registers), naming
# query_block, when the build's manual_cuda core is generated with 64;
# threads a query that do not split its 32-key chunks evenly, naming gpu_query_lanes; queries
# a thread other than 1, 2 or 4, naming gpu_thread_queries; and queries a block that are not
# a multiple of them, naming query_block.
if (NOT ATTN_SANITIZE AND NOT CMAKE_CROSSCOMPILING AND DEFINED ATTN_LIBRARY_attn_attention_core_manual_cuda)
    cmake_parse_arguments(core "" "GENERATOR" "PARAMS" ${ATTN_LIBRARY_attn_attention_core_manual_cuda})
    function(core_refuses name param expected)
        add_test(NAME gpu_flash_core.${name}
                 COMMAND $<TARGET_FILE:${ATTN_GENERATORS}> -n refused -d 0 -g ${core_GENERATOR} -f refused -e c_header
                         -o "${CMAKE_CURRENT_BINARY_DIR}/refused" target=${ATTN_ISA_cuda_TARGET}-no_runtime ${core_PARAMS}
                         ${param})
        set_tests_properties(gpu_flash_core.${name} PROPERTIES PASS_REGULAR_EXPRESSION "${expected}")
    endfunction()
    core_refuses(refuses_too_many_queries query_block=64
                 "query_block=64: a GPU block of the flash core runs query_block / gpu_thread_queries × gpu_query_lanes threads \\(64 / 1 × 16\\), at most 512 at 1 query a thread: expected 1 to 32")
    core_refuses(refuses_too_many_threads_of_more_registers "query_block=64;gpu_thread_queries=2"
                 "query_block=64: a GPU block of the flash core runs query_block / gpu_thread_queries × gpu_query_lanes threads \\(64 / 2 × 16\\), at most 256 at 2 queries a thread: expected 1 to 32")
    core_refuses(refuses_uneven_lanes gpu_query_lanes=12
                 "gpu_query_lanes=12: the flash core's threads a query split its 32-key chunks and its features evenly: expected 4, 8, 16 or 32")
    core_refuses(refuses_uneven_thread_queries gpu_thread_queries=3
                 "gpu_thread_queries=3: the flash core's queries a thread, unrolled in its registers: expected 1, 2 or 4")
    core_refuses(refuses_queries_not_a_multiple "query_block=6;gpu_thread_queries=4"
                 "query_block=6: the flash core's threads take 4 queries each \\(gpu_thread_queries\\): expected a multiple of 4")
endif ()
