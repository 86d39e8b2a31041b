// AVX2 + F16C dequantization kernels (see dequant_avx2.h). This translation unit alone is compiled
// with -mavx2 -mf16c -ffp-contract=off (dequant.cmake, BUILD.bazel), never -mfma: a multiply and an
// add round twice, as in the portable kernels and the references. Nothing here runs unless
// dequant.cc found AVX2 and F16C on the CPU. It includes no torch header and instantiates no
// template shared with other translation units (no std containers or algorithms): an AVX2 copy of
// a shared inline function could otherwise be picked by the linker for code that runs anywhere.
//
// Vectorised with explicit intrinsics (8 f32 lanes), not left to the compiler. Per element the
// lanes do what dequant_bits.h's scalar formula does (integer unpack, int32 -> f32, one f32
// multiply), then convert as `flush` does (straight into the output, or through a row segment of
// floats); window edges that do not fill 8 lanes take those scalar formulas themselves. Where a
// 4-bit code's value is fixed within a group (bitsandbytes 4-bit, GPTQ and compressed-tensors int4,
// NVFP4) and the output has 2 bytes, the group's 16 outputs are computed and converted that way
// once, and every element is a byte-table lookup (ByteLut): the same bits, a few instructions per
// 32 elements. Measured per element, one thread: bench/RESULTS.md.
#include "kernels/dequant_avx2.h"

#if defined(__AVX2__) && defined(__F16C__)

#include <immintrin.h>

#include <cstring>

namespace metaload {
namespace dq_avx2 {
namespace {

// The small vector helpers below are forced inline: GCC otherwise leaves some out of line, and a
// call costs a vzeroupper and a round trip of the vectors through memory at every step.
#define METALOAD_VEC_INLINE inline __attribute__((always_inline))

constexpr int64_t kChunk = 512;  // input columns per pass (as dequant.cc's kColChunk)
// The 8-row kernels (GPTQ, AWQ) read qweight down a power-of-two stride, whose lines land in a
// few cache sets: 256 inputs a pass keep a pass's lines in L2 (and buf[8] at 8 KiB in L1).
constexpr int64_t kChunk8 = 256;

inline int64_t lo(int64_t a, int64_t b) {
  return a < b ? a : b;
}

constexpr int elem_size(int fmt) {
  return fmt == 0 ? 4 : 2;
}

inline unsigned char* out_row(const DequantDst& d, int64_t r, int of) {
  return static_cast<unsigned char*>(d.data) + r * d.ld * elem_size(of);
}

// bits::f32_to_bf16 on 8 lanes for lanes known not to be NaN: round to nearest even on the integer
// bits. The result is in the low 16 bits of each lane. (AVX512-BF16's vcvtneps2bf16 flushes
// denormals.)
METALOAD_VEC_INLINE __m256i bf16x8_not_nan(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd),
                           16);
}

// bits::f32_to_bf16 on 8 lanes: bf16x8_not_nan, NaN -> 0xFFFF.
METALOAD_VEC_INLINE __m256i bf16x8(__m256 x) {
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_or_si256(bf16x8_not_nan(x), _mm256_and_si256(nan, _mm256_set1_epi32(0xFFFF)));
}

// bits::f32_to_f16 on 8 lanes: F16C's conversion with round-to-nearest-even is exact IEEE
// (subnormal results kept, overflow to inf); only NaN differs (the hardware keeps the payload,
// convert_bits.h writes 0x7E00 | sign), so NaN lanes are patched.
inline __m128i f16x8(__m256 x) {
  __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
  const int nan = _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  if (nan != 0) {
    uint16_t t[8];
    float f[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(t), h);
    _mm256_storeu_ps(f, x);
    for (int k = 0; k < 8; ++k) {
      if ((nan >> k) & 1) t[k] = bits::f32_to_f16(bits::f32_bits(f[k]));
    }
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t));
  }
  return h;
}

// (q - z) * s on 8 lanes, in dequant_bits.h's order: integer difference, to f32, one multiply.
METALOAD_VEC_INLINE __m256 qzs(__m256i q, __m256i z, __m256 s) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, z)), s);
}

// 16 floats (a, b) as f16 / bf16 bits in order in one vector: the rounding of every kernel's
// 2-byte outputs (bits::f32_to_f16 / f32_to_bf16 on 8 lanes, NaN patched when maybe_nan).
// packus interleaves the halves ([a0-3 b0-3 | a4-7 b4-7]); permute4x64 makes [a | b].
template <int OF>
METALOAD_VEC_INLINE __m256i format16(__m256 a, __m256 b, bool maybe_nan) {
  if constexpr (OF == 1) {
    return maybe_nan ? _mm256_set_m128i(f16x8(b), f16x8(a))
                     : _mm256_set_m128i(_mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT),
                                        _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
  } else {
    const __m256i p = maybe_nan ? _mm256_packus_epi32(bf16x8(a), bf16x8(b))
                                : _mm256_packus_epi32(bf16x8_not_nan(a), bf16x8_not_nan(b));
    return _mm256_permute4x64_epi64(p, 0xD8);
  }
}

template <int OF>
inline void to_format16(__m256 a, __m256 b, uint16_t* t) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(t), format16<OF>(a, b, true));
}

inline bool finite(float x) {
  return (bits::f32_bits(x) & 0x7F800000u) != 0x7F800000u;
}

inline bool all_finite(__m256 x) {
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  return _mm256_movemask_ps(
             _mm256_cmp_ps(magnitude, _mm256_set1_ps(__builtin_inff()), _CMP_LT_OQ)) == 0xFF;
}

// 8 or 16 floats straight into the output format at o, as format16 converts them; maybe_nan false
// when the caller knows no lane is NaN (the conversion then skips the NaN patch).
template <int OF>
METALOAD_VEC_INLINE void store8(unsigned char* o, __m256 a, bool maybe_nan) {
  if constexpr (OF == 0) {
    _mm256_storeu_ps(reinterpret_cast<float*>(o), a);
  } else if constexpr (OF == 1) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o),
                     maybe_nan ? f16x8(a) : _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
  } else {
    const __m256i r = maybe_nan ? bf16x8(a) : bf16x8_not_nan(a);
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(p));
  }
}

template <int OF>
METALOAD_VEC_INLINE void store16(unsigned char* o, __m256 a, __m256 b, bool maybe_nan) {
  if constexpr (OF == 0) {
    store8<OF>(o, a, maybe_nan);
    store8<OF>(o + 32, b, maybe_nan);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), format16<OF>(a, b, maybe_nan));
  }
}

// Two rows' 8 values (a, b) as 8 elements of format OF each at pa and pb; NaN lanes exact unless
// the caller knows there are none.
template <int OF, bool MaybeNan>
METALOAD_VEC_INLINE void store8x2(unsigned char* pa, unsigned char* pb, __m256 a, __m256 b) {
  if constexpr (OF == 0) {
    _mm256_storeu_ps(reinterpret_cast<float*>(pa), a);
    _mm256_storeu_ps(reinterpret_cast<float*>(pb), b);
  } else {
    const __m256i p = format16<OF>(a, b, MaybeNan);  // [a | b]
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pa), _mm256_castsi256_si128(p));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pb), _mm256_extracti128_si256(p, 1));
  }
}

// n floats of `buf` to `o` in format OF (store8 / store16 with the NaN patch); the tail that does
// not fill a vector goes through dq::store.
template <int OF>
inline void flush(unsigned char* o, const float* buf, int64_t n) {
  int64_t k = 0;
  if constexpr (OF == 0) {
    std::memcpy(o, buf, static_cast<size_t>(n) * 4);
    return;
  } else if constexpr (OF == 1) {
    for (; k + 8 <= n; k += 8) store8<OF>(o + 2 * k, _mm256_loadu_ps(buf + k), true);
  } else {
    for (; k + 16 <= n; k += 16) {
      store16<OF>(o + 2 * k, _mm256_loadu_ps(buf + k), _mm256_loadu_ps(buf + k + 8), true);
    }
  }
  for (; k < n; ++k) dq::store(o, k, OF, buf[k]);
}

// Lanes k = 0..7 of one word's fields of `bits` bits starting at field `first`.
inline __m256i fields(uint32_t w, int bits, int first) {
  const __m256i k = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i sh =
      _mm256_mullo_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(first)), _mm256_set1_epi32(bits));
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), sh),
                          _mm256_set1_epi32(static_cast<int>((1u << bits) - 1u)));
}

// 16-entry table lookup: entries 0-7 in t0, 8-15 in t1, index in the low 4 bits of each lane.
inline __m256 lut16(__m256 t0, __m256 t1, __m256i idx) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, idx), _mm256_permutevar8x32_ps(t1, idx),
                          _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

// The 16 nibbles of 8 bytes at p as two vectors of indices, element order: the high nibble of
// each byte first (HighFirst, bitsandbytes) or the low one (NVFP4).
template <bool HighFirst>
inline void nibbles16(const uint8_t* p, __m256i* a, __m256i* b) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i dup =
      _mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
  const __m256i sh = HighFirst ? _mm256_setr_epi32(4, 0, 4, 0, 4, 0, 4, 0)
                               : _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
  const __m256i m = _mm256_set1_epi32(0xF);
  *a = _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(dup), sh), m);
  *b = _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(dup, 8)), sh), m);
}

// 16 two-byte outputs (f16 / bf16 bits) as a table for _mm256_shuffle_epi8: their low bytes and
// their high bytes, each in both lanes. A kernel whose value depends only on a 4-bit code within a
// block (bitsandbytes 4-bit) converts the block's 16 values once, as `flush` does (so the bits are
// those of the per-element path), and then looks every element up: 2 shuffles for 32 outputs.
struct ByteLut {
  __m256i lo, hi;
};

inline ByteLut byte_lut(const uint16_t* t) {
  const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m128i a =
      _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)), even_odd);
  const __m128i b =
      _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 8)), even_odd);
  return {_mm256_broadcastsi128_si256(_mm_unpacklo_epi64(a, b)),
          _mm256_broadcastsi128_si256(_mm_unpackhi_epi64(a, b))};
}

// 64 elements from 32 bytes of 4-bit codes at p, through the table, as 2-byte outputs at o.
// Element 2b is byte b's high nibble (HighFirst, bitsandbytes) or its low one.
template <bool HighFirst>
METALOAD_VEC_INLINE void lut_nibbles64(__m256i q, const ByteLut& t, unsigned char* o) {
  const __m256i m = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(q, m);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m);
  const __m256i e0 = HighFirst ? hi : lo, e1 = HighFirst ? lo : hi;
  const __m256i i0 = _mm256_unpacklo_epi8(e0, e1);  // per lane, the codes of bytes 0-7 in order
  const __m256i i1 = _mm256_unpackhi_epi8(e0, e1);  // and of bytes 8-15
  const __m256i l0 = _mm256_shuffle_epi8(t.lo, i0), h0 = _mm256_shuffle_epi8(t.hi, i0);
  const __m256i l1 = _mm256_shuffle_epi8(t.lo, i1), h1 = _mm256_shuffle_epi8(t.hi, i1);
  const __m256i a0 = _mm256_unpacklo_epi8(l0, h0), b0 = _mm256_unpackhi_epi8(l0, h0);
  const __m256i a1 = _mm256_unpacklo_epi8(l1, h1), b1 = _mm256_unpackhi_epi8(l1, h1);
  // Lane 0 holds elements 0-31 (a0 0-7, b0 8-15, a1 16-23, b1 24-31), lane 1 elements 32-63.
  __m256i* out = reinterpret_cast<__m256i*>(o);
  _mm256_storeu_si256(out, _mm256_permute2x128_si256(a0, b0, 0x20));
  _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(a1, b1, 0x20));
  _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(a0, b0, 0x31));
  _mm256_storeu_si256(out + 3, _mm256_permute2x128_si256(a1, b1, 0x31));
}

template <bool HighFirst>
inline void lut_nibbles64(const uint8_t* p, const ByteLut& t, unsigned char* o) {
  lut_nibbles64<HighFirst>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), t, o);
}

// A group's table of (q - z) * s for q = 0..15 (qzs's bits, then `flush`'s conversion).
template <int OF>
inline void qzs_table(int32_t z, float s, uint16_t* t) {
  const __m256i zv = _mm256_set1_epi32(z);
  const __m256 sv = _mm256_set1_ps(s);
  to_format16<OF>(qzs(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), zv, sv),
                  qzs(_mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15), zv, sv), t);
}

// lut_nibbles64 on 16 bytes: 32 elements.
template <bool HighFirst>
inline void lut_nibbles32(const uint8_t* p, const ByteLut& t, unsigned char* o) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(q, m);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
  const __m128i e0 = HighFirst ? hi : lo, e1 = HighFirst ? lo : hi;
  const __m128i i0 = _mm_unpacklo_epi8(e0, e1), i1 = _mm_unpackhi_epi8(e0, e1);
  const __m128i tl = _mm256_castsi256_si128(t.lo), th = _mm256_castsi256_si128(t.hi);
  const __m128i l0 = _mm_shuffle_epi8(tl, i0), h0 = _mm_shuffle_epi8(th, i0);
  const __m128i l1 = _mm_shuffle_epi8(tl, i1), h1 = _mm_shuffle_epi8(th, i1);
  __m128i* out = reinterpret_cast<__m128i*>(o);
  _mm_storeu_si128(out, _mm_unpacklo_epi8(l0, h0));
  _mm_storeu_si128(out + 1, _mm_unpackhi_epi8(l0, h0));
  _mm_storeu_si128(out + 2, _mm_unpacklo_epi8(l1, h1));
  _mm_storeu_si128(out + 3, _mm_unpackhi_epi8(l1, h1));
}

// One element k through the table (the 2-byte outputs in memory, as ByteLut's source).
template <bool HighFirst>
inline void lut_nibble1(const uint8_t* q, int64_t k, const uint16_t* t, unsigned char* o) {
  const uint8_t byte = q[k >> 1];
  const bool high = ((k & 1) == 0) == HighFirst;
  std::memcpy(o, t + (high ? byte >> 4 : byte & 0xF), 2);
}

// Elements [k, end) of codes q through one group's table (t, and lut made from it), element k at
// o + 2 k: 64 and 32 at a time, odd edges one by one.
template <bool HighFirst>
inline void lut_range(const uint8_t* q, int64_t k, int64_t end, const uint16_t* t,
                      const ByteLut& lut, unsigned char* o) {
  if (k & 1) lut_nibble1<HighFirst>(q, k, t, o + 2 * k), ++k;
  for (; k + 64 <= end; k += 64) lut_nibbles64<HighFirst>(q + (k >> 1), lut, o + 2 * k);
  for (; k + 32 <= end; k += 32) lut_nibbles32<HighFirst>(q + (k >> 1), lut, o + 2 * k);
  for (; k < end; ++k) lut_nibble1<HighFirst>(q, k, t, o + 2 * k);
}

// ---- GPTQ ------------------------------------------------------------------------------------

// 8 inputs i..i+7 of output row j as field lanes (i a multiple of 8 / pack's alignment).
template <int Bits>
inline __m256i gptq_q8(const QuantView& v, int64_t i, int64_t j) {
  constexpr int kPack = 32 / Bits;
  if constexpr (Bits == 8) {  // two words of 4
    const int w0 = static_cast<int>(dq::ld32(v.q, (i / 4) * v.out + j));
    const int w1 = static_cast<int>(dq::ld32(v.q, (i / 4 + 1) * v.out + j));
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_setr_epi32(w0, w0, w0, w0, w1, w1, w1, w1),
                                              _mm256_setr_epi32(0, 8, 16, 24, 0, 8, 16, 24)),
                            _mm256_set1_epi32(0xFF));
  } else {
    return fields(dq::ld32(v.q, (i / kPack) * v.out + j), Bits, static_cast<int>(i % kPack));
  }
}

// GPTQ, groups of whole words, no g_idx: dequant.cc's gptq_rows_words with 8 inputs a step.
template <int Bits, int SF, int OF>
void gptq_words(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  constexpr int kPack = 32 / Bits;
  constexpr uint32_t kMask = (1u << Bits) - 1u;
  const int64_t zcols = v.out / kPack;
  const int64_t c_end = d.col0 + d.cols;
  alignas(32) float buf[kChunk];
  for (int64_t rt = r0; rt < r1; rt += 64) {
    for (int64_t ib = d.col0; ib < c_end; ib += kChunk) {
      const int64_t ie = lo(c_end, ib + kChunk);
      for (int64_t r = rt; r < lo(r1, rt + 64); ++r) {
        const int64_t j = d.row0 + r;
        const int zshift = Bits * static_cast<int>(j % kPack);
        for (int64_t i = ib; i < ie;) {
          const int64_t g = i / v.group_size;
          const int64_t gend = lo(ie, (g + 1) * v.group_size);
          const float sc = dq::ldf_t<SF>(v.scales, g * v.out + j);
          const int32_t z =
              static_cast<int32_t>((dq::ld32(v.zeros, g * zcols + j / kPack) >> zshift) & kMask) +
              v.zero_offset;
          const __m256 scv = _mm256_set1_ps(sc);
          const __m256i zv = _mm256_set1_epi32(z);
          for (; i + 8 <= gend; i += 8) {
            _mm256_storeu_ps(buf + (i - ib), qzs(gptq_q8<Bits>(v, i, j), zv, scv));
          }
          for (; i < gend; ++i) {
            const uint32_t w = dq::ld32(v.q, (i / kPack) * v.out + j);
            const int32_t q = static_cast<int32_t>((w >> (Bits * (i % kPack))) & kMask);
            buf[i - ib] = dq::mul(static_cast<float>(q - z), sc);
          }
        }
        flush<OF>(out_row(d, r, OF) + (ib - d.col0) * elem_size(OF), buf, ie - ib);
      }
    }
  }
}

// GPTQ 4-bit, groups of whole words, no g_idx, 8 output rows at once: qweight's words for rows
// j0..j0+7 of one word row are one contiguous 32-byte load, and lane k broadcast gives row
// j0 + k's 8 inputs. Reading one row's words down a column instead strides by `out` words, a
// power of two that maps every word row to the same few cache sets (measured 3-4x slower).
template <int SF, int OF>
void gptq4_rows8(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const int64_t zcols = v.out / 8;
  const int64_t c_end = d.col0 + d.cols;
  const unsigned char* qb = static_cast<const unsigned char*>(v.q);
  const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i m = _mm256_set1_epi32(0xF);
  alignas(32) float buf[8][kChunk8];
  for (int64_t r = r0; r + 8 <= r1; r += 8) {
    const int64_t j0 = d.row0 + r;
    for (int64_t ib = d.col0; ib < c_end; ib += kChunk8) {
      const int64_t ie = lo(c_end, ib + kChunk8);
      for (int64_t i = ib; i < ie;) {
        const int64_t g = i / v.group_size;
        const int64_t gend = lo(ie, (g + 1) * v.group_size);
        float sc[8];
        int32_t z[8];
        for (int k = 0; k < 8; ++k) {
          const int64_t j = j0 + k;
          sc[k] = dq::ldf_t<SF>(v.scales, g * v.out + j);
          z[k] =
              static_cast<int32_t>((dq::ld32(v.zeros, g * zcols + j / 8) >> (4 * (j % 8))) & 0xFu) +
              v.zero_offset;
        }
        for (; i + 8 <= gend; i += 8) {
          const __m256i w =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + ((i / 8) * v.out + j0) * 4));
          for (int k = 0; k < 8; ++k) {
            const __m256i q = _mm256_and_si256(
                _mm256_srlv_epi32(_mm256_permutevar8x32_epi32(w, _mm256_set1_epi32(k)), sh), m);
            _mm256_storeu_ps(buf[k] + (i - ib),
                             qzs(q, _mm256_set1_epi32(z[k]), _mm256_set1_ps(sc[k])));
          }
        }
        for (; i < gend; ++i) {
          for (int k = 0; k < 8; ++k) {
            const uint32_t w = dq::ld32(v.q, (i / 8) * v.out + j0 + k);
            const int32_t q = static_cast<int32_t>((w >> (4 * (i % 8))) & 0xFu);
            buf[k][i - ib] = dq::mul(static_cast<float>(q - z[k]), sc[k]);
          }
        }
      }
      for (int k = 0; k < 8; ++k) {
        flush<OF>(out_row(d, r + k, OF) + (ib - d.col0) * elem_size(OF), buf[k], ie - ib);
      }
    }
  }
  const int64_t rest = r1 - (r1 - r0) % 8;
  if (rest < r1) gptq_words<4, SF, OF>(v, d, rest, r1);
}

constexpr int64_t kMaxActGroups = 1024;  // act-order tables on the stack (8 or 128 KiB)

// GPTQ 4-bit with an act-order g_idx: per output row a table of every group's scale and zero,
// then 8 inputs a step with their groups gathered from it (the table stays in L1). Whole rows one
// after another: the next row reads the same qweight cache lines (16 rows share each).
template <int SF, int OF>
void gptq4_act(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const int64_t zcols = v.out / 8;
  const int64_t c_end = d.col0 + d.cols;
  alignas(32) float buf[kChunk];
  alignas(32) float sct[kMaxActGroups];
  alignas(32) int32_t zt[kMaxActGroups];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = d.row0 + r;
    const int zshift = 4 * static_cast<int>(j % 8);
    for (int64_t g = 0; g < v.groups; ++g) {
      sct[g] = dq::ldf_t<SF>(v.scales, g * v.out + j);
      zt[g] = static_cast<int32_t>((dq::ld32(v.zeros, g * zcols + j / 8) >> zshift) & 0xFu) +
              v.zero_offset;
    }
    for (int64_t ib = d.col0; ib < c_end; ib += kChunk) {
      const int64_t ie = lo(c_end, ib + kChunk);
      for (int64_t i = ib; i < ie;) {
        if (i % 8 == 0 && i + 8 <= ie) {
          const __m256i gi = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(static_cast<const unsigned char*>(v.g_idx) + i * 4));
          const __m256 scv = _mm256_i32gather_ps(sct, gi, 4);
          const __m256i zv = _mm256_i32gather_epi32(zt, gi, 4);
          _mm256_storeu_ps(buf + (i - ib), qzs(gptq_q8<4>(v, i, j), zv, scv));
          i += 8;
          continue;
        }
        const int64_t g = static_cast<int32_t>(dq::ld32(v.g_idx, i));
        const uint32_t w = dq::ld32(v.q, (i / 8) * v.out + j);
        const int32_t q = static_cast<int32_t>((w >> (4 * (i % 8))) & 0xFu);
        buf[i - ib] = dq::mul(static_cast<float>(q - zt[g]), sct[g]);
        ++i;
      }
      flush<OF>(out_row(d, r, OF) + (ib - d.col0) * elem_size(OF), buf, ie - ib);
    }
  }
}

// 8 x 8 int32 (or f32) transpose: lane t of r[c] after is lane c of r[t] before.
METALOAD_VEC_INLINE void transpose8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
    u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
    u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
    u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
    r[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
  }
}

// GPTQ 4-bit into f16 / bf16, groups of whole 64-input steps, no g_idx: per row and group a table
// of the 16 outputs (qzs_table), then 64 inputs of up to 64 rows a step: qweight's words for rows
// j0..j0+7 of 8 word rows are 8 contiguous 32-byte loads, which transpose8 turns into each row's
// 32 bytes of codes in input order (GPTQ packs a word's inputs from the low nibble up), each then
// looked up (lut_nibbles64). A step reads 8 whole 256-byte runs of qweight (64 rows' words), which
// are `out` words apart: the hardware prefetchers do not follow that stride, so the step fetches
// the runs of kAhead steps later itself (qweight comes from memory: the load's output writes have
// long evicted it from the caches), into L2: lines a power of two apart share a few L1 sets, where
// lines fetched ahead evict each other (in a load, T1 took 10-20% fewer of the kernel's samples
// than T0, in GPTQ and AWQ alike).
constexpr int kGptqRows = 64;

template <int SF, int OF>
void gptq4_lut(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  constexpr int64_t kAhead = 4;
  const int64_t zcols = v.out / 8;
  const int64_t c_end = d.col0 + d.cols;
  const unsigned char* qb = static_cast<const unsigned char*>(v.q);
  alignas(32) uint16_t table[kGptqRows][16];
  ByteLut lut[kGptqRows];
  for (int64_t r = r0; r + 8 <= r1; r += kGptqRows) {
    const int rows = static_cast<int>(lo(kGptqRows, (r1 - r) / 8 * 8));
    const int64_t j0 = d.row0 + r;
    for (int64_t i = d.col0; i < c_end;) {
      const int64_t g = i / v.group_size;
      const int64_t gend = lo(c_end, (g + 1) * v.group_size);
      for (int k = 0; k < rows; ++k) {
        const int64_t j = j0 + k;
        const int32_t z =
            static_cast<int32_t>((dq::ld32(v.zeros, g * zcols + j / 8) >> (4 * (j % 8))) & 0xFu) +
            v.zero_offset;
        qzs_table<OF>(z, dq::ldf_t<SF>(v.scales, g * v.out + j), table[k]);
        lut[k] = byte_lut(table[k]);
      }
      for (; i < gend;) {
        if (i % 64 == 0 && i + 64 <= gend) {
          if (i + 64 * kAhead + 64 <= c_end) {
            for (int u = 0; u < 8; ++u) {
              const unsigned char* run = qb + ((i / 8 + 8 * kAhead + u) * v.out + j0) * 4;
              for (int l = 0; l < rows * 4; l += 64) {
                _mm_prefetch(reinterpret_cast<const char*>(run + l), _MM_HINT_T1);
              }
            }
          }
          for (int h = 0; h < rows; h += 8) {
            __m256i w[8];
            for (int u = 0; u < 8; ++u) {
              w[u] = _mm256_loadu_si256(
                  reinterpret_cast<const __m256i*>(qb + ((i / 8 + u) * v.out + j0 + h) * 4));
            }
            transpose8(w);  // w[k]: row j0 + h + k's words for inputs i..i+63
            for (int k = 0; k < 8; ++k) {
              lut_nibbles64<false>(w[k], lut[h + k], out_row(d, r + h + k, OF) + (i - d.col0) * 2);
            }
          }
          i += 64;
          continue;
        }
        for (int k = 0; k < rows; ++k) {
          const uint32_t w = dq::ld32(v.q, (i / 8) * v.out + j0 + k);
          std::memcpy(out_row(d, r + k, OF) + (i - d.col0) * 2,
                      table[k] + ((w >> (4 * (i % 8))) & 0xFu), 2);
        }
        ++i;
      }
    }
  }
  const int64_t rest = r1 - (r1 - r0) % 8;
  if (rest < r1) gptq_words<4, SF, OF>(v, d, rest, r1);
}

// compressed-tensors pack-quantized 4-bit into f16 / bf16: a row's words are its codes in input
// order (from the low nibble up), so per group a table (qzs_table) and 64 inputs a lookup.
template <int SF, int OF>
void ct4_lut(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const int64_t words = dq::ct_words(v);
  const int64_t c_end = d.col0 + d.cols;
  alignas(32) uint16_t table[16];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = d.row0 + r;
    const uint8_t* rowq = static_cast<const uint8_t*>(v.q) + j * words * 4;
    unsigned char* o = out_row(d, r, OF) - d.col0 * 2;  // input i at o + 2 i
    for (int64_t i = d.col0; i < c_end;) {
      const int64_t g = i / v.group_size;
      const int64_t end = lo(c_end, (g + 1) * v.group_size);
      qzs_table<OF>(dq::ct_zero(v, j, g), dq::ldf_t<SF>(v.scales, j * v.groups + g), table);
      lut_range<false>(rowq, i, end, table, byte_lut(table), o);
      i = end;
    }
  }
}

// 8 consecutive scales (format SF) as f32 lanes, exactly as dq::ldf converts each.
template <int SF>
inline __m256 scales8(const void* p, int64_t i) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  if constexpr (SF == 0) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(b + i * 4));
  } else {
    float f[8];
    for (int k = 0; k < 8; ++k) f[k] = dq::ldf_t<SF>(p, i + k);  // f16 subnormals / NaN exact
    return _mm256_loadu_ps(f);
  }
}

// Act order's table entry of one group for two 8-row halves: the rows' zeros (one qzeros word)
// and scales, side by side (tables a power of two apart would share the L1's sets).
struct ActGroup {
  __m256i z[2];
  __m256 s[2];
};

// Input i of 8 rows j0..j0+7 (act order, the tables' half h) element by element, as gptq4_act's
// scalar path, into each row's element at o (row stride ld bytes).
template <int OF>
inline void gptq4_act_one(const QuantView& v, unsigned char* o, int64_t ld, int64_t i, int64_t j0,
                          const ActGroup* t, int h) {
  const int64_t g = static_cast<int32_t>(dq::ld32(v.g_idx, i));
  int32_t z[8];
  float sc[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(z), t[g].z[h]);
  _mm256_storeu_ps(sc, t[g].s[h]);
  for (int k = 0; k < 8; ++k) {
    const uint32_t w = dq::ld32(v.q, (i / 8) * v.out + j0 + k);
    const int32_t q = static_cast<int32_t>((w >> (4 * (i % 8))) & 0xFu);
    dq::store(o + k * ld, 0, OF, dq::mul(static_cast<float>(q - z[k]), sc[k]));
  }
}

// Two columns of 8 rows (a, b: f32) as 16-bit outputs, [a0-3 b0-3 | a4-7 b4-7] (packus's order).
template <int OF, bool MaybeNan>
METALOAD_VEC_INLINE __m256i pair16(__m256 a, __m256 b) {
  if constexpr (OF == 1) {
    const __m128i ha = MaybeNan ? f16x8(a) : _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT);
    const __m128i hb = MaybeNan ? f16x8(b) : _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT);
    return _mm256_set_m128i(_mm_unpackhi_epi64(ha, hb), _mm_unpacklo_epi64(ha, hb));
  } else {
    return MaybeNan ? _mm256_packus_epi32(bf16x8(a), bf16x8(b))
                    : _mm256_packus_epi32(bf16x8_not_nan(a), bf16x8_not_nan(b));
  }
}

// 8 columns (inputs) of 8 rows, f32, as each row's 8 outputs of 2 bytes at o + k * ld: converted
// first, then transposed as 16-bit values (16 shuffles where an f32 transpose takes 24), 16 bytes
// into each row (act order's staging rows: a tile's own rows share cache sets, see kActPitch).
template <int OF, bool MaybeNan>
METALOAD_VEC_INLINE void store_cols8(const __m256* c, unsigned char* o, int64_t ld) {
  const __m256i p01 = pair16<OF, MaybeNan>(c[0], c[1]), p23 = pair16<OF, MaybeNan>(c[2], c[3]);
  const __m256i p45 = pair16<OF, MaybeNan>(c[4], c[5]), p67 = pair16<OF, MaybeNan>(c[6], c[7]);
  // a: [c0 c2 interleaved, rows 0-3 | 4-7], b: [c1 c3 ...]; x: rows 0,1 (c0-3) | 4,5; y: 2,3 | 6,7.
  const __m256i a = _mm256_unpacklo_epi16(p01, p23), b = _mm256_unpackhi_epi16(p01, p23);
  const __m256i a2 = _mm256_unpacklo_epi16(p45, p67), b2 = _mm256_unpackhi_epi16(p45, p67);
  const __m256i x = _mm256_unpacklo_epi16(a, b), y = _mm256_unpackhi_epi16(a, b);
  const __m256i x2 = _mm256_unpacklo_epi16(a2, b2), y2 = _mm256_unpackhi_epi16(a2, b2);
  const __m256i r[4] = {_mm256_unpacklo_epi64(x, x2), _mm256_unpackhi_epi64(x, x2),
                        _mm256_unpacklo_epi64(y, y2), _mm256_unpackhi_epi64(y, y2)};
  for (int k = 0; k < 4; ++k) {  // r[k]: [row k | row k + 4]
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + k * ld), _mm256_castsi256_si128(r[k]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + (k + 4) * ld),
                     _mm256_extracti128_si256(r[k], 1));
  }
}

// f32 output: the 8 columns transposed as f32 into the rows.
METALOAD_VEC_INLINE void store_cols8_f32(__m256* c, unsigned char* o, int64_t ld) {
  __m256i* r = reinterpret_cast<__m256i*>(c);
  transpose8(r);
  for (int k = 0; k < 8; ++k) _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + k * ld), r[k]);
}

// H (1 or 2) 8-row halves of act order over inputs [i0, i1) (multiples of 8): per 8 inputs and
// half one 32-byte qweight load (the 8 rows' words; two halves read 64 contiguous bytes, a whole
// line where qweight starts on one, which a sweep later would have left the caches: qweight's rows
// are a power of two apart and a sweep's lines share a few sets), each input's codes minus its
// group's zeros times its scales (a column of 8 rows), and the 8 columns stored into the rows.
template <int OF, bool MaybeNan, int H>
void gptq4_act_block(const unsigned char* qw, int64_t wstride, const void* g_idx, const ActGroup* t,
                     int64_t i0, int64_t i1, unsigned char* o, int64_t ld) {
  const __m256i m = _mm256_set1_epi32(0xF);
  for (int64_t i = i0; i < i1; i += 8, o += 8 * elem_size(OF)) {
    int64_t g[8];
    for (int u = 0; u < 8; ++u) g[u] = static_cast<int32_t>(dq::ld32(g_idx, i + u));
    for (int h = 0; h < H; ++h) {
      const __m256i w =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qw + (i / 8) * wstride + 32 * h));
      __m256 col[8];
      for (int u = 0; u < 8; ++u) {
        const __m256i q = _mm256_and_si256(_mm256_srl_epi32(w, _mm_cvtsi32_si128(4 * u)), m);
        col[u] = qzs(q, t[g[u]].z[h], t[g[u]].s[h]);
      }
      if constexpr (OF == 0) {
        store_cols8_f32(col, o + 8 * h * ld, ld);
      } else {
        store_cols8<OF, MaybeNan>(col, o + 8 * h * ld, ld);
      }
    }
  }
}

// The rows' tables of every group (ActGroup half h: rows j..j+7); false when a scale is not finite.
template <int SF>
bool act_tables(const QuantView& v, int64_t j, int h, ActGroup* t) {
  const int64_t zcols = v.out / 8;
  bool finite = true;  // (q - z) * s is NaN only where s is not finite (|q - z| <= 15)
  for (int64_t g = 0; g < v.groups; ++g) {
    t[g].z[h] = _mm256_add_epi32(fields(dq::ld32(v.zeros, g * zcols + j / 8), 4, 0),
                                 _mm256_set1_epi32(v.zero_offset));
    t[g].s[h] = scales8<SF>(v.scales, g * v.out + j);
    finite = finite && all_finite(t[g].s[h]);
  }
  return finite;
}

// Act order's staging: a chunk of up to kChunk8 inputs of 16 rows, rows 1056 bytes apart (not a
// power of two). Written straight into the output, rows a power of two apart (a tile's rows of
// 4096 bf16 are 8 KiB apart) share one L1 set: 16 rows of stores evict each other.
constexpr int64_t kActPitch = kChunk8 * 4 + 32;  // bytes, f32 output included

// Rows [r, r + 8 * H) of act order: tables, then chunks of inputs staged (gptq4_act_block on the
// whole 8-input steps, gptq4_act_one at the window's edges) and copied into the rows.
template <int SF, int OF, int H>
void gptq4_act_rows(const QuantView& v, const DequantDst& d, int64_t r, ActGroup* t,
                    unsigned char* stage) {
  const int64_t c_end = d.col0 + d.cols;
  const int64_t es = elem_size(OF);
  bool finite = true;
  for (int h = 0; h < H; ++h) finite = act_tables<SF>(v, d.row0 + r + 8 * h, h, t) && finite;
  const unsigned char* qw = static_cast<const unsigned char*>(v.q) + (d.row0 + r) * 4;
  for (int64_t ib = d.col0, ie; ib < c_end; ib = ie) {
    ie = lo(c_end, (ib / kChunk8 + 1) * kChunk8);
    const int64_t a = lo(ie, (ib + 7) / 8 * 8);  // whole 8-input steps: [a, b)
    int64_t b = ie / 8 * 8;
    b = b < a ? a : b;
    for (int h = 0; h < H; ++h) {
      const int64_t j = d.row0 + r + 8 * h;
      unsigned char* o = stage + 8 * h * kActPitch - ib * es;  // input i at o + i * es
      for (int64_t i = ib; i < a; ++i) gptq4_act_one<OF>(v, o + i * es, kActPitch, i, j, t, h);
      for (int64_t i = b; i < ie; ++i) gptq4_act_one<OF>(v, o + i * es, kActPitch, i, j, t, h);
    }
    unsigned char* o = stage + (a - ib) * es;
    if (finite) {
      gptq4_act_block<OF, false, H>(qw, v.out * 4, v.g_idx, t, a, b, o, kActPitch);
    } else {
      gptq4_act_block<OF, true, H>(qw, v.out * 4, v.g_idx, t, a, b, o, kActPitch);
    }
    for (int k = 0; k < 8 * H; ++k) {
      std::memcpy(out_row(d, r + k, OF) + (ib - d.col0) * es, stage + k * kActPitch,
                  static_cast<size_t>((ie - ib) * es));
    }
  }
}

// GPTQ 4-bit act order, 16 output rows at once (8 at the end; j0 a multiple of 8). No gathers:
// gptq4_act's per-element ones cost 2x. Rows whose scales are all finite are converted without
// the NaN patch.
template <int SF, int OF>
void gptq4_act_rows8(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  alignas(32) ActGroup t[kMaxActGroups];
  alignas(32) unsigned char stage[16 * kActPitch];
  int64_t r = r0;
  for (; r + 16 <= r1; r += 16) gptq4_act_rows<SF, OF, 2>(v, d, r, t, stage);
  if (r + 8 <= r1) gptq4_act_rows<SF, OF, 1>(v, d, r, t, stage);
}

// Act-order windows: rows off the 8-row blocks one at a time (gptq4_act), the rest 8 at once.
template <int SF, int OF>
void gptq4_act_any(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const int64_t a = lo(r1, r0 + (8 - (d.row0 + r0) % 8) % 8);
  int64_t b = r1 - (d.row0 + r1) % 8;
  b = b < a ? a : b;
  if (r0 < a) gptq4_act<SF, OF>(v, d, r0, a);
  if (b < r1) gptq4_act<SF, OF>(v, d, b, r1);
  // Every group count the tables hold: with 512 groups (64 bytes each, out of L1) the 8-row
  // blocks still ran 3-4x faster than gptq4_act's gathers (bench_quant, gptq4-act-512g).
  if (a < b) gptq4_act_rows8<SF, OF>(v, d, a, b);
}

// ---- AWQ -------------------------------------------------------------------------------------

// The 8 output rows of one qweight column (rows r..r+7 of the window, j0 = d.row0 + r a multiple
// of 8), as dequant.cc's awq_rows: 8 words (inputs i..i+7) make 8 vectors, one per output row.
template <int SF, int OF>
void awq_rows8(const QuantView& v, const DequantDst& d, int64_t a, int64_t b) {
  const int64_t wcols = v.out / 8;
  const int64_t c_end = d.col0 + d.cols;
  int shift[8];
  for (int k = 0; k < 8; ++k) shift[k] = 4 * dq::awq_nibble(k);
  alignas(32) float buf[8][kChunk8];
  const __m256i stride = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                            _mm256_set1_epi32(static_cast<int>(wcols)));
  const __m256i m = _mm256_set1_epi32(0xF);
  for (int64_t rt = a; rt < b; rt += 128) {
    for (int64_t ib = d.col0; ib < c_end; ib += kChunk8) {
      const int64_t ie = lo(c_end, ib + kChunk8);
      for (int64_t r = rt; r < lo(b, rt + 128); r += 8) {
        const int64_t j0 = d.row0 + r;
        const int64_t wc = j0 / 8;
        for (int64_t i = ib; i < ie;) {
          const int64_t g = i / v.group_size;
          const int64_t gend = lo(ie, (g + 1) * v.group_size);
          float sc[8];
          int32_t z[8];
          const uint32_t zw = dq::ld32(v.zeros, g * wcols + wc);
          for (int k = 0; k < 8; ++k) {
            sc[k] = dq::ldf_t<SF>(v.scales, g * v.out + j0 + k);
            z[k] = static_cast<int32_t>((zw >> shift[k]) & 0xFu);
          }
          for (; i + 8 <= gend; i += 8) {
            const __m256i w = _mm256_i32gather_epi32(
                reinterpret_cast<const int*>(static_cast<const unsigned char*>(v.q) +
                                             (i * wcols + wc) * 4),
                stride, 4);
            for (int k = 0; k < 8; ++k) {
              const __m256i q =
                  _mm256_and_si256(_mm256_srl_epi32(w, _mm_cvtsi32_si128(shift[k])), m);
              _mm256_storeu_ps(buf[k] + (i - ib),
                               qzs(q, _mm256_set1_epi32(z[k]), _mm256_set1_ps(sc[k])));
            }
          }
          for (; i < gend; ++i) {
            const uint32_t w = dq::ld32(v.q, i * wcols + wc);
            for (int k = 0; k < 8; ++k) {
              const int32_t q = static_cast<int32_t>((w >> shift[k]) & 0xFu);
              buf[k][i - ib] = dq::mul(static_cast<float>(q - z[k]), sc[k]);
            }
          }
        }
        for (int k = 0; k < 8; ++k) {
          flush<OF>(out_row(d, r + k, OF) + (ib - d.col0) * elem_size(OF), buf[k], ie - ib);
        }
      }
    }
  }
}

// 64 output rows (rows r..r+63 of the window, j0 = d.row0 + r a multiple of 8: qweight columns
// j0 / 8 .. j0 / 8 + 7) at once, without awq_rows8's gather: 8 inputs' rows of those 8 words are
// 8 contiguous 32-byte loads, transposed so that each vector holds one word column's 8 inputs,
// then each of its 8 nibbles is a row's 8 inputs. Per group, every row's zero and scale as a
// vector (the tables). Values are converted in registers and go to `buf` (64 rows x kChunk64
// inputs in the output format, 16 KiB at most: output rows are a power of two apart and would
// share one L1 set), which is then copied out a row segment at a time.
constexpr int64_t kChunk64 = 64;

struct Awq64Tables {
  __m256i zv[64];
  __m256 sv[64];
  int32_t z[64];
  float s[64];
  bool finite;  // every scale finite: (q - z) * s is then never NaN (|q - z| <= 15)
};

template <int SF>
void awq64_tables(const QuantView& v, int64_t g, int64_t j0, const int* shift, Awq64Tables* t) {
  const int64_t wcols = v.out / 8;
  t->finite = true;
  for (int c = 0; c < 8; ++c) {
    const uint32_t zw = dq::ld32(v.zeros, g * wcols + j0 / 8 + c);
    for (int k = 0; k < 8; ++k) {
      const int n = c * 8 + k;
      t->z[n] = static_cast<int32_t>((zw >> shift[k]) & 0xFu);
      t->s[n] = dq::ldf_t<SF>(v.scales, g * v.out + j0 + n);
      t->finite = t->finite && finite(t->s[n]);
      t->zv[n] = _mm256_set1_epi32(t->z[n]);
      t->sv[n] = _mm256_set1_ps(t->s[n]);
    }
  }
}

using Awq64Buf = unsigned char[64][kChunk64 * 4];

// Inputs [i, i + 8) of the 64 rows (all in one group) into buf at input offset i - ib.
template <int OF, bool MaybeNan>
inline void awq64_step(const unsigned char* qb, int64_t wcols, int64_t wc0, int64_t i, int64_t ib,
                       const int* shift, const Awq64Tables& t, Awq64Buf& buf) {
  const __m256i m = _mm256_set1_epi32(0xF);
  __m256i w[8];
  for (int u = 0; u < 8; ++u) {
    w[u] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + ((i + u) * wcols + wc0) * 4));
    // The next chunk's line of this input row (a stride of a whole row: no prefetcher follows).
    _mm_prefetch(reinterpret_cast<const char*>(qb + ((i + u + kChunk64) * wcols + wc0) * 4),
                 _MM_HINT_T0);
  }
  transpose8(w);  // w[c]: word column wc0 + c, inputs i..i+7
  const int64_t at = (i - ib) * elem_size(OF);
  for (int c = 0; c < 8; ++c) {
    for (int k = 0; k < 8; k += 2) {
      const int n = c * 8 + k;
      const __m256i qa = _mm256_and_si256(_mm256_srl_epi32(w[c], _mm_cvtsi32_si128(shift[k])), m);
      const __m256i qb2 =
          _mm256_and_si256(_mm256_srl_epi32(w[c], _mm_cvtsi32_si128(shift[k + 1])), m);
      store8x2<OF, MaybeNan>(buf[n] + at, buf[n + 1] + at, qzs(qa, t.zv[n], t.sv[n]),
                             qzs(qb2, t.zv[n + 1], t.sv[n + 1]));
    }
  }
}

// Input i of the 64 rows, scalar (a group's last inputs that do not fill 8).
inline void awq64_one(const QuantView& v, int64_t wc0, int64_t i, int64_t ib, int of,
                      const int* shift, const Awq64Tables& t, Awq64Buf& buf) {
  for (int c = 0; c < 8; ++c) {
    const uint32_t w = dq::ld32(v.q, i * (v.out / 8) + wc0 + c);
    for (int k = 0; k < 8; ++k) {
      const int32_t q = static_cast<int32_t>((w >> shift[k]) & 0xFu);
      dq::store(buf[c * 8 + k], i - ib, of,
                dq::mul(static_cast<float>(q - t.z[c * 8 + k]), t.s[c * 8 + k]));
    }
  }
}

// Rows [r, r + 64) for inputs [ib, ie) into buf, then out; `t` holds group `*loaded`'s tables.
template <int SF, int OF>
void awq64_chunk(const QuantView& v, const DequantDst& d, int64_t r, int64_t ib, int64_t ie,
                 const int* shift, Awq64Tables& t, int64_t* loaded, Awq64Buf& buf) {
  const int64_t wc0 = (d.row0 + r) / 8;
  const unsigned char* qb = static_cast<const unsigned char*>(v.q);
  for (int64_t i = ib; i < ie;) {
    const int64_t g = i / v.group_size;
    const int64_t gend = lo(ie, (g + 1) * v.group_size);
    if (g != *loaded) awq64_tables<SF>(v, g, d.row0 + r, shift, &t);
    *loaded = g;
    for (; i + 8 <= gend; i += 8) {
      if (t.finite) {
        awq64_step<OF, false>(qb, v.out / 8, wc0, i, ib, shift, t, buf);
      } else {
        awq64_step<OF, true>(qb, v.out / 8, wc0, i, ib, shift, t, buf);
      }
    }
    for (; i < gend; ++i) awq64_one(v, wc0, i, ib, OF, shift, t, buf);
  }
  for (int k = 0; k < 64; ++k) {
    std::memcpy(out_row(d, r + k, OF) + (ib - d.col0) * elem_size(OF), buf[k],
                static_cast<size_t>((ie - ib) * elem_size(OF)));
  }
}

// Rows [a, b) (a multiple of 64 of them) 128 at a time where they can: the two 64-row halves of a
// chunk of inputs read the two halves of the same qweight lines, one after the other.
template <int SF, int OF>
void awq_rows64(const QuantView& v, const DequantDst& d, int64_t a, int64_t b) {
  int shift[8];
  for (int k = 0; k < 8; ++k) shift[k] = 4 * dq::awq_nibble(k);
  alignas(32) Awq64Buf buf;
  alignas(32) Awq64Tables t[2];
  for (int64_t r = a; r < b; r += 128) {
    const int halves = r + 128 <= b ? 2 : 1;
    int64_t loaded[2] = {-1, -1};
    for (int64_t ib = d.col0; ib < d.col0 + d.cols; ib += kChunk64) {
      const int64_t ie = lo(d.col0 + d.cols, ib + kChunk64);
      for (int h = 0; h < halves; ++h) {
        awq64_chunk<SF, OF>(v, d, r + 64 * h, ib, ie, shift, t[h], &loaded[h], buf);
      }
    }
  }
}

// AWQ 4-bit into f16 / bf16, groups of whole 64-input steps: as gptq4_lut, a table per row and
// group (qzs_table) and each row's 64 inputs a lookup (lut_nibbles64). AWQ packs a word with one
// input's 8 rows, so a step first turns the codes around: 8 inputs' rows of 8 word columns (8
// contiguous 32-byte loads) hold, per lane, an 8 x 8 matrix of nibbles, which nibble_transpose8
// turns into each row's 8 codes as one word (as GPTQ packs them); a step's 8 such words of a row
// are then gathered by transpose8 through a 2 KiB scratch into its 32 bytes of codes. A tile's two
// 64-row halves read the two halves of the same qweight lines one after the other.
constexpr int kAwqRows = 64;

// One round of an 8 x 8 transpose of 4-bit fields held a matrix row per register (per lane, its
// own matrix): in every 2 x 2 block of D x D-field blocks, the two off-diagonal blocks swap.
template <int D>
METALOAD_VEC_INLINE void nibble_swap(__m256i w[8], __m256i mask) {
  for (int u = 0; u < 8; ++u) {
    if ((u & D) != 0) continue;
    const __m256i t =
        _mm256_and_si256(_mm256_xor_si256(_mm256_srli_epi32(w[u], 4 * D), w[u + D]), mask);
    w[u + D] = _mm256_xor_si256(w[u + D], t);
    w[u] = _mm256_xor_si256(w[u], _mm256_slli_epi32(t, 4 * D));
  }
}

// Nibble p of w[u] after is nibble u of w[p] before, in every lane.
METALOAD_VEC_INLINE void nibble_transpose8(__m256i w[8]) {
  nibble_swap<1>(w, _mm256_set1_epi32(0x0F0F0F0F));
  nibble_swap<2>(w, _mm256_set1_epi32(0x00FF00FF));
  nibble_swap<4>(w, _mm256_set1_epi32(0x0000FFFF));
}

struct AwqLut {
  alignas(32) uint16_t table[kAwqRows][16];
  ByteLut lut[kAwqRows];
};

// Rows j0.. j0 + 63's tables for group g.
template <int SF, int OF>
void awq4_tables(const QuantView& v, int64_t g, int64_t j0, AwqLut* t) {
  for (int n = 0; n < kAwqRows; ++n) {
    const int64_t j = j0 + n;
    const int32_t z = dq::awq_code(dq::ld32(v.zeros, g * (v.out / 8) + j / 8), j);
    qzs_table<OF>(z, dq::ldf_t<SF>(v.scales, g * v.out + j), t->table[n]);
    t->lut[n] = byte_lut(t->table[n]);
  }
}

// Inputs [i, i + 64) of the 64 rows whose words start at word column wc0, row n's outputs at
// o + n * ld bytes.
inline void awq4_step(const unsigned char* qb, int64_t wcols, int64_t wc0, int64_t i,
                      const AwqLut& t, const int* row_of_nibble, unsigned char* o, int64_t ld) {
  alignas(32) __m256i codes[8][8];  // [nibble][8 inputs]: lane c the word column's row's codes
  for (int s = 0; s < 8; ++s) {
    __m256i w[8];
    for (int u = 0; u < 8; ++u) {
      w[u] = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(qb + ((i + 8 * s + u) * wcols + wc0) * 4));
    }
    nibble_transpose8(w);  // w[p] lane c: inputs i + 8s.. of row 8c + row_of_nibble[p]
    for (int p = 0; p < 8; ++p) codes[p][s] = w[p];
  }
  for (int p = 0; p < 8; ++p) {
    __m256i r[8];
    for (int s = 0; s < 8; ++s) r[s] = codes[p][s];
    transpose8(r);  // r[c]: row 8c + row_of_nibble[p]'s codes for inputs i..i+63
    for (int c = 0; c < 8; ++c) {
      const int n = 8 * c + row_of_nibble[p];
      lut_nibbles64<false>(r[c], t.lut[n], o + n * ld);
    }
  }
}

// Rows [a, b) (a multiple of 64 of them, d.row0 + a a multiple of 8), 128 at a time where they
// can; inputs off the 64-input steps one at a time through the tables.
template <int SF, int OF>
void awq4_lut(const QuantView& v, const DequantDst& d, int64_t a, int64_t b) {
  constexpr int64_t kAhead = 4;  // steps: qweight comes from memory, a row's line 2 KiB apart
  const int64_t wcols = v.out / 8;
  const int64_t c_end = d.col0 + d.cols;
  const int64_t ld = d.ld * 2;
  const unsigned char* qb = static_cast<const unsigned char*>(v.q);
  int row_of_nibble[8];
  for (int k = 0; k < 8; ++k) row_of_nibble[dq::awq_nibble(k)] = k;
  AwqLut t[2];
  for (int64_t r = a; r < b; r += 2 * kAwqRows) {
    const int halves = r + 2 * kAwqRows <= b ? 2 : 1;
    const int64_t wc0 = (d.row0 + r) / 8;
    for (int64_t i = d.col0; i < c_end;) {
      const int64_t g = i / v.group_size;
      const int64_t gend = lo(c_end, (g + 1) * v.group_size);
      for (int h = 0; h < halves; ++h) awq4_tables<SF, OF>(v, g, d.row0 + r + 64 * h, &t[h]);
      for (; i < gend;) {
        unsigned char* o = out_row(d, r, OF) + (i - d.col0) * 2;
        if (i % 64 == 0 && i + 64 <= gend) {
          if (i + 64 * kAhead + 64 <= c_end) {
            for (int64_t u = i + 64 * kAhead; u < i + 64 * kAhead + 64; ++u) {
              const unsigned char* line = qb + (u * wcols + wc0) * 4;
              _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T1);
              _mm_prefetch(reinterpret_cast<const char*>(line + 32 * halves - 1), _MM_HINT_T1);
            }
          }
          for (int h = 0; h < halves; ++h) {
            awq4_step(qb, wcols, wc0 + 8 * h, i, t[h], row_of_nibble, o + 64 * h * ld, ld);
          }
          i += 64;
          continue;
        }
        for (int n = 0; n < 64 * halves; ++n) {
          const int64_t j = d.row0 + r + n;
          const int32_t q = dq::awq_code(dq::ld32(v.q, i * wcols + j / 8), j);
          std::memcpy(o + n * ld, t[n / 64].table[n % 64] + q, 2);
        }
        ++i;
      }
    }
  }
}

// Rows off the 8-row words (a window's first and last few) one at a time, scalar.
template <int SF, int OF>
void awq_rows_each(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const int64_t wcols = v.out / 8;
  alignas(32) float buf[kChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = d.row0 + r;
    for (int64_t ib = d.col0; ib < d.col0 + d.cols; ib += kChunk) {
      const int64_t ie = lo(d.col0 + d.cols, ib + kChunk);
      const int shift = 4 * dq::awq_nibble(j & 7);
      for (int64_t i = ib; i < ie; ++i) {
        const int64_t g = i / v.group_size;
        const float sc = dq::ldf_t<SF>(v.scales, g * v.out + j);
        const int32_t z =
            static_cast<int32_t>((dq::ld32(v.zeros, g * wcols + j / 8) >> shift) & 0xFu);
        const int32_t q = static_cast<int32_t>((dq::ld32(v.q, i * wcols + j / 8) >> shift) & 0xFu);
        buf[i - ib] = dq::mul(static_cast<float>(q - z), sc);
      }
      flush<OF>(out_row(d, r, OF) + (ib - d.col0) * elem_size(OF), buf, ie - ib);
    }
  }
}

template <int SF, int OF>
void awq(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  int64_t a = lo(r1, r0 + (8 - (d.row0 + r0) % 8) % 8);
  int64_t b = r1 - (d.row0 + r1) % 8;
  b = b < a ? a : b;
  if (r0 < a) awq_rows_each<SF, OF>(v, d, r0, a);
  if (b < r1) awq_rows_each<SF, OF>(v, d, b, r1);
  const int64_t c = a + (b - a) / 64 * 64;  // 64-row blocks, then the last 8-row ones
  if constexpr (OF != 0) {
    if (a < c && v.group_size % 64 == 0) {
      awq4_lut<SF, OF>(v, d, a, c);
      a = c;
    }
  }
  if (a < c) awq_rows64<SF, OF>(v, d, a, c);
  if (c < b) awq_rows8<SF, OF>(v, d, c, b);
}

// ---- bitsandbytes ----------------------------------------------------------------------------

// 4-bit: per block a 16-entry table code[n] * absmax in two vectors, 16 elements (8 bytes) a step.
template <int OF>
void bnb4(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const uint8_t* q = static_cast<const uint8_t*>(v.q);
  float code[16];
  for (int n = 0; n < 16; ++n) code[n] = dq::ldf(v.code, n, 0);
  const __m256 c0 = _mm256_loadu_ps(code), c1 = _mm256_loadu_ps(code + 8);
  alignas(32) float buf[kChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t kr = (d.row0 + r) * v.in + d.col0, kr1 = kr + d.cols;
    for (int64_t k0 = kr; k0 < kr1; k0 += kChunk) {
      const int64_t k1 = lo(kr1, k0 + kChunk);
      for (int64_t k = k0; k < k1;) {
        const int64_t blk = k / v.group_size;
        const int64_t end = lo(k1, (blk + 1) * v.group_size);
        const float a = dq::bnb4_absmax(v, blk);
        const __m256 av = _mm256_set1_ps(a);
        const __m256 t0 = _mm256_mul_ps(c0, av), t1 = _mm256_mul_ps(c1, av);  // dq::mul(code, a)
        if (k & 1) {
          buf[k - k0] = dq::mul(code[q[k >> 1] & 0xF], a);
          ++k;
        }
        for (; k + 16 <= end; k += 16) {
          __m256i ia, ib;
          nibbles16<true>(q + (k >> 1), &ia, &ib);
          _mm256_storeu_ps(buf + (k - k0), lut16(t0, t1, ia));
          _mm256_storeu_ps(buf + (k - k0) + 8, lut16(t0, t1, ib));
        }
        for (; k < end; ++k) {
          const uint8_t byte = q[k >> 1];
          buf[k - k0] = dq::mul(code[(k & 1) ? (byte & 0xF) : (byte >> 4)], a);
        }
      }
      flush<OF>(out_row(d, r, OF) + (k0 - kr) * elem_size(OF), buf, k1 - k0);
    }
  }
}

// 4-bit into f16 / bf16: per block the 16 outputs (bnb4's table, converted as `flush` does), then
// every element looked up (lut_nibbles64): no per-element multiply or rounding.
template <int OF>
void bnb4_lut(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  static_assert(OF != 0, "f32 outputs take bnb4");
  const uint8_t* q = static_cast<const uint8_t*>(v.q);
  float code[16];
  for (int n = 0; n < 16; ++n) code[n] = dq::ldf(v.code, n, 0);
  const __m256 c0 = _mm256_loadu_ps(code), c1 = _mm256_loadu_ps(code + 8);
  alignas(32) uint16_t table[16];
  ByteLut lut{};
  int64_t loaded = -1;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t kr = (d.row0 + r) * v.in + d.col0, kr1 = kr + d.cols;
    unsigned char* o = out_row(d, r, OF) - kr * 2;  // element k at o + 2 k
    for (int64_t k = kr; k < kr1;) {
      const int64_t blk = k / v.group_size;
      const int64_t end = lo(kr1, (blk + 1) * v.group_size);
      if (blk != loaded) {
        const __m256 av = _mm256_set1_ps(dq::bnb4_absmax(v, blk));
        to_format16<OF>(_mm256_mul_ps(c0, av), _mm256_mul_ps(c1, av), table);  // as bnb4's
        lut = byte_lut(table);
        loaded = blk;
      }
      lut_range<true>(q, k, end, table, lut, o);
      k = end;
    }
  }
}

// LLM.int8: (q * SCB) * (1 / 127), 16 a step, written straight in the output format (no lane is
// NaN unless SCB is not finite).
inline __m256 bnb8x8(const int8_t* q, __m256 scv, __m256 inv) {
  const __m256 x = _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
  return _mm256_mul_ps(_mm256_mul_ps(x, scv), inv);
}

template <int SF, int OF>
void bnb8(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  constexpr int es = elem_size(OF);
  const __m256 inv = _mm256_set1_ps(dq::kInv127);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = d.row0 + r;
    const int8_t* q = static_cast<const int8_t*>(v.q) + j * v.in + d.col0;
    unsigned char* o = out_row(d, r, OF);
    const float sc = dq::ldf_t<SF>(v.scales, j);
    const __m256 scv = _mm256_set1_ps(sc);
    const bool nan_scale = !finite(sc);
    int64_t c = 0;
    for (; c + 16 <= d.cols; c += 16) {
      store16<OF>(o + es * c, bnb8x8(q + c, scv, inv), bnb8x8(q + c + 8, scv, inv), nan_scale);
    }
    for (; c + 8 <= d.cols; c += 8) store8<OF>(o + es * c, bnb8x8(q + c, scv, inv), nan_scale);
    for (; c < d.cols; ++c) {
      dq::store(o, c, OF, dq::mul(dq::mul(static_cast<float>(q[c]), sc), dq::kInv127));
    }
  }
}

// ---- FP8 -------------------------------------------------------------------------------------

// dq::fp8_e4m3 on 8 bytes: the exponent and mantissa shifted into place (rebias 7 -> 127),
// subnormals as m * 2^-9, S.1111.111 -> 0x7FC00000, then the sign.
inline __m256 fp8x8(const uint8_t* p) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7F));
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(7))),
                                   _mm256_set1_ps(0.001953125f));
  const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag);
  const __m256i is_nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
  __m256i r = _mm256_blendv_epi8(normal, _mm256_castps_si256(sub), is_sub);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC00000), is_nan);
  r = _mm256_or_si256(r, _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24));
  return _mm256_castsi256_ps(r);
}

// 16 e4m3 bytes at p as f16 bits in h, exactly: the exponent and mantissa fields shifted into an
// f16's, whose value is then the e4m3 value / 256 (subnormals included; F16C converts it
// exactly). False, h unset, where one of them is a NaN code (S.1111.111): fp8x8 makes those.
inline bool fp8x16_f16(const uint8_t* p, __m256i* h) {
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7F));
  if (_mm256_movemask_epi8(_mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7F))) != 0) return false;
  *h = _mm256_or_si256(_mm256_slli_epi16(mag, 7),
                       _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
  return true;
}

// Per block scale, 16 inputs a step (fp8x16_f16, or fp8x8 where the 16 hold a NaN code), written
// straight in the output format: no lane is NaN unless a code is or the scale is not finite. The
// f16 values are multiplied by 256 * scale at once where that product is finite: it is exact (a
// power of two), so the one rounding is of the same real number as fp8 * scale's.
template <int SF, int OF>
void fp8(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const int64_t scols = (v.in + v.block_in - 1) / v.block_in;
  const int64_t c_end = d.col0 + d.cols;
  constexpr int es = elem_size(OF);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = d.row0 + r;
    const uint8_t* q = static_cast<const uint8_t*>(v.q) + j * v.in;
    unsigned char* o = out_row(d, r, OF) - d.col0 * es;  // input i at o + es * i
    for (int64_t i = d.col0; i < c_end;) {
      const int64_t blk = i / v.block_in;
      const int64_t end = lo(c_end, (blk + 1) * v.block_in);
      const float sc = dq::ldf_t<SF>(v.scales, (j / v.group_size) * scols + blk);
      const __m256 scv = _mm256_set1_ps(sc);
      const bool fold = finite(sc * 256.0f);  // then sc is finite too: no lane can be NaN
      const __m256 kv = _mm256_set1_ps(fold ? sc * 256.0f : 256.0f);
      for (; i + 16 <= end; i += 16) {
        __m256i h;
        if (!fp8x16_f16(q + i, &h)) {
          store8<OF>(o + es * i, _mm256_mul_ps(fp8x8(q + i), scv), true);
          store8<OF>(o + es * (i + 8), _mm256_mul_ps(fp8x8(q + i + 8), scv), true);
          continue;
        }
        __m256 a = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), kv);
        __m256 b = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), kv);
        if (!fold) a = _mm256_mul_ps(a, scv), b = _mm256_mul_ps(b, scv);
        store16<OF>(o + es * i, a, b, !fold);
      }
      for (; i + 8 <= end; i += 8) store8<OF>(o + es * i, _mm256_mul_ps(fp8x8(q + i), scv), true);
      for (; i < end; ++i) dq::store(o, i, OF, dq::mul(dq::fp8_e4m3(q[i]), sc));
    }
  }
}

// ---- compressed-tensors ----------------------------------------------------------------------

// pack-quantized 4 or 8 bits (fields never straddle words): 8 inputs a step from one word (4 bits,
// inputs aligned to 8) or 8 bytes of the stream (8 bits).
template <int Bits, int SF, int OF>
void ct(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  constexpr uint32_t kMask = (1u << Bits) - 1u;
  const int64_t words = dq::ct_words(v);
  const int64_t c_end = d.col0 + d.cols;
  alignas(32) float buf[kChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = d.row0 + r;
    const int64_t w0 = j * words;
    const uint8_t* rowq = static_cast<const uint8_t*>(v.q) + w0 * 4;
    for (int64_t ib = d.col0; ib < c_end; ib += kChunk) {
      const int64_t ie = lo(c_end, ib + kChunk);
      for (int64_t i = ib; i < ie;) {
        const int64_t g = i / v.group_size;
        const int64_t end = lo(ie, (g + 1) * v.group_size);
        const float sc = dq::ldf_t<SF>(v.scales, j * v.groups + g);
        const int32_t z = dq::ct_zero(v, j, g);
        const __m256 scv = _mm256_set1_ps(sc);
        const __m256i zv = _mm256_set1_epi32(z);
        for (; i < end;) {
          if (i + 8 <= end && (Bits == 8 || i % 8 == 0)) {
            __m256i qv;
            if constexpr (Bits == 8) {
              qv =
                  _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rowq + i)));
            } else {
              qv = fields(dq::ld32(v.q, w0 + i / 8), 4, 0);
            }
            _mm256_storeu_ps(buf + (i - ib), qzs(qv, zv, scv));
            i += 8;
            continue;
          }
          const int64_t p = i * Bits;
          const uint32_t q = (dq::ld32(v.q, w0 + (p >> 5)) >> (p & 31)) & kMask;
          buf[i - ib] = dq::mul(static_cast<float>(static_cast<int32_t>(q) - z), sc);
          ++i;
        }
      }
      flush<OF>(out_row(d, r, OF) + (ib - d.col0) * elem_size(OF), buf, ie - ib);
    }
  }
}

// NVFP4 group scales g0 .. g0 + n - 1 of row j (dq::nvfp4_scale's: e4m3 over the global scale),
// 8 at a time: one division per group was most of a group's time.
constexpr int64_t kScaleRun = 256;

inline void nvfp4_scales(const QuantView& v, int64_t j, int64_t g0, int64_t n, float* out) {
  const uint8_t* s = static_cast<const uint8_t*>(v.scales) + j * v.groups + g0;
  const float global = dq::ldf(v.global_scale, 0, 0);
  const __m256 gv = _mm256_set1_ps(global);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) _mm256_storeu_ps(out + k, _mm256_div_ps(fp8x8(s + k), gv));
  for (; k < n; ++k) out[k] = dq::fdiv(dq::fp8_e4m3(s[k]), global);
}

// NVFP4: per group a 16-entry table e2m1(n) * scale, 16 elements (8 bytes) a step, written
// straight in the output format (no lane is NaN unless the scale is not finite: e2m1 is).
struct Nvfp4Codes {
  __m256 c0, c1;
  float code[16];
  Nvfp4Codes() {
    for (int n = 0; n < 16; ++n) code[n] = dq::e2m1(n);
    c0 = _mm256_loadu_ps(code);
    c1 = _mm256_loadu_ps(code + 8);
  }
};

// Inputs [i, end) of one group (scale sc) of row qr into o (input i at o + es * i).
template <int OF>
inline void nvfp4_group(const Nvfp4Codes& k, const uint8_t* qr, float sc, int64_t i, int64_t end,
                        unsigned char* o) {
  constexpr int es = elem_size(OF);
  const __m256 scv = _mm256_set1_ps(sc);
  const __m256 t0 = _mm256_mul_ps(k.c0, scv), t1 = _mm256_mul_ps(k.c1, scv);
  const bool nan_scale = !finite(sc);
  for (; i < end;) {
    if (i % 2 == 0 && i + 16 <= end) {
      __m256i ia, ibx;
      nibbles16<false>(qr + (i >> 1), &ia, &ibx);
      store16<OF>(o + es * i, lut16(t0, t1, ia), lut16(t0, t1, ibx), nan_scale);
      i += 16;
      continue;
    }
    const uint8_t byte = qr[i >> 1];
    dq::store(o, i, OF, dq::mul(k.code[(i & 1) ? (byte >> 4) : (byte & 0xF)], sc));
    ++i;
  }
}

// 2-byte outputs of two groups of 16 (scales sa, sb: the tables' f32 products as nvfp4_group's)
// as one ByteLut: lane 0 group a's table, lane 1 group b's.
template <int OF>
inline ByteLut nvfp4_lut2(const Nvfp4Codes& k, float sa, float sb) {
  const __m256 va = _mm256_set1_ps(sa), vb = _mm256_set1_ps(sb);
  const bool maybe_nan = !finite(sa) || !finite(sb);
  const __m256i eo = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4,
                                      6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  // Per table: [low bytes 0-7, high bytes 0-7 | low bytes 8-15, high bytes 8-15].
  const __m256i a = _mm256_shuffle_epi8(
      format16<OF>(_mm256_mul_ps(k.c0, va), _mm256_mul_ps(k.c1, va), maybe_nan), eo);
  const __m256i b = _mm256_shuffle_epi8(
      format16<OF>(_mm256_mul_ps(k.c0, vb), _mm256_mul_ps(k.c1, vb), maybe_nan), eo);
  const __m256i p20 = _mm256_permute2x128_si256(a, b, 0x20),
                p31 = _mm256_permute2x128_si256(a, b, 0x31);
  return {_mm256_unpacklo_epi64(p20, p31), _mm256_unpackhi_epi64(p20, p31)};
}

// The 32 inputs of two groups of 16 (16 bytes at p, low nibble first) through nvfp4_lut2's table.
inline void nvfp4_pair(const uint8_t* p, const ByteLut& t, unsigned char* o) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i y = _mm256_permute4x64_epi64(_mm256_castsi128_si256(x), 0x50);  // lane g: 8 bytes
  const __m256i m = _mm256_set1_epi8(0x0F);
  const __m256i idx =
      _mm256_unpacklo_epi8(_mm256_and_si256(y, m), _mm256_and_si256(_mm256_srli_epi16(y, 4), m));
  const __m256i l = _mm256_shuffle_epi8(t.lo, idx), h = _mm256_shuffle_epi8(t.hi, idx);
  const __m256i a = _mm256_unpacklo_epi8(l, h), b = _mm256_unpackhi_epi8(l, h);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_permute2x128_si256(a, b, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 32), _mm256_permute2x128_si256(a, b, 0x31));
}

// Two-byte outputs with groups of 16 (the format's): two whole groups a step by one table lookup
// (nvfp4_pair); a window's partial groups and a lone last one as nvfp4_group.
template <int OF>
void nvfp4(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const Nvfp4Codes k;
  const int64_t c_end = d.col0 + d.cols;
  constexpr int es = elem_size(OF);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = d.row0 + r;
    const uint8_t* qr = static_cast<const uint8_t*>(v.q) + j * (v.in / 2);
    unsigned char* o = out_row(d, r, OF) - d.col0 * es;  // input i at o + es * i
    float sc_run[kScaleRun];  // groups [g_run, g_run + kScaleRun)' scales
    int64_t g_run = -kScaleRun;
    for (int64_t i = d.col0; i < c_end;) {
      const int64_t g = i / v.group_size;
      if (g + 1 >= g_run + kScaleRun) {
        g_run = g;
        nvfp4_scales(v, j, g, lo(kScaleRun, v.groups - g), sc_run);
      }
      if constexpr (OF != 0) {
        if (v.group_size == 16 && i % 16 == 0 && i + 32 <= c_end) {
          nvfp4_pair(qr + (i >> 1), nvfp4_lut2<OF>(k, sc_run[g - g_run], sc_run[g + 1 - g_run]),
                     o + es * i);
          i += 32;
          continue;
        }
      }
      const int64_t end = lo(c_end, (g + 1) * v.group_size);
      nvfp4_group<OF>(k, qr, sc_run[g - g_run], i, end, o);
      i = end;
    }
  }
}

// ---- choice ----------------------------------------------------------------------------------

template <int SF, int OF>
RowsFn pick_rows(const QuantView& v, const DequantDst& d) {
  switch (v.scheme) {
    case QuantScheme::kGptq: {
      const int pack = 32 / v.bits;
      if (v.g_idx != nullptr) {
        return v.bits == 4 && v.groups <= kMaxActGroups ? &gptq4_act_any<SF, OF> : nullptr;
      }
      if (d.col0 % pack != 0 || v.group_size % pack != 0) return nullptr;
      if constexpr (OF != 0) {
        if (v.bits == 4 && v.group_size % 64 == 0) return &gptq4_lut<SF, OF>;
      }
      return v.bits == 2 ? &gptq_words<2, SF, OF>
                         : (v.bits == 4 ? &gptq4_rows8<SF, OF> : &gptq_words<8, SF, OF>);
    }
    case QuantScheme::kAwq:
      return &awq<SF, OF>;
    case QuantScheme::kBnb4:
      if constexpr (OF != 0) return &bnb4_lut<OF>;
      return &bnb4<OF>;
    case QuantScheme::kBnb8:
      return &bnb8<SF, OF>;
    case QuantScheme::kCtInt:
      if constexpr (OF != 0) {
        if (v.bits == 4) return &ct4_lut<SF, OF>;
      }
      return v.bits == 4 ? &ct<4, SF, OF> : (v.bits == 8 ? &ct<8, SF, OF> : nullptr);
    case QuantScheme::kNvfp4:
      return &nvfp4<OF>;
    case QuantScheme::kFp8:
      return &fp8<SF, OF>;
  }
  return nullptr;
}

template <int OF>
RowsFn pick_scales(const QuantView& v, const DequantDst& d) {
  switch (v.scales_format) {
    case 0:
      return pick_rows<0, OF>(v, d);
    case 1:
      return pick_rows<1, OF>(v, d);
    default:
      return pick_rows<2, OF>(v, d);
  }
}

}  // namespace

#undef METALOAD_VEC_INLINE

RowsFn pick(const QuantView& v, const DequantDst& d) {
  return d.format == 0 ? pick_scales<0>(v, d)
                       : (d.format == 1 ? pick_scales<1>(v, d) : pick_scales<2>(v, d));
}

void flush_for_test(int fmt, void* out, const float* in, int64_t n) {
  unsigned char* o = static_cast<unsigned char*>(out);
  if (fmt == 0) {
    flush<0>(o, in, n);
  } else if (fmt == 1) {
    flush<1>(o, in, n);
  } else {
    flush<2>(o, in, n);
  }
}

}  // namespace dq_avx2
}  // namespace metaload

#else  // a build without the ISA flags (not x86-64): no vector kernels, dequant.cc runs its own

namespace metaload {
namespace dq_avx2 {
RowsFn pick(const QuantView&, const DequantDst&) {
  return nullptr;
}
void flush_for_test(int, void*, const float*, int64_t) {}
}  // namespace dq_avx2
}  // namespace metaload

#endif
