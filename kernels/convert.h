// Dtype conversion kernels: bf16 <-> f16 <-> f32 in all six directions plus the identity copy, on
// the CPU (vectorized loops) and on CUDA (convert.cu). Torch-free and CUDA-header-free: callers
// pass CUDA streams as void*. The bits written are the same on both devices; see convert_bits.h
// for the rounding and NaN rules (those of libtorch's CPU Tensor.to()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/errors.h"

namespace metaload {

// The float formats these kernels convert among: the kernels' own enum of what they do, not a
// dtype table (the format's dtypes and their torch names are loader/format/safetensors.cc's
// kDTypes, a layer this one may not use; loader/load/slots_torch.cc maps a tensor dtype onto it).
enum class FloatFormat : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// "F32", "F16", "BF16": the safetensors spelling.
const char* float_format_name(FloatFormat f);
inline size_t float_format_size(FloatFormat f) {
  return f == FloatFormat::kF32 ? 4 : 2;
}
// Parses a safetensors dtype name; false when it is not one of the three float formats.
bool parse_float_format(const std::string& name, FloatFormat* out);

// n elements from src (format `from`) to dst (format `to`); from == to copies. The ranges must not
// overlap. Pure function of its arguments: disjoint chunks may run on any threads at once.
void convert_cpu(const void* src, FloatFormat from, void* dst, FloatFormat to, size_t n);

// rows x cols elements; pitches are the bytes from one row's start to the next. Gathers a strided
// slice and converts it in one pass.
void convert_cpu_2d(const void* src, size_t src_pitch, FloatFormat from, void* dst,
                    size_t dst_pitch, FloatFormat to, size_t rows, size_t cols);

// True when this build compiled the CUDA kernels (nvcc existed); says nothing about a GPU.
bool convert_cuda_compiled();

// The CUDA twin of convert_cpu_2d on device pointers, queued on `stream` (a cudaStream_t, or
// nullptr for the default stream). Throws ConversionError when the launch fails or the build has
// no CUDA kernels.
void convert_cuda_2d(const void* src, size_t src_pitch, FloatFormat from, void* dst,
                     size_t dst_pitch, FloatFormat to, size_t rows, size_t cols, void* stream);

}  // namespace metaload
