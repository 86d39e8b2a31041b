# Dtype conversion kernels (CPU + CUDA). Included from kernels/CMakeLists.txt.
metaload_component(kernels_convert SOURCES convert.cc TORCH_FREE)
# -O3 and -fno-trapping-math let the compiler vectorize the branch-free per-element code.
set_source_files_properties(convert.cc PROPERTIES COMPILE_OPTIONS "-O3;-fno-trapping-math")
if(METALOAD_HAVE_CUDA)
  target_sources(metaload_kernels_convert PRIVATE convert.cu)
  target_compile_definitions(metaload_kernels_convert PUBLIC METALOAD_WITH_CUDA=1)
  # The static runtime: the library loads on machines without CUDA and fails only when used.
  target_link_libraries(metaload_kernels_convert PUBLIC CUDA::cudart_static)
endif()
