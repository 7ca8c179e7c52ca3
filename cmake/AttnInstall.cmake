# `cmake --install`: headers, the runtime library (attn::attention), the per-ISA kernel
# libraries, the Halide runtime and a CMake package, so that a downstream project does
#   find_package(attn 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE attn::attention)
# Laid out like fmt's package: <prefix>/lib/cmake/attn/{attnConfig,attnConfigVersion,attnTargets}.cmake.
include(CMakePackageConfigHelpers)

set(ATTN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/attn" CACHE STRING "Where attn's CMake package goes")

set(installed_targets attn_attention attn_halide_runtime ${ATTN_KERNEL_LIBRARIES})
if (TARGET attn_cli)
    list(APPEND installed_targets attn_cli)
endif ()
install(TARGETS ${installed_targets}
        EXPORT attnTargets
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT attn_cli
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT attn_development)
# The generators, for `attn generate`; they load libHalide from where it was built against (the venv).
if (TARGET attn_generators)
    set_target_properties(attn_generators PROPERTIES INSTALL_RPATH "${ATTN_HALIDE_LIBRARY_DIR}")
    install(TARGETS attn_generators RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/attn COMPONENT attn_cli)
else ()  # imported, with the RPATH of the build that made them
    install(IMPORTED_RUNTIME_ARTIFACTS ${ATTN_GENERATORS} RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/attn
            COMPONENT attn_cli)
endif ()
install(DIRECTORY runtime/include/attn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT attn_development)
install(EXPORT attnTargets
        NAMESPACE attn::
        DESTINATION ${ATTN_INSTALL_CMAKEDIR}
        COMPONENT attn_development)

configure_package_config_file(cmake/attnConfig.cmake.in "${PROJECT_BINARY_DIR}/attnConfig.cmake"
                              INSTALL_DESTINATION ${ATTN_INSTALL_CMAKEDIR})
write_basic_package_version_file("${PROJECT_BINARY_DIR}/attnConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/attnConfig.cmake" "${PROJECT_BINARY_DIR}/attnConfigVersion.cmake"
        DESTINATION ${ATTN_INSTALL_CMAKEDIR}
        COMPONENT attn_development)
