# Dequantization kernels (CPU + CUDA) and their torch ops. Included from kernels/CMakeLists.txt.
metaload_component(kernels_dequant SOURCES dequant.cc dequant_ops.cc)
set_source_files_properties(dequant.cc PROPERTIES COMPILE_OPTIONS "-O3;-fno-trapping-math")
if(METALOAD_HAVE_CUDA)
  target_sources(metaload_kernels_dequant PRIVATE dequant.cu)
  target_compile_definitions(metaload_kernels_dequant PUBLIC METALOAD_WITH_CUDA=1)
  target_link_libraries(metaload_kernels_dequant PUBLIC CUDA::cudart_static)
endif()
