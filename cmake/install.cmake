# What `pip install .` (scikit-build-core, pyproject.toml) puts into the wheel: the Python package
# (wheel.packages), libmetaload.so inside it, and the `metaload` tool among the scripts.
if(SKBUILD)
  # Found next to the package by metaload._lib; libtorch comes from the torch package beside it.
  set_target_properties(metaload PROPERTIES INSTALL_RPATH "$ORIGIN/../torch/lib")
  install(TARGETS metaload LIBRARY DESTINATION metaload)
  # The tool finds the library in site-packages/metaload relative to the scripts folder.
  target_compile_definitions(metaload_cli PRIVATE
    METALOAD_INSTALLED_LIB="../lib/python${Python_VERSION_MAJOR}.${Python_VERSION_MINOR}/site-packages/metaload/libmetaload.so")
  install(TARGETS metaload_cli RUNTIME DESTINATION "${SKBUILD_SCRIPTS_DIR}")
endif()

# `cmake --install`: a CMake package for C++ consumers (examples/cmake_consumer):
#   find_package(metaload REQUIRED)   # also finds Torch and nlohmann_json
#   target_link_libraries(app PRIVATE metaload::metaload)
if(NOT SKBUILD)
  include(GNUInstallDirs)
  include(CMakePackageConfigHelpers)
  install(TARGETS metaload EXPORT metaloadTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(TARGETS metaload_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(DIRECTORY base c10_ext fake_mode kernels loader model
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
  install(EXPORT metaloadTargets NAMESPACE metaload::
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/metaload)
  configure_package_config_file(cmake/metaloadConfig.cmake.in
    ${CMAKE_CURRENT_BINARY_DIR}/metaloadConfig.cmake
    INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/metaload)
  write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/metaloadConfigVersion.cmake
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/metaloadConfig.cmake
                ${CMAKE_CURRENT_BINARY_DIR}/metaloadConfigVersion.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/metaload)
endif()
