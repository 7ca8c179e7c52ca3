# Reads manifest.json (the functions, ISAs, schedule sources, shape classes and the
# hand-written schedule's parameters) into CMake variables, checks that its entries refer
# to each other correctly, and writes attn/generated/manifest.h, the same table for C++.
#
# Variables set here (lists unless said otherwise):
#   ATTN_FUNCTIONS                          function names, in manifest order
#   ATTN_FUNCTION_<f>_GENERATOR             its generator (string)
#   ATTN_FUNCTION_<f>_PARAMS                its generator params, as key=value
#   ATTN_FUNCTION_<f>_ARGUMENTS             its arguments, in order
#   ATTN_ISAS                               ISA names
#   ATTN_ISA_<i>_TARGET, _DEVICE            Halide target, device (strings)
#   ATTN_ISA_<i>_VARIANTS                   the schedule sources it is built with
#   ATTN_ISA_<i>_CROSS                      ON for cross-compiled (built, never linked)
#   ATTN_SOURCES                            schedule source names
#   ATTN_SOURCE_<s>_KIND, _PLUGIN           kind, CMake target of an in-process plugin
#   ATTN_SOURCE_<s>_NOT_PROVIDED_<i|all>    functions it cannot provide on an ISA (or any)
#   ATTN_MIN_SHAPE_ROWS                     "source ISA function extents..." (min_shapes, per built ISA)
#   ATTN_SHAPE_CLASSES                      shape class names; ATTN_SHAPE_CLASS_<c>_MAX_SEQ (0: none)
#   ATTN_RUNTIME_TARGET                     the Halide runtime every linked variant shares
#   ATTN_GPU_SHARED_MEMORY_PER_BLOCK        bytes of shared memory a GPU block may use
set(ATTN_MANIFEST_FILE "${PROJECT_SOURCE_DIR}/manifest.json")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${ATTN_MANIFEST_FILE}")
file(READ "${ATTN_MANIFEST_FILE}" ATTN_MANIFEST)

# The items of the JSON array or object at <path...> as a CMake list (empty when absent):
# an array's strings, or an object's members as key=value.
function(_attn_json_items out json)
    string(JSON type ERROR_VARIABLE missing TYPE "${json}" ${ARGN})
    set(items "")
    if (NOT missing)
        string(JSON count LENGTH "${json}" ${ARGN})
    endif ()
    if (NOT missing AND count GREATER 0)
        math(EXPR last "${count} - 1")
        foreach (i RANGE ${last})
            if (type STREQUAL "OBJECT")
                string(JSON key MEMBER "${json}" ${ARGN} ${i})
                string(JSON value GET "${json}" ${ARGN} ${key})
                list(APPEND items "${key}=${value}")
            else ()
                string(JSON item GET "${json}" ${ARGN} ${i})
                list(APPEND items "${item}")
            endif ()
        endforeach ()
    endif ()
    set(${out} "${items}" PARENT_SCOPE)
endfunction()

# The value at <path...>, or <default> when absent.
function(_attn_json_optional out json default)
    string(JSON value ERROR_VARIABLE missing GET "${json}" ${ARGN})
    if (missing)
        set(value "${default}")
    endif ()
    set(${out} "${value}" PARENT_SCOPE)
endfunction()

function(_attn_manifest_error message)
    message(FATAL_ERROR "manifest.json: ${message}")
endfunction()

# A C string literal of `text`.
function(_attn_c_string out text)
    string(REPLACE "\\" "\\\\" text "${text}")
    string(REPLACE "\"" "\\\"" text "${text}")
    set(${out} "\"${text}\"" PARENT_SCOPE)
endfunction()

# ---- reading ----

string(JSON ATTN_RUNTIME_TARGET GET "${ATTN_MANIFEST}" runtime_target)
string(JSON ATTN_GPU_SHARED_MEMORY_PER_BLOCK GET "${ATTN_MANIFEST}" gpu_shared_memory_per_block bytes)

set(ATTN_FUNCTIONS "")
string(JSON count LENGTH "${ATTN_MANIFEST}" functions)
math(EXPR last "${count} - 1")
foreach (i RANGE ${last})
    string(JSON f GET "${ATTN_MANIFEST}" functions ${i} name)
    list(APPEND ATTN_FUNCTIONS ${f})
    string(JSON ATTN_FUNCTION_${f}_GENERATOR GET "${ATTN_MANIFEST}" functions ${i} generator)
    string(JSON ATTN_FUNCTION_${f}_STAGE GET "${ATTN_MANIFEST}" functions ${i} stage)
    _attn_json_items(ATTN_FUNCTION_${f}_PARAMS "${ATTN_MANIFEST}" functions ${i} params)
    _attn_json_items(ATTN_FUNCTION_${f}_ARGUMENTS "${ATTN_MANIFEST}" functions ${i} arguments)
    _attn_json_items(ATTN_FUNCTION_${f}_MANUAL_PARAMETERS "${ATTN_MANIFEST}" functions ${i} manual_parameters)
endforeach ()

# The dimensions a schedule source's min_shapes may bound, in attn::kProblemDimensions'
# order (the test Manifest.MinShapeDimensionsAreTheRuntimes compares them).
set(ATTN_MIN_SHAPE_DIMENSIONS batch seq_q seq_k heads head_dim hidden)

set(ATTN_SOURCES "")
string(JSON count LENGTH "${ATTN_MANIFEST}" schedule_sources)
math(EXPR last "${count} - 1")
foreach (i RANGE ${last})
    string(JSON s GET "${ATTN_MANIFEST}" schedule_sources ${i} name)
    list(APPEND ATTN_SOURCES ${s})
    string(JSON ATTN_SOURCE_${s}_KIND GET "${ATTN_MANIFEST}" schedule_sources ${i} kind)
    if (NOT ATTN_SOURCE_${s}_KIND MATCHES "^(hand-written|tuned|frozen|in-process)$")
        _attn_manifest_error("schedule source ${s}: kind '${ATTN_SOURCE_${s}_KIND}' is not one of hand-written, tuned, frozen, in-process")
    endif ()
    _attn_json_optional(ATTN_SOURCE_${s}_PRIORITY "${ATTN_MANIFEST}" 0 schedule_sources ${i} dispatch_priority)
    _attn_json_optional(ATTN_SOURCE_${s}_PLUGIN "${ATTN_MANIFEST}" "" schedule_sources ${i} plugin)
    _attn_json_optional(ATTN_SOURCE_${s}_AUTOSCHEDULER "${ATTN_MANIFEST}" "" schedule_sources ${i} autoscheduler)
    _attn_json_items(ATTN_SOURCE_${s}_CPU_PARAMS "${ATTN_MANIFEST}" schedule_sources ${i} autoscheduler_params cpu)
    _attn_json_items(ATTN_SOURCE_${s}_GPU_PARAMS "${ATTN_MANIFEST}" schedule_sources ${i} autoscheduler_params gpu)
    _attn_json_items(ATTN_SOURCE_${s}_NOT_REPRODUCIBLE_ON "${ATTN_MANIFEST}"
                       schedule_sources ${i} not_bitwise_reproducible_on)
    # min_shapes: {ISA: {function: {dimension: smallest extent}}}, kept as rows
    # "ISA function batch seq_q seq_k heads head_dim hidden" (absent dimensions: 1).
    set(ATTN_SOURCE_${s}_MIN_SHAPES "")
    _attn_json_items(min_isas "${ATTN_MANIFEST}" schedule_sources ${i} min_shapes)
    foreach (entry IN LISTS min_isas)
        string(REGEX REPLACE "=.*" "" where "${entry}")
        _attn_json_items(min_functions "${ATTN_MANIFEST}" schedule_sources ${i} min_shapes ${where})
        foreach (function_entry IN LISTS min_functions)
            string(REGEX REPLACE "=.*" "" f "${function_entry}")
            if (NOT f IN_LIST ATTN_FUNCTIONS)
                _attn_manifest_error("schedule source ${s}: min_shapes names '${f}', which is not a function")
            endif ()
            _attn_json_items(extents "${ATTN_MANIFEST}" schedule_sources ${i} min_shapes ${where} ${f})
            set(row "${where} ${f}")
            foreach (dimension IN LISTS ATTN_MIN_SHAPE_DIMENSIONS)
                _attn_json_optional(extent "${ATTN_MANIFEST}" 1 schedule_sources ${i} min_shapes ${where} ${f} ${dimension})
                string(APPEND row " ${extent}")
            endforeach ()
            foreach (given IN LISTS extents)
                string(REGEX REPLACE "=.*" "" dimension "${given}")
                if (NOT dimension IN_LIST ATTN_MIN_SHAPE_DIMENSIONS)
                    _attn_manifest_error("schedule source ${s}: min_shapes of ${f} on ${where} names '${dimension}', not one of ${ATTN_MIN_SHAPE_DIMENSIONS}")
                endif ()
            endforeach ()
            list(APPEND ATTN_SOURCE_${s}_MIN_SHAPES "${row}")
        endforeach ()
    endforeach ()
    _attn_json_optional(ATTN_SOURCE_${s}_MIN_SHAPES_BECAUSE "${ATTN_MANIFEST}" "" schedule_sources ${i} min_shapes_because)
    if (ATTN_SOURCE_${s}_MIN_SHAPES AND ATTN_SOURCE_${s}_MIN_SHAPES_BECAUSE STREQUAL "")
        _attn_manifest_error("schedule source ${s} has min_shapes but no min_shapes_because")
    endif ()
    set(ATTN_SOURCE_${s}_NOT_PROVIDED_KEYS "")
    string(JSON keys ERROR_VARIABLE none LENGTH "${ATTN_MANIFEST}" schedule_sources ${i} not_provided)
    if (NOT none AND keys GREATER 0)
        math(EXPR last_key "${keys} - 1")
        foreach (k RANGE ${last_key})
            string(JSON where MEMBER "${ATTN_MANIFEST}" schedule_sources ${i} not_provided ${k})
            _attn_json_items(ATTN_SOURCE_${s}_NOT_PROVIDED_${where} "${ATTN_MANIFEST}"
                               schedule_sources ${i} not_provided ${where})
            list(APPEND ATTN_SOURCE_${s}_NOT_PROVIDED_KEYS ${where})
            foreach (f IN LISTS ATTN_SOURCE_${s}_NOT_PROVIDED_${where})
                if (NOT f IN_LIST ATTN_FUNCTIONS)
                    _attn_manifest_error("schedule source ${s}: not_provided names '${f}', which is not a function")
                endif ()
            endforeach ()
        endforeach ()
    endif ()
endforeach ()

set(ATTN_ISAS "")
string(JSON count LENGTH "${ATTN_MANIFEST}" isas)
math(EXPR last "${count} - 1")
foreach (i RANGE ${last})
    string(JSON isa GET "${ATTN_MANIFEST}" isas ${i} name)
    list(APPEND ATTN_ISAS ${isa})
    string(JSON ATTN_ISA_${isa}_TARGET GET "${ATTN_MANIFEST}" isas ${i} halide_target)
    string(JSON ATTN_ISA_${isa}_DEVICE GET "${ATTN_MANIFEST}" isas ${i} device)
    _attn_json_optional(ATTN_ISA_${isa}_RANK "${ATTN_MANIFEST}" 0 isas ${i} dispatch_rank)
    _attn_json_optional(ATTN_ISA_${isa}_CROSS "${ATTN_MANIFEST}" OFF isas ${i} cross_compiled)
    _attn_json_optional(ATTN_ISA_${isa}_FROZEN_OF "${ATTN_MANIFEST}" "${isa}" isas ${i} frozen_schedules_of)
    _attn_json_items(ATTN_ISA_${isa}_FEATURES "${ATTN_MANIFEST}" isas ${i} cpu_features)
    _attn_json_items(ATTN_ISA_${isa}_VARIANTS "${ATTN_MANIFEST}" isas ${i} variants)
    foreach (s IN LISTS ATTN_ISA_${isa}_VARIANTS)
        if (NOT s IN_LIST ATTN_SOURCES)
            _attn_manifest_error("ISA ${isa}: variant source '${s}' is not one of the schedule_sources (${ATTN_SOURCES})")
        endif ()
    endforeach ()
endforeach ()
foreach (s IN LISTS ATTN_SOURCES)
    foreach (where IN LISTS ATTN_SOURCE_${s}_NOT_PROVIDED_KEYS)
        if (NOT where STREQUAL "all" AND NOT where IN_LIST ATTN_ISAS)
            _attn_manifest_error("schedule source ${s}: not_provided names ISA '${where}', which is not an ISA")
        endif ()
    endforeach ()
endforeach ()

# A min_shapes row applies to its ISA and to every ISA with frozen_schedules_of it; each
# such ISA needs a hand-written variant, which runs the shapes below the minimum.
set(ATTN_MIN_SHAPE_ROWS "")  # "source ISA function extents..."
foreach (s IN LISTS ATTN_SOURCES)
    foreach (row IN LISTS ATTN_SOURCE_${s}_MIN_SHAPES)
        string(REPLACE " " ";" fields "${row}")
        list(GET fields 0 where)
        list(REMOVE_AT fields 0)
        list(JOIN fields " " rest)
        if (NOT where IN_LIST ATTN_ISAS)
            _attn_manifest_error("schedule source ${s}: min_shapes names ISA '${where}', which is not an ISA")
        endif ()
        foreach (isa IN LISTS ATTN_ISAS)
            if (NOT ATTN_ISA_${isa}_FROZEN_OF STREQUAL where OR NOT s IN_LIST ATTN_ISA_${isa}_VARIANTS)
                continue ()
            endif ()
            set(hand_written "")
            foreach (other IN LISTS ATTN_ISA_${isa}_VARIANTS)
                if (ATTN_SOURCE_${other}_KIND STREQUAL "hand-written")
                    set(hand_written ${other})
                endif ()
            endforeach ()
            if (hand_written STREQUAL "")
                _attn_manifest_error("ISA ${isa}: schedule source ${s} has min_shapes there, so the ISA needs a hand-written variant to run the shapes below them")
            endif ()
            list(APPEND ATTN_MIN_SHAPE_ROWS "${s} ${isa} ${rest}")
        endforeach ()
    endforeach ()
endforeach ()

set(ATTN_SHAPE_CLASSES "")
string(JSON count LENGTH "${ATTN_MANIFEST}" shape_classes classes)
math(EXPR last "${count} - 1")
foreach (i RANGE ${last})
    string(JSON c GET "${ATTN_MANIFEST}" shape_classes classes ${i} name)
    list(APPEND ATTN_SHAPE_CLASSES ${c})
    _attn_json_optional(ATTN_SHAPE_CLASS_${c}_MAX_SEQ "${ATTN_MANIFEST}" 0 shape_classes classes ${i} max_seq)
endforeach ()

# Whether schedule source `source` provides `function` on `isa`.
function(attn_provides source isa function out_var)
    set(provided ON)
    if (function IN_LIST ATTN_SOURCE_${source}_NOT_PROVIDED_all OR
        function IN_LIST ATTN_SOURCE_${source}_NOT_PROVIDED_${isa})
        set(provided OFF)
    endif ()
    set(${out_var} ${provided} PARENT_SCOPE)
endfunction()

# ---- attn/generated/manifest.h ----

set(ATTN_GENERATED_DIR "${PROJECT_BINARY_DIR}/generated")

set(function_rows "")
foreach (f IN LISTS ATTN_FUNCTIONS)
    list(JOIN ATTN_FUNCTION_${f}_PARAMS "," params)
    list(JOIN ATTN_FUNCTION_${f}_ARGUMENTS " " arguments)
    list(JOIN ATTN_FUNCTION_${f}_MANUAL_PARAMETERS " " manual)
    _attn_c_string(stage "${ATTN_FUNCTION_${f}_STAGE}")
    string(APPEND function_rows
           "    {\"${f}\", ${stage}, \"${ATTN_FUNCTION_${f}_GENERATOR}\", \"${params}\", \"${arguments}\", \"${manual}\"},\n")
endforeach ()

set(isa_rows "")
set(all_features "")
foreach (isa IN LISTS ATTN_ISAS)
    list(JOIN ATTN_ISA_${isa}_FEATURES " " features)
    list(APPEND all_features ${ATTN_ISA_${isa}_FEATURES})
    list(JOIN ATTN_ISA_${isa}_VARIANTS " " isa_variants)
    if (ATTN_ISA_${isa}_CROSS)
        set(cross true)
    else ()
        set(cross false)
    endif ()
    string(APPEND isa_rows "    {\"${isa}\", \"${ATTN_ISA_${isa}_TARGET}\", \"${ATTN_ISA_${isa}_DEVICE}\", \"${features}\", "
                           "${ATTN_ISA_${isa}_RANK}, ${cross}, \"${ATTN_ISA_${isa}_FROZEN_OF}\", \"${isa_variants}\"},\n")
endforeach ()
list(REMOVE_DUPLICATES all_features)
set(feature_macro "")
foreach (feature IN LISTS all_features)
    string(APPEND feature_macro " X(\"${feature}\")")
endforeach ()

set(source_rows "")
set(not_provided_rows "")
foreach (s IN LISTS ATTN_SOURCES)
    list(JOIN ATTN_SOURCE_${s}_CPU_PARAMS " " cpu_params)
    list(JOIN ATTN_SOURCE_${s}_GPU_PARAMS " " gpu_params)
    list(JOIN ATTN_SOURCE_${s}_NOT_REPRODUCIBLE_ON " " not_reproducible)
    _attn_c_string(min_shapes_because "${ATTN_SOURCE_${s}_MIN_SHAPES_BECAUSE}")
    string(APPEND source_rows "    {\"${s}\", \"${ATTN_SOURCE_${s}_KIND}\", ${ATTN_SOURCE_${s}_PRIORITY}, "
                              "\"${ATTN_SOURCE_${s}_AUTOSCHEDULER}\", \"${cpu_params}\", \"${gpu_params}\", "
                              "\"${not_reproducible}\", ${min_shapes_because}},\n")
    foreach (where IN LISTS ATTN_SOURCE_${s}_NOT_PROVIDED_KEYS)
        foreach (f IN LISTS ATTN_SOURCE_${s}_NOT_PROVIDED_${where})
            string(APPEND not_provided_rows "    {\"${s}\", \"${where}\", \"${f}\"},\n")
        endforeach ()
    endforeach ()
endforeach ()

list(TRANSFORM ATTN_MIN_SHAPE_DIMENSIONS PREPEND "\"" OUTPUT_VARIABLE min_shape_dimensions)
list(TRANSFORM min_shape_dimensions APPEND "\"")
list(JOIN min_shape_dimensions ", " min_shape_dimensions)
set(min_shape_rows "")
foreach (row IN LISTS ATTN_MIN_SHAPE_ROWS)
    string(REPLACE " " ";" fields "${row}")
    list(POP_FRONT fields s isa f)
    list(JOIN fields ", " extents)
    string(APPEND min_shape_rows "    {\"${s}\", \"${isa}\", \"${f}\", {${extents}}},\n")
endforeach ()

set(class_rows "")
foreach (c IN LISTS ATTN_SHAPE_CLASSES)
    string(APPEND class_rows "    {\"${c}\", ${ATTN_SHAPE_CLASS_${c}_MAX_SEQ}},\n")
endforeach ()

set(parameter_rows "")
string(JSON count LENGTH "${ATTN_MANIFEST}" manual_parameters)
math(EXPR last "${count} - 1")
foreach (i RANGE ${last})
    string(JSON name GET "${ATTN_MANIFEST}" manual_parameters ${i} name)
    string(JSON default GET "${ATTN_MANIFEST}" manual_parameters ${i} default)
    _attn_json_optional(gpu_default "${ATTN_MANIFEST}" "${default}" manual_parameters ${i} gpu_default)
    string(JSON min GET "${ATTN_MANIFEST}" manual_parameters ${i} min)
    string(JSON max GET "${ATTN_MANIFEST}" manual_parameters ${i} max)
    string(APPEND parameter_rows "    {\"${name}\", ${default}, ${gpu_default}, ${min}, ${max}},\n")
endforeach ()

file(CONFIGURE OUTPUT "${ATTN_GENERATED_DIR}/attn/generated/manifest.h" CONTENT
"// Generated by cmake/AttnManifest.cmake from manifest.json. Do not edit.
// Lists of names are space-separated; generator params are comma-separated key=value.
#pragma once

#include <iterator>
#include <string_view>

namespace attn::manifest {

struct Function {
    const char *name, *stage, *generator, *params, *arguments, *manual_parameters;
};
inline constexpr Function kFunctions[] = {
@function_rows@};

struct Isa {
    const char *name, *halide_target, *device, *cpu_features;
    int dispatch_rank;  // 0: chosen by name only
    bool cross_compiled;
    const char *frozen_schedules_of, *variants;
};
inline constexpr Isa kIsas[] = {
@isa_rows@};

struct ScheduleSource {
    const char *name, *kind;
    int dispatch_priority;  // 0: chosen by name only
    const char *autoscheduler, *cpu_params, *gpu_params, *not_bitwise_reproducible_on;
    const char *min_shapes_because;  // why its kernels need the extents of kMinShapes
};
inline constexpr ScheduleSource kScheduleSources[] = {
@source_rows@};

// The smallest extents a source's own kernels of a function run on an ISA (min_shapes;
// an ISA with frozen_schedules_of inherits them); below them, a call runs the ISA's
// hand-written variant. Every other (source, ISA, function) runs every shape.
inline constexpr const char *kMinShapeDimensions[] = {@min_shape_dimensions@};
struct MinShape {
    const char *source, *isa, *function;
    long long extents[std::size(kMinShapeDimensions)];  // by kMinShapeDimensions (attn::kProblemDimensions)
};
inline constexpr MinShape kMinShapes[] = {
@min_shape_rows@    {nullptr, nullptr, nullptr, {}}};

struct NotProvided {
    const char *source, *isa, *function;  // isa \"all\": on every ISA
};
inline constexpr NotProvided kNotProvided[] = {
@not_provided_rows@    {nullptr, nullptr, nullptr}};

struct ShapeClass {
    const char *name;
    int max_seq;  // the largest max(S_q, S_k) of the class; 0: no bound
};
inline constexpr ShapeClass kShapeClasses[] = {
@class_rows@};

// The shared memory a GPU kernel's block may use (manifest.json: gpu_shared_memory_per_block).
inline constexpr int kGpuSharedMemoryPerBlock = @ATTN_GPU_SHARED_MEMORY_PER_BLOCK@;

struct ManualParameter {
    const char *name;
    int default_value, gpu_default, min, max;
};
inline constexpr ManualParameter kManualParameters[] = {
@parameter_rows@};

constexpr const ManualParameter &manual_parameter(std::string_view name) {
    for (const ManualParameter &p : kManualParameters) {
        if (name == p.name) return p;
    }
    throw \"manifest.json: no such manual parameter\";
}

}  // namespace attn::manifest

// X(\"feature\") for every CPU feature an ISA needs (__builtin_cpu_supports takes literals).
#define ATTN_FOR_EACH_CPU_FEATURE(X)@feature_macro@
" @ONLY)
