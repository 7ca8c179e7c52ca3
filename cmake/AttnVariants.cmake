# Builds the AOT variants of manifest.json (every ISA with each of its schedule sources)
# and writes attn/generated/compiled_functions.inc, the table of what was compiled, for
# the runtime's dispatch (the tests and benchmarks iterate what the runtime reports).
# Needs cmake/AttnManifest.cmake first.

# The fast edit loop: -DATTN_ONLY_VARIANTS=<regex> builds only the variants whose name
# (<schedule>_<isa>) matches, e.g. '^manual_avx2$', so that a schedule change rebuilds in
# about a minute. Empty (the default): every variant of the manifest.
set(ATTN_ONLY_VARIANTS "" CACHE STRING "Build only the variants whose name matches this regex (empty: all)")

set(ATTN_VARIANT_LINES "")
set(ATTN_COMPILED_LINES "")
set(ATTN_COMPILED_HEADERS "")
set(ATTN_KERNEL_LIBRARIES "")

# The compiled functions of one (source, ISA, function): each an entry of
# "<symbol suffix>|<max_seq>|<generator params, comma-separated>", one per shape class
# that has its own parameters. A tuned source reads schedules/autotuned/<isa>/<function>.json
# (tools/autotune.sh writes it); every other source compiles one function for all shapes.
function(_attn_compiled_entries source isa function out_var)
    if (NOT ATTN_SOURCE_${source}_KIND STREQUAL "tuned")
        set(${out_var} "|0|schedule=${source}" PARENT_SCOPE)
        return()
    endif ()
    set(file "${PROJECT_SOURCE_DIR}/schedules/autotuned/${isa}/${function}.json")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${file}")
    file(READ "${file}" json)
    string(JSON count LENGTH "${json}" classes)
    math(EXPR last "${count} - 1")
    set(entries "")
    foreach (i RANGE ${last})
        _attn_json_items(classes "${json}" classes ${i} shape_classes)
        _attn_json_items(params "${json}" classes ${i} generator_params)
        # The entry serves its classes: up to the largest bound among them (0: unbounded).
        set(max_seq -1)
        foreach (c IN LISTS classes)
            if (NOT c IN_LIST ATTN_SHAPE_CLASSES)
                message(FATAL_ERROR "${file}: shape class '${c}' is not one of manifest.json's (${ATTN_SHAPE_CLASSES})")
            endif ()
            if (ATTN_SHAPE_CLASS_${c}_MAX_SEQ EQUAL 0 OR max_seq EQUAL 0)
                set(max_seq 0)
            elseif (ATTN_SHAPE_CLASS_${c}_MAX_SEQ GREATER max_seq)
                set(max_seq ${ATTN_SHAPE_CLASS_${c}_MAX_SEQ})
            endif ()
        endforeach ()
        set(suffix "")
        if (count GREATER 1)
            list(GET classes 0 first_class)
            set(suffix "_${first_class}")
        endif ()
        list(JOIN params "," params)
        list(APPEND entries "${suffix}|${max_seq}|${params}")
    endforeach ()
    set(${out_var} "${entries}" PARENT_SCOPE)
endfunction()

# Builds every function one schedule source provides on one ISA, against `runtime`; sets
# <out_var> to the library targets, named attn_<function>_<source>_<isa>[_<shape class>].
function(_attn_function_libraries source isa runtime out_var)
    set(plugin_args "")
    if (ATTN_SOURCE_${source}_PLUGIN)
        set(plugin_args PLUGINS ${ATTN_SOURCE_${source}_PLUGIN})
    endif ()
    set(libraries "")
    set(compiled "")
    foreach (function IN LISTS ATTN_FUNCTIONS)
        attn_provides(${source} ${isa} ${function} provided)
        if (NOT provided)
            continue()
        endif ()
        _attn_compiled_entries(${source} ${isa} ${function} entries)
        foreach (entry IN LISTS entries)
            string(REPLACE "|" ";" fields "${entry}")
            list(GET fields 0 suffix)
            list(GET fields 1 max_seq)
            list(GET fields 2 schedule_params)
            string(REPLACE "," ";" schedule_params "${schedule_params}")
            set(name "attn_${function}_${source}_${isa}${suffix}")
            add_halide_library(${name} FROM attn_generators
                               GENERATOR ${ATTN_FUNCTION_${function}_GENERATOR}
                               FUNCTION_NAME ${name}
                               TARGETS ${ATTN_ISA_${isa}_TARGET}
                               USE_RUNTIME ${runtime}
                               ${plugin_args}
                               PARAMS function=${function} ${schedule_params} ${ATTN_FUNCTION_${function}_PARAMS})
            list(APPEND libraries ${name})
            list(APPEND compiled "ATTN_COMPILED(${source}, ${isa}, ${function}, ${max_seq}, ${name})")
        endforeach ()
    endforeach ()
    set(${out_var} "${libraries}" PARENT_SCOPE)
    set(${out_var}_COMPILED "${compiled}" PARENT_SCOPE)
endfunction()

# A variant: linked into the runtime, dispatched, tested, benchmarked. Its objects go
# into the per-ISA library attn_kernels_<isa> (every schedule for that ISA), which is
# what the runtime links and what `cmake --install` ships.
function(_attn_variant source isa)
    _attn_function_libraries(${source} ${isa} attn_halide_runtime libraries)
    if (NOT TARGET attn_kernels_${isa})
        add_library(attn_kernels_${isa} STATIC)
        set_target_properties(attn_kernels_${isa} PROPERTIES LINKER_LANGUAGE CXX EXPORT_NAME kernels_${isa})
        target_include_directories(attn_kernels_${isa} INTERFACE $<BUILD_INTERFACE:${CMAKE_CURRENT_BINARY_DIR}>)
        target_link_libraries(attn_kernels_${isa} INTERFACE attn_halide_runtime)
        list(APPEND ATTN_KERNEL_LIBRARIES attn_kernels_${isa})
    endif ()
    foreach (name IN LISTS libraries)
        list(APPEND ATTN_COMPILED_HEADERS "#include \"${name}.h\"")
        # Halide's per-function library is a one-object archive; take the object instead.
        get_target_property(objects ${name} SOURCES)
        target_sources(attn_kernels_${isa} PRIVATE ${objects})
        add_dependencies(attn_kernels_${isa} ${name}.update)
        set_target_properties(${name} PROPERTIES EXCLUDE_FROM_ALL ON)
    endforeach ()
    list(APPEND ATTN_VARIANT_LINES "ATTN_VARIANT(${source}, ${isa})")
    list(APPEND ATTN_COMPILED_LINES ${libraries_COMPILED})
    foreach (var ATTN_VARIANT_LINES ATTN_COMPILED_LINES ATTN_COMPILED_HEADERS ATTN_KERNEL_LIBRARIES)
        set(${var} "${${var}}" PARENT_SCOPE)
    endforeach ()
endfunction()

# A cross-compiled variant: the same generators for another CPU (e.g. arm64), built as
# static libraries with their own runtime under the target attn_cross_<source>_<isa>,
# but not linked into this build's runtime (this machine cannot run them).
function(_attn_cross_variant source isa)
    if (NOT TARGET attn_halide_runtime_${isa})
        add_halide_runtime(attn_halide_runtime_${isa} TARGETS ${ATTN_ISA_${isa}_TARGET})
    endif ()
    _attn_function_libraries(${source} ${isa} attn_halide_runtime_${isa} libraries)
    add_custom_target(attn_cross_${source}_${isa} ALL)
    add_dependencies(attn_cross_${source}_${isa} ${libraries})
endfunction()

# One Halide runtime shared by all linked variants (runs on any x86-64).
# Installed as attn::halide_runtime; Halide's own headers stay a build-time dependency.
add_halide_runtime(attn_halide_runtime TARGETS ${ATTN_RUNTIME_TARGET})
set_target_properties(attn_halide_runtime PROPERTIES EXPORT_NAME halide_runtime)
get_target_property(runtime_links attn_halide_runtime INTERFACE_LINK_LIBRARIES)
list(TRANSFORM runtime_links REPLACE "^Halide::Runtime$" "$<BUILD_INTERFACE:Halide::Runtime>")
set_target_properties(attn_halide_runtime PROPERTIES INTERFACE_LINK_LIBRARIES "${runtime_links}")

foreach (isa IN LISTS ATTN_ISAS)
    foreach (source IN LISTS ATTN_ISA_${isa}_VARIANTS)
        if (ATTN_ONLY_VARIANTS AND NOT "${source}_${isa}" MATCHES "${ATTN_ONLY_VARIANTS}")
            continue()
        endif ()
        if (ATTN_ISA_${isa}_CROSS)
            _attn_cross_variant(${source} ${isa})
        else ()
            _attn_variant(${source} ${isa})
        endif ()
    endforeach ()
endforeach ()

list(JOIN ATTN_COMPILED_HEADERS "\n" compiled_headers)
list(JOIN ATTN_VARIANT_LINES "\n" variant_lines)
list(JOIN ATTN_COMPILED_LINES "\n" compiled_lines)
file(CONFIGURE OUTPUT "${ATTN_GENERATED_DIR}/attn/generated/compiled_functions.inc" CONTENT
"// Generated by cmake/AttnVariants.cmake from manifest.json: what this build compiled. Do not edit.
@compiled_headers@

// ATTN_VARIANT(source, isa), in manifest order
#ifdef ATTN_VARIANT
@variant_lines@
#endif

// ATTN_COMPILED(source, isa, function, max_seq, symbol): one AOT function; max_seq is the
// largest max(S_q, S_k) it serves (0: no bound), a variant's functions of one name in
// increasing order
#ifdef ATTN_COMPILED
@compiled_lines@
#endif
" @ONLY)
