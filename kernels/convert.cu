// CUDA dtype conversion: the device twin of convert.cc, with the same bit functions
// (convert_bits.h). Grid-stride over rows (y) and column groups (x); each thread moves 8 elements
// with 16-byte vector loads when the pointers and pitches allow, one element otherwise.
// Self-contained (no metaload header but convert_bits.h) so nvcc can compile it alone; the host
// wrapper in convert.cc turns the returned error string into a ConversionError.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/convert_bits.h"

namespace metaload {
namespace cuda_detail {
namespace {

// One conversion as a type: `In` bits to `Out` bits through `F`.
template <class InT, class OutT, OutT (*F)(InT)>
struct Conversion {
  using In = InT;
  using Out = OutT;
  static __device__ __forceinline__ Out apply(In x) { return F(x); }
};

METALOAD_HD uint16_t bf16_to_f16(uint16_t x) {
  return bits::f32_to_f16(bits::bf16_to_f32(x));
}
METALOAD_HD uint16_t f16_to_bf16(uint16_t x) {
  return bits::f32_to_bf16_scalar(bits::f16_to_f32(x));
}

using F32ToBF16 = Conversion<uint32_t, uint16_t, &bits::f32_to_bf16>;
using F32ToF16 = Conversion<uint32_t, uint16_t, &bits::f32_to_f16>;
using BF16ToF32 = Conversion<uint16_t, uint32_t, &bits::bf16_to_f32>;
using F16ToF32 = Conversion<uint16_t, uint32_t, &bits::f16_to_f32>;
using BF16ToF16 = Conversion<uint16_t, uint16_t, &bf16_to_f16>;
using F16ToBF16 = Conversion<uint16_t, uint16_t, &f16_to_bf16>;

constexpr int kVec = 8;  // elements per thread in the vector path: 16 or 32 bytes

// Vector path: every row start is 16-byte aligned and cols % kVec == 0.
template <class Op>
__global__ void convert_vec(const unsigned char* __restrict__ src, size_t src_pitch,
                            unsigned char* __restrict__ dst, size_t dst_pitch, size_t rows,
                            size_t groups) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  constexpr int kInWords = kVec * sizeof(In) / 16;
  constexpr int kOutWords = kVec * sizeof(Out) / 16;
  for (size_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const uint4* s = reinterpret_cast<const uint4*>(src + r * src_pitch);
    uint4* d = reinterpret_cast<uint4*>(dst + r * dst_pitch);
    for (size_t g = blockIdx.x * size_t(blockDim.x) + threadIdx.x; g < groups;
         g += size_t(gridDim.x) * blockDim.x) {
      union {
        uint4 w[kInWords];
        In e[kVec];
      } in;
      union {
        uint4 w[kOutWords];
        Out e[kVec];
      } out;
#pragma unroll
      for (int k = 0; k < kInWords; ++k) in.w[k] = s[g * kInWords + k];
#pragma unroll
      for (int k = 0; k < kVec; ++k) out.e[k] = Op::apply(in.e[k]);
#pragma unroll
      for (int k = 0; k < kOutWords; ++k) d[g * kOutWords + k] = out.w[k];
    }
  }
}

// Any alignment: one element per thread, moved with memcpy (byte loads when unaligned).
template <class Op>
__global__ void convert_any(const unsigned char* __restrict__ src, size_t src_pitch,
                            unsigned char* __restrict__ dst, size_t dst_pitch, size_t rows,
                            size_t cols) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  for (size_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const unsigned char* s = src + r * src_pitch;
    unsigned char* d = dst + r * dst_pitch;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < cols;
         i += size_t(gridDim.x) * blockDim.x) {
      In x;
      memcpy(&x, s + i * sizeof(In), sizeof(In));
      const Out y = Op::apply(x);
      memcpy(d + i * sizeof(Out), &y, sizeof(Out));
    }
  }
}

bool aligned16(const void* p, size_t pitch, size_t rows) {
  return (reinterpret_cast<uintptr_t>(p) % 16 == 0) && (rows <= 1 || pitch % 16 == 0);
}

template <class Op>
const char* launch(const void* src, size_t src_pitch, void* dst, size_t dst_pitch, size_t rows,
                   size_t cols, cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  const bool vec =
      cols % kVec == 0 && aligned16(src, src_pitch, rows) && aligned16(dst, dst_pitch, rows);
  const size_t work = vec ? cols / kVec : cols;
  // Enough blocks to fill any current GPU; grid-stride loops cover the rest.
  size_t bx = (work + kThreads - 1) / kThreads;
  if (bx > 4096) bx = 4096;
  size_t by = rows < 65535 ? rows : 65535;
  while (bx * by > 65536 && bx > 1) bx /= 2;
  const dim3 grid(static_cast<unsigned>(bx), static_cast<unsigned>(by));
  auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  if (vec) {
    convert_vec<Op><<<grid, kThreads, 0, stream>>>(s, src_pitch, d, dst_pitch, rows, work);
  } else {
    convert_any<Op><<<grid, kThreads, 0, stream>>>(s, src_pitch, d, dst_pitch, rows, cols);
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace

// from/to: FloatFormat values (0 = F32, 1 = F16, 2 = BF16). Returns nullptr or the CUDA error.
const char* convert_2d(const void* src, size_t src_pitch, int from, void* dst, size_t dst_pitch,
                       int to, size_t rows, size_t cols, void* stream_ptr) {
  if (rows == 0 || cols == 0) return nullptr;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (from == to) {
    const size_t width = cols * (from == 0 ? 4 : 2);
    const cudaError_t err =
        cudaMemcpy2DAsync(dst, rows > 1 ? dst_pitch : width, src, rows > 1 ? src_pitch : width,
                          width, rows, cudaMemcpyDeviceToDevice, stream);
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
  }
  if (from == 0 && to == 2)
    return launch<F32ToBF16>(src, src_pitch, dst, dst_pitch, rows, cols, stream);
  if (from == 0 && to == 1)
    return launch<F32ToF16>(src, src_pitch, dst, dst_pitch, rows, cols, stream);
  if (from == 2 && to == 0)
    return launch<BF16ToF32>(src, src_pitch, dst, dst_pitch, rows, cols, stream);
  if (from == 1 && to == 0)
    return launch<F16ToF32>(src, src_pitch, dst, dst_pitch, rows, cols, stream);
  if (from == 2 && to == 1)
    return launch<BF16ToF16>(src, src_pitch, dst, dst_pitch, rows, cols, stream);
  if (from == 1 && to == 2)
    return launch<F16ToBF16>(src, src_pitch, dst, dst_pitch, rows, cols, stream);
  return "unsupported conversion";
}

}  // namespace cuda_detail
}  // namespace metaload
