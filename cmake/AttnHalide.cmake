# Finds Halide 21 from the project's virtual environment (pip install halide==21.0.0
# ships the CMake package), else from the Python the caller names (Python_EXECUTABLE:
# pip's build environment, pyproject.toml); Halide_ROOT set by the caller wins.
if (NOT DEFINED Halide_ROOT AND NOT DEFINED ENV{Halide_ROOT})
    find_program(ATTN_VENV_PYTHON python3 HINTS "${PROJECT_SOURCE_DIR}/.venv/bin" NO_DEFAULT_PATH)
    set(halide_python "${ATTN_VENV_PYTHON}")
    if (NOT ATTN_VENV_PYTHON AND DEFINED Python_EXECUTABLE)
        set(halide_python "${Python_EXECUTABLE}")
    endif ()
    if (halide_python)
        execute_process(COMMAND "${halide_python}" -c "import halide; print(halide.install_dir())"
                        OUTPUT_VARIABLE Halide_ROOT OUTPUT_STRIP_TRAILING_WHITESPACE
                        RESULT_VARIABLE halide_query_failed)
        # (In pip's isolated build environment, halide imports but names the target
        # environment's folder, where it is not.)
        if (halide_query_failed OR NOT EXISTS "${Halide_ROOT}/lib64/cmake/Halide/HalideConfig.cmake")
            unset(Halide_ROOT)
        endif ()
    endif ()
endif ()
# pip's isolated build environment (pyproject.toml): halide is in a site-packages folder that
# scikit-build-core puts on CMAKE_PREFIX_PATH.
if (NOT Halide_ROOT AND SKBUILD)
    foreach (prefix IN LISTS CMAKE_PREFIX_PATH)
        if (EXISTS "${prefix}/halide/lib64/cmake/Halide/HalideConfig.cmake")
            set(Halide_ROOT "${prefix}/halide")
            break()
        endif ()
    endforeach ()
endif ()
# The package itself, not a search from Halide_ROOT: a search can meet first the wheel's
# forwarding package in <environment>/share/cmake, which reads the target interpreter's
# site-packages (where pip's build environment has no halide).
if (Halide_ROOT AND NOT DEFINED Halide_DIR)
    set(Halide_DIR "${Halide_ROOT}/lib64/cmake/Halide")
endif ()
find_package(Halide 21.0.0 EXACT REQUIRED)

# Where libHalide and the autoscheduler plugins are (the installed generators' RPATH,
# the autotuner's --plugins).
if (TARGET Halide::Halide)  # not in a cross build, which only runs the host's generators
    get_target_property(halide_library Halide::Halide LOCATION)
    get_filename_component(ATTN_HALIDE_LIBRARY_DIR "${halide_library}" DIRECTORY)
endif ()
