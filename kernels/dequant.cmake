# Dequantization kernels (CPU + CUDA) and their torch ops. Included from kernels/CMakeLists.txt.
metaload_component(kernels_dequant SOURCES dequant.cc dequant_avx2.cc dequant_ops.cc)
set_source_files_properties(dequant.cc PROPERTIES COMPILE_OPTIONS "-O3;-fno-trapping-math")
# The AVX2 + F16C kernels: only this file gets the ISA flags (dequant.cc picks it at run time).
# Never -mfma, and no contraction: a multiply and an add round twice, as the references do.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|i.86")
  set_source_files_properties(dequant_avx2.cc PROPERTIES COMPILE_OPTIONS
    "-O3;-fno-trapping-math;-ffp-contract=off;-mavx2;-mf16c")
endif()
if(METALOAD_HAVE_CUDA)
  target_sources(metaload_kernels_dequant PRIVATE dequant.cu)
  target_compile_definitions(metaload_kernels_dequant PUBLIC METALOAD_WITH_CUDA=1)
  target_link_libraries(metaload_kernels_dequant PUBLIC CUDA::cudart_static)
endif()
