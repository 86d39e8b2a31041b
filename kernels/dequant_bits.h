// Dequantization shared by the CPU kernels (dequant.cc) and the CUDA kernels (dequant.cu): the
// layouts as plain structs and the per-element formulas, so that both devices compute the same
// float for every element (same operations in the same order; the CUDA side uses _rn intrinsics so
// that nvcc does not fuse a multiply and an add that the CPU rounds twice). Plain C++, no torch and
// no CUDA header: under nvcc METALOAD_HD marks the functions __host__ __device__.
//
// Every weight is described in its logical shape [out, in] (nn.Linear's weight). The layouts, as
// the quantizing libraries write them into safetensors:
//   GPTQ   qweight int32 [in / (32 / bits), out]: input row i is bits-wide field i % pack of word
//          [i / pack, j], lowest bits first. qzeros int32 [groups, out / pack]: the same packing
//          along the output dim. scales [groups, out]. g_idx int32 [in] (the group of each input
//          row; act order permutes it), else group i / group_size. w = (q - (z + zero_offset)) * s,
//          where zero_offset is 1 for checkpoint format "gptq" (v1 stores z - 1) and 0 for
//          "gptq_v2".
//   AWQ    (GEMM) qweight int32 [in, out / 8] packed along the output dim in AWQ's interleaved
//          nibble order: output column 8c + k sits in nibble kAwqNibble[k] of word [i, c]. qzeros
//          int32 [in / group, out / 8] likewise; scales [in / group, out]. w = (q - z) * s.
//   BNB4   bitsandbytes NF4/FP4: the row-major weight flattened, two codes per byte (the even
//          element in the high nibble), absmax per `group_size` (blocksize) elements, code =
//          quant_map (16 floats). w = code[q] * absmax[b]. With double quantization absmax itself
//          is uint8 codes: absmax[b] = nested_code[qa[b]] * nested_absmax[b / nested_block] +
//          offset.
//   BNB8   bitsandbytes LLM.int8: int8 weight [out, in], SCB (row absmax) f32 [out].
//          w = (q * SCB[j]) * (1 / 127), as bitsandbytes' int8_vectorwise_dequant.
//   FP8    float8 e4m3fn weight [out, in], weight_scale_inv [ceil(out / bo), ceil(in / bi)] (bo x
//          bi blocks, 128 x 128 in DeepSeek-V3 / Qwen3 FP8 checkpoints). w = fp8(q) * s.
//   CTINT  compressed-tensors pack-quantized: weight_packed int32 [out, ceil(in * bits / 32)],
//          each row a dense bit stream (input i is the bits-wide field at bit i * bits, lowest
//          bits first, straddling words where 32 % bits != 0) of q + 2^(bits - 1);
//          weight_scale [out, groups]; asymmetric: weight_zero_point int32
//          [ceil(out * bits / 32), groups], the same stream down each column (output j at bit
//          j * bits). w = (q - z) * s, z = 2^(bits - 1) when symmetric.
//   NVFP4  compressed-tensors nvfp4-pack-quantized: weight_packed uint8 [out, in / 2], FP4 E2M1
//          codes (sign, 2 exponent bits, 1 mantissa bit), input 2k in the low nibble and 2k + 1
//          in the high one; weight_scale float8 e4m3fn [out, in / 16]; weight_global_scale f32
//          [1]. w = e2m1(q) * (fp8(s) / global), the division rounded to f32 first.
// Products are computed in f32 and rounded once to the output format (convert_bits.h rules).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/convert_bits.h"

namespace metaload {

enum class QuantScheme : uint8_t {
  kGptq = 0,
  kAwq = 1,
  kBnb4 = 2,
  kBnb8 = 3,
  kFp8 = 4,
  kCtInt = 5,
  kNvfp4 = 6
};

// One quantized weight: pointers into its stored tensors (host or device; on the host they may be
// unaligned, loads go through memcpy). Formats are FloatFormat values (0 F32, 1 F16, 2 BF16).
struct QuantView {
  QuantScheme scheme = QuantScheme::kGptq;
  int64_t out = 0, in = 0;       // logical [out, in]
  const void* q = nullptr;       // qweight / packed codes / int8 / fp8 bytes
  const void* zeros = nullptr;   // GPTQ / AWQ qzeros
  const void* scales = nullptr;  // scales / absmax (f32 or nested codes) / SCB / weight_scale_inv
                                 // / weight_scale (NVFP4: e4m3 bytes)
  int scales_format = 0;
  const void* global_scale = nullptr;   // NVFP4: weight_global_scale, one f32
  const void* g_idx = nullptr;          // GPTQ int32 [in], or null
  const void* code = nullptr;           // BNB4 quant_map: 16 f32
  const void* nested_scales = nullptr;  // BNB4 double quantization: nested_absmax f32; else null
  const void* nested_code = nullptr;    // BNB4 double quantization: nested_quant_map 256 f32
  float offset = 0;                     // BNB4 double quantization: nested offset
  int bits = 4;                         // GPTQ: 2, 4 or 8; CTINT: 1 to 8
  int64_t group_size = 0;    // GPTQ / AWQ / CTINT / NVFP4: inputs per group; BNB4: blocksize;
                             // FP8: block rows
  int64_t block_in = 0;      // FP8: block columns
  int64_t nested_block = 0;  // BNB4 double quantization: blocks per nested absmax
  int64_t groups = 0;        // GPTQ / AWQ: rows of scales (and of qzeros); CTINT / NVFP4: columns
  int zero_offset = 0;       // GPTQ: 1 for checkpoint format v1
};

// Where the dequantized window goes: rows [row0, row0 + rows) and columns [col0, col0 + cols) of
// the logical weight, row-major with `ld` elements from one row to the next, in `format`.
struct DequantDst {
  void* data = nullptr;
  int format = 2;
  int64_t ld = 0;
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
};

namespace dq {

// Output column 8c + k of an AWQ word is in nibble kAwqNibble[k] (AWQ packs columns in the order
// 0 2 4 6 1 3 5 7).
METALOAD_HD int awq_nibble(int64_t k) {
  // (k & 1) * 4 + (k >> 1): 0 4 1 5 2 6 3 7 without a table.
  return static_cast<int>(((k & 1) << 2) + (k >> 1));
}

// Output column j's 4-bit code (or zero) in an AWQ word of its 8 columns.
METALOAD_HD int32_t awq_code(uint32_t w, int64_t j) {
  return static_cast<int32_t>((w >> (4 * awq_nibble(j & 7))) & 0xFu);
}

METALOAD_HD uint32_t ld32(const void* p, int64_t i) {
  uint32_t v;
  memcpy(&v, static_cast<const unsigned char*>(p) + i * 4, 4);
  return v;
}

METALOAD_HD float ldf(const void* p, int64_t i, int fmt) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  if (fmt == 0) {
    float f;
    memcpy(&f, b + i * 4, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, b + i * 2, 2);
  return bits::f32_from_bits(fmt == 1 ? bits::f16_to_f32(h) : bits::bf16_to_f32(h));
}

template <int Fmt>
METALOAD_HD float ldf_t(const void* p, int64_t i) {
  return ldf(p, i, Fmt);
}

METALOAD_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
METALOAD_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
METALOAD_HD float fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// float8 e4m3fn (bias 7, no infinities, S.1111.111 is NaN) to f32; exact.
METALOAD_HD float fp8_e4m3(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xFu;
  const uint32_t m = b & 0x7u;
  uint32_t mag;
  if (e == 0) {
    mag = bits::f32_bits(static_cast<float>(m) * 0.001953125f);  // m * 2^-9
  } else if (e == 15 && m == 7) {
    mag = 0x7FC00000u;
  } else {
    mag = ((e + 120u) << 23) | (m << 20);
  }
  return bits::f32_from_bits(sign | mag);
}

// Element (j, i) of the logical weight, per scheme.
METALOAD_HD int64_t gptq_group(const QuantView& v, int64_t i) {
  return v.g_idx ? static_cast<int64_t>(static_cast<int32_t>(ld32(v.g_idx, i))) : i / v.group_size;
}

METALOAD_HD float gptq_at(const QuantView& v, int64_t j, int64_t i) {
  const int pack = 32 / v.bits;
  const uint32_t mask = (1u << v.bits) - 1u;
  const int64_t g = gptq_group(v, i);
  const uint32_t w = ld32(v.q, (i / pack) * v.out + j);
  const int32_t q = static_cast<int32_t>((w >> (v.bits * (i % pack))) & mask);
  const uint32_t zw = ld32(v.zeros, g * (v.out / pack) + j / pack);
  const int32_t z = static_cast<int32_t>((zw >> (v.bits * (j % pack))) & mask) + v.zero_offset;
  return mul(static_cast<float>(q - z), ldf(v.scales, g * v.out + j, v.scales_format));
}

METALOAD_HD float awq_at(const QuantView& v, int64_t j, int64_t i) {
  const int64_t g = i / v.group_size;
  const int32_t q = awq_code(ld32(v.q, i * (v.out / 8) + j / 8), j);
  const int32_t z = awq_code(ld32(v.zeros, g * (v.out / 8) + j / 8), j);
  return mul(static_cast<float>(q - z), ldf(v.scales, g * v.out + j, v.scales_format));
}

// The absmax of bitsandbytes block b (plain f32, or double-quantized).
METALOAD_HD float bnb4_absmax(const QuantView& v, int64_t b) {
  if (v.nested_scales == nullptr) return ldf(v.scales, b, 0);
  const uint8_t qa = static_cast<const uint8_t*>(v.scales)[b];
  return add(mul(ldf(v.nested_code, qa, 0), ldf(v.nested_scales, b / v.nested_block, 0)), v.offset);
}

METALOAD_HD float bnb4_at(const QuantView& v, int64_t j, int64_t i) {
  const int64_t k = j * v.in + i;
  const uint8_t byte = static_cast<const uint8_t*>(v.q)[k >> 1];
  const int code = (k & 1) ? (byte & 0xF) : (byte >> 4);
  return mul(ldf(v.code, code, 0), bnb4_absmax(v, k / v.group_size));
}

constexpr float kInv127 = 7.874015718698502e-3f;  // bitsandbytes' 1/127

METALOAD_HD float bnb8_at(const QuantView& v, int64_t j, int64_t i) {
  const int8_t q = static_cast<const int8_t*>(v.q)[j * v.in + i];
  return mul(mul(static_cast<float>(q), ldf(v.scales, j, v.scales_format)), kInv127);
}

METALOAD_HD float fp8_at(const QuantView& v, int64_t j, int64_t i) {
  const int64_t scols = (v.in + v.block_in - 1) / v.block_in;
  const float s = ldf(v.scales, (j / v.group_size) * scols + i / v.block_in, v.scales_format);
  return mul(fp8_e4m3(static_cast<const uint8_t*>(v.q)[j * v.in + i]), s);
}

// compressed-tensors' dense packing: the `bits`-wide field at bit `p` of a stream of int32 words
// (word k of the stream at word0 + k * stride), unsigned.
METALOAD_HD uint32_t ct_field(const void* words, int64_t word0, int64_t stride, int64_t p,
                              int bits) {
  const int64_t k = p >> 5;
  const int off = static_cast<int>(p & 31);
  uint32_t v = ld32(words, word0 + k * stride) >> off;
  if (off + bits > 32) v |= ld32(words, word0 + (k + 1) * stride) << (32 - off);
  return v & ((1u << bits) - 1u);
}

METALOAD_HD int64_t ct_words(const QuantView& v) {
  return (v.in * v.bits + 31) / 32;
}

// The zero point of output j in group g (2^(bits - 1) when symmetric).
METALOAD_HD int32_t ct_zero(const QuantView& v, int64_t j, int64_t g) {
  if (v.zeros == nullptr) return 1 << (v.bits - 1);
  return static_cast<int32_t>(ct_field(v.zeros, g, v.groups, j * v.bits, v.bits));
}

METALOAD_HD float ct_at(const QuantView& v, int64_t j, int64_t i) {
  const int64_t g = i / v.group_size;
  const int32_t q = static_cast<int32_t>(ct_field(v.q, j * ct_words(v), 1, i * v.bits, v.bits));
  return mul(static_cast<float>(q - ct_zero(v, j, g)),
             ldf(v.scales, j * v.groups + g, v.scales_format));
}

// FP4 E2M1 code (bit 3 the sign) to f32: 0, 0.5, 1, 1.5, 2, 3, 4, 6; exact.
METALOAD_HD float e2m1(int code) {
  const int e = (code >> 1) & 3, m = code & 1;
  const float mag = e == 0 ? 0.5f * static_cast<float>(m)
                           : static_cast<float>(2 + m) * static_cast<float>(1 << e) * 0.25f;
  return (code & 8) ? -mag : mag;
}

// NVFP4 group scale: fp8(weight_scale) / global, rounded to f32 as compressed-tensors does.
METALOAD_HD float nvfp4_scale(const QuantView& v, int64_t j, int64_t g) {
  const uint8_t s = static_cast<const uint8_t*>(v.scales)[j * v.groups + g];
  return fdiv(fp8_e4m3(s), ldf(v.global_scale, 0, 0));
}

METALOAD_HD float nvfp4_at(const QuantView& v, int64_t j, int64_t i) {
  const uint8_t byte = static_cast<const uint8_t*>(v.q)[j * (v.in / 2) + (i >> 1)];
  const int code = (i & 1) ? (byte >> 4) : (byte & 0xF);
  return mul(e2m1(code), nvfp4_scale(v, j, i / v.group_size));
}

METALOAD_HD float at(const QuantView& v, int64_t j, int64_t i) {
  switch (v.scheme) {
    case QuantScheme::kGptq:
      return gptq_at(v, j, i);
    case QuantScheme::kAwq:
      return awq_at(v, j, i);
    case QuantScheme::kBnb4:
      return bnb4_at(v, j, i);
    case QuantScheme::kBnb8:
      return bnb8_at(v, j, i);
    case QuantScheme::kCtInt:
      return ct_at(v, j, i);
    case QuantScheme::kNvfp4:
      return nvfp4_at(v, j, i);
    default:
      return fp8_at(v, j, i);
  }
}

// Stores f in format fmt at element i of p.
METALOAD_HD void store(void* p, int64_t i, int fmt, float f) {
  unsigned char* b = static_cast<unsigned char*>(p);
  if (fmt == 0) {
    memcpy(b + i * 4, &f, 4);
    return;
  }
  const uint16_t h =
      fmt == 1 ? bits::f32_to_f16(bits::f32_bits(f)) : bits::f32_to_bf16(bits::f32_bits(f));
  memcpy(b + i * 2, &h, 2);
}

}  // namespace dq
}  // namespace metaload
