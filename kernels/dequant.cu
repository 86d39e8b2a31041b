// CUDA dequantization: the device twin of dequant.cc, with the same per-element formulas
// (dequant_bits.h). One thread per output element, grid-stride over columns (x) and rows (y);
// each scheme is its own instantiation so the per-element code has no scheme switch.
// Self-contained (no metaload header but dequant_bits.h / convert_bits.h) so nvcc can compile it
// alone; the host wrapper in dequant.cc turns the returned error string into a ConversionError.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/dequant_bits.h"

namespace metaload {
namespace cuda_detail {
namespace {

template <QuantScheme S>
__device__ __forceinline__ float element(const QuantView& v, int64_t j, int64_t i) {
  if constexpr (S == QuantScheme::kGptq) return dq::gptq_at(v, j, i);
  if constexpr (S == QuantScheme::kAwq) return dq::awq_at(v, j, i);
  if constexpr (S == QuantScheme::kBnb4) return dq::bnb4_at(v, j, i);
  if constexpr (S == QuantScheme::kBnb8) return dq::bnb8_at(v, j, i);
  if constexpr (S == QuantScheme::kCtInt) return dq::ct_at(v, j, i);
  if constexpr (S == QuantScheme::kNvfp4) return dq::nvfp4_at(v, j, i);
  return dq::fp8_at(v, j, i);
}

template <QuantScheme S, int OF>
__global__ void dequant_kernel(const QuantView v, const DequantDst d) {
  constexpr int kElem = OF == 0 ? 4 : 2;
  for (int64_t r = blockIdx.y; r < d.rows; r += gridDim.y) {
    unsigned char* row = static_cast<unsigned char*>(d.data) + r * d.ld * kElem;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < d.cols;
         c += int64_t(gridDim.x) * blockDim.x) {
      dq::store(row, c, OF, element<S>(v, d.row0 + r, d.col0 + c));
    }
  }
}

template <QuantScheme S>
const char* launch(const QuantView& v, const DequantDst& d, cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  size_t bx = (static_cast<size_t>(d.cols) + kThreads - 1) / kThreads;
  if (bx > 1024) bx = 1024;
  size_t by = d.rows < 65535 ? static_cast<size_t>(d.rows) : 65535;
  while (bx * by > 65536 && by > 1) by /= 2;
  const dim3 grid(static_cast<unsigned>(bx), static_cast<unsigned>(by));
  switch (d.format) {
    case 0:
      dequant_kernel<S, 0><<<grid, kThreads, 0, stream>>>(v, d);
      break;
    case 1:
      dequant_kernel<S, 1><<<grid, kThreads, 0, stream>>>(v, d);
      break;
    default:
      dequant_kernel<S, 2><<<grid, kThreads, 0, stream>>>(v, d);
      break;
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace

// Returns nullptr or the CUDA error string.
const char* dequant(const QuantView& v, const DequantDst& d, void* stream_ptr) {
  if (d.rows == 0 || d.cols == 0) return nullptr;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  switch (v.scheme) {
    case QuantScheme::kGptq:
      return launch<QuantScheme::kGptq>(v, d, stream);
    case QuantScheme::kAwq:
      return launch<QuantScheme::kAwq>(v, d, stream);
    case QuantScheme::kBnb4:
      return launch<QuantScheme::kBnb4>(v, d, stream);
    case QuantScheme::kBnb8:
      return launch<QuantScheme::kBnb8>(v, d, stream);
    case QuantScheme::kFp8:
      return launch<QuantScheme::kFp8>(v, d, stream);
    case QuantScheme::kCtInt:
      return launch<QuantScheme::kCtInt>(v, d, stream);
    case QuantScheme::kNvfp4:
      return launch<QuantScheme::kNvfp4>(v, d, stream);
  }
  return "unknown scheme";
}

const char* dequant_sync(void* stream_ptr) {
  const cudaError_t err = cudaStreamSynchronize(static_cast<cudaStream_t>(stream_ptr));
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace cuda_detail
}  // namespace metaload
