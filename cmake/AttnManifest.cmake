# manifest.json, the project's one table, for the build: tools/manifest.py (its one
# reader) checks it and writes, at configure time,
#   <build>/generated/attn/generated/manifest.h   the same table for C++ (runtime,
#                                                 generators, tests, benchmarks, CLI)
#   <build>/attn_manifest.cmake                   what to build: ATTN_RUNTIME_TARGET,
#       ATTN_ISA_<isa>_TARGET of the build's architecture, ATTN_VARIANTS (<source>_<isa>, after
#       ATTN_ONLY_VARIANTS) and ATTN_VARIANT_<variant> (SOURCE, ISA, LIBRARIES), and each
#       AOT library's ATTN_LIBRARY_<name> (FUNCTION, GENERATOR, MAX_SEQ, PLUGIN, PARAMS:
#       its generator parameters, from the one builder that the autotuner, the freezer and
#       `attn generate` use too; SAME_AS: the library of the same generator run whose
#       object it uses)
# and the build reconfigures when manifest.json or a tuned winner changes.
set(ATTN_GENERATED_DIR "${PROJECT_BINARY_DIR}/generated")

# The fast edit loop: -DATTN_ONLY_VARIANTS=<regex> builds only the variants whose name
# (<schedule>_<isa>) matches, e.g. '^manual_avx2$', so that a schedule change rebuilds in
# about a minute. Empty (the default): every variant of the manifest.
set(ATTN_ONLY_VARIANTS "" CACHE STRING "Build only the variants whose name matches this regex (empty: all)")

# The architecture the build is for (a cross build's, with a toolchain file): only its
# ISAs are built and linked.
if (CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    set(ATTN_ARCH x86-64)
elseif (CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
    set(ATTN_ARCH arm-64)
else ()
    message(FATAL_ERROR "no ISA of manifest.json is for the processor '${CMAKE_SYSTEM_PROCESSOR}'")
endif ()

find_package(Python3 3.9 COMPONENTS Interpreter REQUIRED)
execute_process(COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/tools/manifest.py" emit
                        --header "${ATTN_GENERATED_DIR}/attn/generated/manifest.h"
                        --dispatch-header "${ATTN_GENERATED_DIR}/attn/generated/dispatch.h"
                        --cmake "${PROJECT_BINARY_DIR}/attn_manifest.cmake"
                        --arch ${ATTN_ARCH}
                        --only-variants "${ATTN_ONLY_VARIANTS}"
                RESULT_VARIABLE failed)
if (failed)
    message(FATAL_ERROR "tools/manifest.py could not read manifest.json (its message is above)")
endif ()
include("${PROJECT_BINARY_DIR}/attn_manifest.cmake")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${ATTN_MANIFEST_INPUTS})
