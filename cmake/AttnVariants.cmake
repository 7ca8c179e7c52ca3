# Builds the AOT variants named in schedules/variants.cmake and generates the
# header that lists them (attn/generated/variant_list.inc) for the runtime, tests
# and benchmarks.
include("${CMAKE_CURRENT_LIST_DIR}/AttnTargets.cmake")

# The AOT functions each variant provides: name|generator|extra generator params (comma-separated).
set(ATTN_STAGES
    "qkv_projection|qkv_projection|"
    "attention_scores|attention_scores|"
    "masked_softmax|masked_softmax|"
    "weighted_sum|weighted_sum|"
    "output_layernorm|output_layernorm|"
    "self_attention|attention_layer|cross_attention=false,output_probs=false"
    "self_attention_probs|attention_layer|cross_attention=false,output_probs=true"
    "cross_attention|attention_layer|cross_attention=true,output_probs=false"
    "cross_attention_probs|attention_layer|cross_attention=true,output_probs=true")

# Schedule sources run at build time rather than frozen: Halide 21's Li2018 emits a
# .schedule.h that does not compile (see tools/freeze_schedules.py), so the
# generator runs it in process (schedules/schedule_source.cpp) with this plugin
# loaded. Everything else is hand-written (manual) or frozen under schedules/frozen/.
set(ATTN_PLUGIN_li2018 Halide::Li2018)

# Functions a schedule source (ATTN_MISSING_<source>) or one of its variants
# (ATTN_MISSING_<source>_<isa>) cannot provide, left out; the runtime reports a call to
# one as an error naming it.
# - Halide 21's Anderson2021 fails, with an empty error message, on the fused layer
#   that also outputs the probabilities (tools/freeze_schedules.py).
# - Mullapudi2016's experimental GPU schedule of the fused layer computes the whole
#   attention of a token in each GPU thread; run through OpenCL (PoCL) it crashes inside
#   the LayerNorm kernel on every shape past S=1 (e.g. B=2, S=128, H=256), so neither
#   GPU variant provides the fused layer. Its stages pass.
set(ATTN_MISSING_anderson2021 self_attention_probs cross_attention_probs)
set(ATTN_MISSING_mullapudi2016_cuda self_attention self_attention_probs cross_attention cross_attention_probs)
set(ATTN_MISSING_mullapudi2016_opencl ${ATTN_MISSING_mullapudi2016_cuda})

set(ATTN_VARIANT_LINES "")
set(ATTN_VARIANT_HEADERS "")
set(ATTN_KERNEL_LIBRARIES "")

# The fields of one ATTN_STAGES entry "function|generator|p1,p2": the function name,
# its generator, and its extra generator params as a list.
macro(_attn_stage_fields spec stage_var generator_var params_var)
    string(REPLACE "|" ";" _attn_parts "${spec}")
    list(GET _attn_parts 0 ${stage_var})
    list(GET _attn_parts 1 ${generator_var})
    list(GET _attn_parts 2 ${params_var})
    string(REPLACE "," ";" ${params_var} "${${params_var}}")
endmacro()

# The generator parameters of one autotuned function: what tools/autotune.py froze in
# schedules/autotuned/<isa>/<stage>.json (the hand-written schedule's parameters);
# attn_variant() has checked that the file exists.
function(_attn_autotuned_params isa stage out_var)
    set(file "${PROJECT_SOURCE_DIR}/schedules/autotuned/${isa}/${stage}.json")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${file}")
    file(READ "${file}" json)
    string(JSON count LENGTH "${json}" generator_params)
    math(EXPR last "${count} - 1")
    set(params "")
    foreach (i RANGE ${last})
        string(JSON param GET "${json}" generator_params ${i})
        list(APPEND params "${param}")
    endforeach ()
    set(${out_var} "${params}" PARENT_SCOPE)
endfunction()

# Builds every AOT function of ATTN_STAGES with one schedule for one ISA, against
# `runtime`; sets <out_var> to the library targets, named attn_<stage>_<schedule>_<isa>.
function(_attn_stage_libraries schedule isa runtime out_var)
    if (NOT DEFINED ATTN_TARGET_${isa})
        message(FATAL_ERROR "attn variant ${schedule} ${isa}: unknown ISA '${isa}' (see cmake/AttnTargets.cmake)")
    endif ()
    set(plugin_args "")
    if (DEFINED ATTN_PLUGIN_${schedule})
        set(plugin_args PLUGINS ${ATTN_PLUGIN_${schedule}})
    endif ()
    set(libraries "")
    foreach (stage_spec IN LISTS ATTN_STAGES)
        _attn_stage_fields("${stage_spec}" stage generator params)
        if (stage IN_LIST ATTN_MISSING_${schedule} OR stage IN_LIST ATTN_MISSING_${schedule}_${isa})
            continue()
        endif ()
        set(schedule_params schedule=${schedule})
        if (schedule STREQUAL "autotuned")
            _attn_autotuned_params(${isa} ${stage} schedule_params)
        endif ()
        set(function_name "attn_${stage}_${schedule}_${isa}")
        add_halide_library(${function_name} FROM attn_generators
                           GENERATOR ${generator}
                           FUNCTION_NAME ${function_name}
                           TARGETS ${ATTN_TARGET_${isa}}
                           USE_RUNTIME ${runtime}
                           ${plugin_args}
                           PARAMS ${schedule_params} ${params})
        list(APPEND libraries ${function_name})
    endforeach ()
    set(${out_var} "${libraries}" PARENT_SCOPE)
endfunction()

# The fast edit loop: -DATTN_ONLY_VARIANTS=<regex> builds only the variants whose name
# (<schedule>_<isa>) matches, e.g. '^manual_avx2$', so that a schedule change rebuilds in
# about a minute. Empty (the default): every variant of the list.
set(ATTN_ONLY_VARIANTS "" CACHE STRING "Build only the variants whose name matches this regex (empty: all)")

# A variant of the variant list: linked into the runtime, dispatched, tested, benchmarked.
# Its objects go into the per-ISA library attn_kernels_<isa> (every schedule for that
# ISA), which is what the runtime links and what `cmake --install` ships.
function(attn_variant schedule isa)
    if (ATTN_ONLY_VARIANTS AND NOT "${schedule}_${isa}" MATCHES "${ATTN_ONLY_VARIANTS}")
        return()
    endif ()
    if (schedule STREQUAL "autotuned")  # built where tools/autotune.sh froze every function
        # CONFIGURE_DEPENDS: a parameter file added later reconfigures the build.
        file(GLOB tuned CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/schedules/autotuned/${isa}/*.json")
        foreach (stage_spec IN LISTS ATTN_STAGES)
            _attn_stage_fields("${stage_spec}" stage generator params)
            if (NOT "${PROJECT_SOURCE_DIR}/schedules/autotuned/${isa}/${stage}.json" IN_LIST tuned)
                message(WARNING "attn: no autotuned_${isa} variant: schedules/autotuned/${isa}/${stage}.json is "
                                "missing. Tune it with tools/autotune.sh --isa ${isa} --function ${stage} "
                                "(self_attention tunes all four fused functions).")
                return()
            endif ()
        endforeach ()
    endif ()
    _attn_stage_libraries(${schedule} ${isa} attn_halide_runtime libraries)
    if (NOT TARGET attn_kernels_${isa})
        add_library(attn_kernels_${isa} STATIC)
        set_target_properties(attn_kernels_${isa} PROPERTIES LINKER_LANGUAGE CXX EXPORT_NAME kernels_${isa})
        target_include_directories(attn_kernels_${isa} INTERFACE $<BUILD_INTERFACE:${CMAKE_CURRENT_BINARY_DIR}>)
        target_link_libraries(attn_kernels_${isa} INTERFACE attn_halide_runtime)
        list(APPEND ATTN_KERNEL_LIBRARIES attn_kernels_${isa})
    endif ()
    foreach (stage IN LISTS ATTN_MISSING_${schedule} ATTN_MISSING_${schedule}_${isa})
        list(APPEND ATTN_VARIANT_HEADERS "#define attn_${stage}_${schedule}_${isa} nullptr  // not provided")
    endforeach ()
    foreach (function_name IN LISTS libraries)
        list(APPEND ATTN_VARIANT_HEADERS "#include \"${function_name}.h\"")
        # Halide's per-function library is a one-object archive; take the object instead.
        get_target_property(objects ${function_name} SOURCES)
        target_sources(attn_kernels_${isa} PRIVATE ${objects})
        add_dependencies(attn_kernels_${isa} ${function_name}.update)
        set_target_properties(${function_name} PROPERTIES EXCLUDE_FROM_ALL ON)
    endforeach ()
    list(APPEND ATTN_VARIANT_LINES "ATTN_VARIANT(${schedule}, ${isa}, \"${ATTN_TARGET_${isa}}\")")
    set(ATTN_VARIANT_LINES "${ATTN_VARIANT_LINES}" PARENT_SCOPE)
    set(ATTN_VARIANT_HEADERS "${ATTN_VARIANT_HEADERS}" PARENT_SCOPE)
    set(ATTN_KERNEL_LIBRARIES "${ATTN_KERNEL_LIBRARIES}" PARENT_SCOPE)
endfunction()

# A cross-compiled variant: the same generators for another CPU (e.g. arm64), built as
# static libraries with their own runtime under the target attn_cross_<schedule>_<isa>,
# but not linked into this build's runtime (this machine cannot run them).
function(attn_cross_variant schedule isa)
    if (NOT TARGET attn_halide_runtime_${isa})
        add_halide_runtime(attn_halide_runtime_${isa} TARGETS ${ATTN_TARGET_${isa}})
    endif ()
    _attn_stage_libraries(${schedule} ${isa} attn_halide_runtime_${isa} libraries)
    add_custom_target(attn_cross_${schedule}_${isa} ALL)
    add_dependencies(attn_cross_${schedule}_${isa} ${libraries})
endfunction()

# One Halide runtime shared by all variants (ATTN_RUNTIME_TARGET: runs on any x86-64).
# Installed as attn::halide_runtime; Halide's own headers stay a build-time dependency.
add_halide_runtime(attn_halide_runtime TARGETS ${ATTN_RUNTIME_TARGET})
set_target_properties(attn_halide_runtime PROPERTIES EXPORT_NAME halide_runtime)
get_target_property(runtime_links attn_halide_runtime INTERFACE_LINK_LIBRARIES)
list(TRANSFORM runtime_links REPLACE "^Halide::Runtime$" "$<BUILD_INTERFACE:Halide::Runtime>")
set_target_properties(attn_halide_runtime PROPERTIES INTERFACE_LINK_LIBRARIES "${runtime_links}")

include("${PROJECT_SOURCE_DIR}/schedules/variants.cmake")

set(ATTN_GENERATED_DIR "${PROJECT_BINARY_DIR}/generated")
list(JOIN ATTN_VARIANT_LINES "\n" variant_lines)
list(JOIN ATTN_VARIANT_HEADERS "\n" variant_headers)
file(CONFIGURE OUTPUT "${ATTN_GENERATED_DIR}/attn/generated/variant_list.inc" CONTENT
"// Generated by cmake/AttnVariants.cmake from schedules/variants.cmake. Do not edit.
// ATTN_VARIANT(schedule, isa, halide_target)
${variant_lines}
" @ONLY)
file(CONFIGURE OUTPUT "${ATTN_GENERATED_DIR}/attn/generated/kernels.h" CONTENT
"// Generated by cmake/AttnVariants.cmake: the AOT functions of every variant. Do not edit.
#pragma once
${variant_headers}
" @ONLY)
# The AOT functions for `attn generate`: ATTN_STAGE(function, generator, "params").
set(stage_lines "")
foreach (stage_spec IN LISTS ATTN_STAGES)
    _attn_stage_fields("${stage_spec}" stage generator params)
    string(REPLACE ";" "," params "${params}")
    list(APPEND stage_lines "ATTN_STAGE(\"${stage}\", \"${generator}\", \"${params}\")")
endforeach ()
list(JOIN stage_lines "\n" stage_lines)
file(CONFIGURE OUTPUT "${ATTN_GENERATED_DIR}/attn/generated/stages.inc" CONTENT
"// Generated by cmake/AttnVariants.cmake from ATTN_STAGES. Do not edit.
// ATTN_STAGE(function, generator, \"comma-separated generator params\")
${stage_lines}
" @ONLY)
