# Conversion kernel tests. Included from tests/kernels/CMakeLists.txt.
metaload_test(kernels_convert_test SOURCES convert_test.cc)
metaload_test(kernels_convert_cuda_test SOURCES convert_cuda_test.cc)
