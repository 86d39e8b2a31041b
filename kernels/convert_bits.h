// Bit-level float conversions shared by the CPU kernels (convert.cc) and the CUDA kernels
// (convert.cu), so that a checkpoint converts to the same bits on every device. Plain C++ (no CUDA
// header): under nvcc METALOAD_HD marks the functions __host__ __device__.
//
// Rounding is round-to-nearest-even everywhere, denormals are kept (no flush to zero), overflow
// goes to +-inf. NaN outputs copy what libtorch's CPU Tensor.to() writes (measured on 1.13 with
// its AVX2/AVX512 kernels, the capability it picks on every x86-64 CPU since 2013):
//   f32  -> bf16: 0xFFFF for every NaN (torch's vectorized kernel; its scalar path writes 0x7FC0)
//   f16  -> bf16: 0x7FC0 (torch goes through c10::BFloat16(float), the scalar path)
//   f32/bf16 -> f16: 0x7E00 | sign (payload dropped, like c10::Half)
//   f16  -> f32: payload kept, quiet bit set; bf16 -> f32: the exact bits (a widening shift).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define METALOAD_HD __host__ __device__ __forceinline__
#else
#define METALOAD_HD inline __attribute__((always_inline))
#endif

namespace metaload {
namespace bits {

METALOAD_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

METALOAD_HD float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

METALOAD_HD uint32_t bf16_to_f32(uint16_t h) {
  return static_cast<uint32_t>(h) << 16;
}

// Adds half of the dropped part, plus one when the kept part is odd: ties go to even.
METALOAD_HD uint16_t f32_to_bf16_rne(uint32_t x) {
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// f32 -> bf16 as torch's vectorized CPU kernel does it (NaN -> 0xFFFF).
METALOAD_HD uint16_t f32_to_bf16(uint32_t x) {
  const uint16_t r = f32_to_bf16_rne(x);
  return (x & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>(0xFFFFu) : r;
}

// f32 -> bf16 as c10::BFloat16(float) does it (NaN -> 0x7FC0); torch uses it for f16 -> bf16.
METALOAD_HD uint16_t f32_to_bf16_scalar(uint32_t x) {
  const uint16_t r = f32_to_bf16_rne(x);
  return (x & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>(0x7FC0u) : r;
}

METALOAD_HD uint32_t f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  // Normal numbers: rebias the exponent (15 -> 127).
  const uint32_t normal = ((exp + 112u) << 23) | (man << 13);
  // Subnormals are man * 2^-24: exact in float, and the multiply keeps the code branch-free.
  const uint32_t sub = f32_bits(static_cast<float>(man) * 5.9604644775390625e-8f);
  // Inf stays inf; a NaN keeps its payload and becomes quiet, like the hardware conversion.
  const uint32_t special = 0x7F800000u | (man << 13) | (man != 0 ? 0x400000u : 0u);
  const uint32_t mag = exp == 0 ? sub : (exp == 31 ? special : normal);
  return sign | mag;
}

METALOAD_HD uint16_t f32_to_f16(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  // Normal results: drop 13 mantissa bits with ties-to-even; a carry moves into the exponent and
  // everything from 65520 up (and inf) lands on or is clamped to 0x7C00 (inf).
  uint32_t normal = ((a - 0x38000000u) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  normal = normal > 0x7C00u ? 0x7C00u : normal;
  // Results below 2^-14 are half subnormals (units of 2^-24): adding 0.5f, whose last mantissa
  // bit is worth 2^-24, makes the FPU round to that unit (ties-to-even); the low bits are the
  // count.
  const uint32_t sub = f32_bits(f32_from_bits(a) + 0.5f) - 0x3F000000u;
  uint32_t r = a < 0x38800000u ? sub : normal;
  r = a > 0x7F800000u ? 0x7E00u : r;
  return static_cast<uint16_t>(sign | r);
}

}  // namespace bits
}  // namespace metaload
