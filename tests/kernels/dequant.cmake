# Dequantization kernel tests. Included from tests/kernels/CMakeLists.txt.
metaload_test(kernels_dequant_test SOURCES dequant_test.cc)
metaload_test(kernels_dequant_vector_test SOURCES dequant_vector_test.cc)
metaload_test(kernels_dequant_cuda_test SOURCES dequant_cuda_test.cc)
