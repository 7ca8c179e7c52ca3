# Finds Halide 21 from the project's virtual environment (pip install halide==21.0.0
# ships the CMake package); Halide_ROOT set by the caller wins.
if (NOT DEFINED Halide_ROOT AND NOT DEFINED ENV{Halide_ROOT})
    find_program(ATTN_VENV_PYTHON python3 HINTS "${PROJECT_SOURCE_DIR}/.venv/bin" NO_DEFAULT_PATH)
    if (ATTN_VENV_PYTHON)
        execute_process(COMMAND "${ATTN_VENV_PYTHON}" -c "import halide; print(halide.install_dir())"
                        OUTPUT_VARIABLE Halide_ROOT OUTPUT_STRIP_TRAILING_WHITESPACE
                        RESULT_VARIABLE halide_query_failed)
        if (halide_query_failed)
            unset(Halide_ROOT)
        endif ()
    endif ()
endif ()
find_package(Halide 21.0.0 EXACT REQUIRED)

# Where libHalide and the autoscheduler plugins are (the installed generators' RPATH,
# the autotuner's --plugins).
if (TARGET Halide::Halide)  # not in a cross build, which only runs the host's generators
    get_target_property(halide_library Halide::Halide LOCATION)
    get_filename_component(ATTN_HALIDE_LIBRARY_DIR "${halide_library}" DIRECTORY)
endif ()
