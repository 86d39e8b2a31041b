// Compiles libtorch's headers once into a precompiled header that every libtorch translation unit
// of the CMake build reuses (CMakeLists.txt: METALOAD_PCH). Intentionally empty.
