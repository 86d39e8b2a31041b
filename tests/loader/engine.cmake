# Engine, slots, TP and swap tests. Included from tests/loader/CMakeLists.txt.
metaload_test(loader_engine_test SOURCES engine_test.cc)
# Fresh slot pages filled from the page cache (loader/engine/page_copy.h).
metaload_test(loader_page_copy_test SOURCES page_copy_test.cc)
metaload_test(loader_engine_swap_test SOURCES engine_swap_test.cc)
# The zero-copy contract: mapped files truncated, overwritten, renamed (loader/engine/file_mapping.h).
metaload_test(loader_file_mapping_test SOURCES file_mapping_test.cc)
# Pieces of a mapped file side by side, zero-copy: the fused experts (FileMapping::map_view).
metaload_test(loader_mapped_view_test SOURCES mapped_view_test.cc)
# The Python that runs the Python tests (tools/gpu_check points it at the pip torch's).
if(NOT METALOAD_PYTHON)
  set(METALOAD_PYTHON /usr/bin/python3)
endif()
# The swap from Python (tests/python/test_engine_swap.py).
add_test(NAME python_engine_swap
  COMMAND ${METALOAD_PYTHON} -m pytest ${PROJECT_SOURCE_DIR}/tests/python/test_engine_swap.py -q -p no:cacheprovider)
set_tests_properties(python_engine_swap PROPERTIES ENVIRONMENT
  "METALOAD_LIB=$<TARGET_FILE:metaload>;PYTHONPATH=${PROJECT_SOURCE_DIR}/python")
metaload_test(loader_engine_load_test SOURCES engine_load_test.cc)
# load_into from Python: resnet50 through the project's writer and back (tests/python/test_engine_load.py).
add_test(NAME python_engine_load
  COMMAND ${METALOAD_PYTHON} -m pytest ${PROJECT_SOURCE_DIR}/tests/python/test_engine_load.py -q -p no:cacheprovider)
set_tests_properties(python_engine_load PROPERTIES ENVIRONMENT
  "METALOAD_LIB=$<TARGET_FILE:metaload>;PYTHONPATH=${PROJECT_SOURCE_DIR}/python")
# The staged engine on a GPU (skips itself without one; tools/gpu_check).
metaload_test(loader_engine_cuda_test SOURCES engine_cuda_test.cc)
