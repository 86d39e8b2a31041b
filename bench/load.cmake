# bench/load: the streaming loader against its anchors. Included from bench/CMakeLists.txt.
add_executable(bench_load load.cc)
target_link_libraries(bench_load PRIVATE metaload)
set_target_properties(bench_load PROPERTIES OUTPUT_NAME load)
