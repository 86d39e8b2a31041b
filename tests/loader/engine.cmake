# Engine, slots, TP and swap tests. Included from tests/loader/CMakeLists.txt.
metaload_test(loader_engine_test SOURCES engine_test.cc)
metaload_test(loader_engine_swap_test SOURCES engine_swap_test.cc)
