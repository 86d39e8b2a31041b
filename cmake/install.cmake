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
