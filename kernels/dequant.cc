#include "kernels/dequant.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>

#include "kernels/dequant_avx2.h"

namespace metaload {

#ifdef METALOAD_WITH_CUDA
namespace cuda_detail {
// dequant.cu; each returns nullptr or the CUDA error string.
const char* dequant(const QuantView& v, const DequantDst& d, void* stream);
const char* dequant_sync(void* stream);
}  // namespace cuda_detail
#endif

const char* quant_scheme_name(QuantScheme s) {
  switch (s) {
    case QuantScheme::kGptq:
      return "gptq";
    case QuantScheme::kAwq:
      return "awq";
    case QuantScheme::kBnb4:
      return "bnb4";
    case QuantScheme::kBnb8:
      return "bnb8";
    case QuantScheme::kFp8:
      return "fp8";
    case QuantScheme::kCtInt:
      return "ct-int";
    case QuantScheme::kNvfp4:
      return "nvfp4";
  }
  return "?";
}

namespace {

[[noreturn]] void fail(const QuantView& v, const std::string& what) {
  throw ShapeError(std::string("dequant_") + quant_scheme_name(v.scheme) + ": " + what);
}

std::string s(int64_t x) {
  return std::to_string(x);
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

void check_dequant(const QuantView& v, const DequantDst& d) {
  if (v.out < 0 || v.in < 0) fail(v, "negative shape [" + s(v.out) + ", " + s(v.in) + "]");
  if (d.format < 0 || d.format > 2) fail(v, "unknown output format " + s(d.format));
  if (v.scales_format < 0 || v.scales_format > 2) {
    fail(v, "unknown scales format " + s(v.scales_format));
  }
  if (d.row0 < 0 || d.rows < 0 || d.row0 + d.rows > v.out || d.col0 < 0 || d.cols < 0 ||
      d.col0 + d.cols > v.in) {
    fail(v, "window rows [" + s(d.row0) + ", " + s(d.row0 + d.rows) + ") x columns [" + s(d.col0) +
                ", " + s(d.col0 + d.cols) + ") is outside the weight [" + s(v.out) + ", " +
                s(v.in) + "]");
  }
  if (d.ld < d.cols) fail(v, "output row pitch " + s(d.ld) + " < " + s(d.cols) + " columns");
  if (v.q == nullptr || v.scales == nullptr || (d.data == nullptr && d.rows * d.cols > 0)) {
    fail(v, "missing data");
  }
  switch (v.scheme) {
    case QuantScheme::kGptq: {
      if (v.bits != 2 && v.bits != 4 && v.bits != 8) {
        fail(v, s(v.bits) + " bits (2, 4 and 8 pack evenly into int32)");
      }
      const int pack = 32 / v.bits;
      if (v.in % pack != 0 || v.out % pack != 0) {
        fail(v, "shape [" + s(v.out) + ", " + s(v.in) + "] is not a multiple of " + s(pack) +
                    " values per int32 in both dims");
      }
      if (v.zeros == nullptr) fail(v, "missing qzeros");
      if (v.groups < 1) fail(v, "no groups");
      if (v.g_idx == nullptr) {
        if (v.group_size < 1) fail(v, "group size " + s(v.group_size));
        if (v.groups != ceil_div(v.in, v.group_size)) {
          fail(v, s(v.groups) + " groups of scales, but " + s(v.in) + " input rows in groups of " +
                      s(v.group_size) + " make " + s(ceil_div(v.in, v.group_size)));
        }
      }
      break;
    }
    case QuantScheme::kAwq:
      if (v.out % 8 != 0) fail(v, "output dim " + s(v.out) + " is not a multiple of 8");
      if (v.zeros == nullptr) fail(v, "missing qzeros");
      if (v.group_size < 1) fail(v, "group size " + s(v.group_size));
      if (v.groups != ceil_div(v.in, v.group_size)) {
        fail(v, s(v.groups) + " groups of scales, but " + s(v.in) + " input rows in groups of " +
                    s(v.group_size) + " make " + s(ceil_div(v.in, v.group_size)));
      }
      break;
    case QuantScheme::kBnb4:
      if (v.group_size < 1) fail(v, "blocksize " + s(v.group_size));
      if (v.code == nullptr) fail(v, "missing quant_map");
      if (v.nested_scales != nullptr && (v.nested_block < 1 || v.nested_code == nullptr)) {
        fail(v, "double quantization without nested blocksize or nested quant_map");
      }
      break;
    case QuantScheme::kBnb8:
      break;
    case QuantScheme::kFp8:
      if (v.group_size < 1 || v.block_in < 1) {
        fail(v, "block " + s(v.group_size) + " x " + s(v.block_in));
      }
      break;
    case QuantScheme::kCtInt:
    case QuantScheme::kNvfp4:
      if (v.scheme == QuantScheme::kCtInt && (v.bits < 1 || v.bits > 8)) {
        fail(v, s(v.bits) + " bits (1 to 8 pack into int32)");
      }
      if (v.scheme == QuantScheme::kNvfp4) {
        if (v.in % 2 != 0) fail(v, "input dim " + s(v.in) + " is odd (two FP4 codes per byte)");
        if (v.global_scale == nullptr) fail(v, "missing weight_global_scale");
      }
      if (v.group_size < 1) fail(v, "group size " + s(v.group_size));
      if (v.groups != ceil_div(v.in, v.group_size)) {
        fail(v, s(v.groups) + " groups of scales, but " + s(v.in) + " inputs in groups of " +
                    s(v.group_size) + " make " + s(ceil_div(v.in, v.group_size)));
      }
      break;
    default:
      fail(v, "unknown scheme");
  }
}

void check_g_idx(const QuantView& v) {
  if (v.scheme != QuantScheme::kGptq || v.g_idx == nullptr) return;
  for (int64_t i = 0; i < v.in; ++i) {
    const int32_t g = static_cast<int32_t>(dq::ld32(v.g_idx, i));
    if (g < 0 || g >= v.groups) {
      fail(v,
           "g_idx[" + s(i) + "] = " + s(g) + " is not a group of scales [0, " + s(v.groups) + ")");
    }
  }
}

namespace {

constexpr int64_t kColChunk = 512;  // input columns per pass over a tile of output rows

template <int OF>
inline void put(unsigned char* row, int64_t c, float f) {
  dq::store(row, c, OF, f);
}

constexpr int elem_size(int fmt) {
  return fmt == 0 ? 4 : 2;
}

// The kernels compute a row segment's floats into a buffer of kColChunk, then flush writes them
// in the output format: a plain loop of integer operations on the f32 bits (the same
// convert_bits.h rounding as dq::store, element by element), which GCC vectorises at -O2
// (checked with -fopt-info-vec-optimized: "loop vectorized" for the f16 and bf16 loops).
template <int OF>
inline void flush(unsigned char* row, int64_t c, const float* buf, int64_t n) {
  unsigned char* o = row + c * elem_size(OF);
  if constexpr (OF == 0) {
    std::memcpy(o, buf, static_cast<size_t>(n) * 4);
  } else {
    uint16_t h[kColChunk];
    for (int64_t k = 0; k < n; ++k) {  // compiler-vectorised (see above)
      const uint32_t x = bits::f32_bits(buf[k]);
      h[k] = OF == 1 ? bits::f32_to_f16(x) : bits::f32_to_bf16(x);
    }
    std::memcpy(o, h, static_cast<size_t>(n) * 2);
  }
}

// GPTQ with groups of whole words (gptq_rows' fast case): each word of qweight gives kPack inputs
// of row j in one group, read once and unpacked by a constant-trip loop (unrolled); scale and zero
// read once per group. The floats go out through flush (vectorised). Same operations per element
// as gptq_rows' general loop. Tiles of 64 rows (4 cache lines of one qweight row; 16 and 128
// measured slower).
template <int Bits, int SF, int OF>
void gptq_rows_words(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  constexpr int kPack = 32 / Bits;
  constexpr uint32_t kMask = (1u << Bits) - 1u;
  const int64_t zcols = v.out / kPack;
  const int64_t c_end = d.col0 + d.cols;
  float buf[kColChunk];
  for (int64_t rt = r0; rt < r1; rt += 64) {
    for (int64_t ib = d.col0; ib < c_end; ib += kColChunk) {
      const int64_t ie = std::min(c_end, ib + kColChunk);
      for (int64_t r = rt; r < std::min(r1, rt + 64); ++r) {
        const int64_t j = d.row0 + r;
        unsigned char* row = static_cast<unsigned char*>(d.data) + r * d.ld * elem_size(OF);
        const int zshift = Bits * static_cast<int>(j % kPack);
        for (int64_t i = ib; i < ie;) {
          const int64_t g = i / v.group_size;
          const int64_t gend = std::min(ie, (g + 1) * v.group_size);
          const float sc = dq::ldf_t<SF>(v.scales, g * v.out + j);
          const int32_t z =
              static_cast<int32_t>((dq::ld32(v.zeros, g * zcols + j / kPack) >> zshift) & kMask) +
              v.zero_offset;
          for (; i + kPack <= gend; i += kPack) {
            const uint32_t w = dq::ld32(v.q, (i / kPack) * v.out + j);
            float* b = buf + (i - ib);
            for (int k = 0; k < kPack; ++k) {
              const int32_t q = static_cast<int32_t>((w >> (Bits * k)) & kMask);
              b[k] = dq::mul(static_cast<float>(q - z), sc);
            }
          }
          if (i < gend) {  // the window's last, partial word
            const uint32_t w = dq::ld32(v.q, (i / kPack) * v.out + j);
            for (; i < gend; ++i) {
              const int32_t q = static_cast<int32_t>((w >> (Bits * (i % kPack))) & kMask);
              buf[i - ib] = dq::mul(static_cast<float>(q - z), sc);
            }
          }
        }
        flush<OF>(row, ib - d.col0, buf, ie - ib);
      }
    }
  }
}

// GPTQ: for one output row j the input rows are one field of a column of qweight; chunks of
// columns keep a tile's words in cache. The group changes every group_size rows (or as g_idx
// says), and only then are its scale and zero read.
template <int Bits, int SF, int OF>
void gptq_rows(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  constexpr int kPack = 32 / Bits;
  constexpr uint32_t kMask = (1u << Bits) - 1u;
  const int64_t zcols = v.out / kPack;
  const int64_t c_end = d.col0 + d.cols;
  if (v.g_idx == nullptr && d.col0 % kPack == 0 && v.group_size % kPack == 0) {
    gptq_rows_words<Bits, SF, OF>(v, d, r0, r1);
    return;
  }
  for (int64_t ib = d.col0; ib < c_end; ib += kColChunk) {
    const int64_t ie = std::min(c_end, ib + kColChunk);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t j = d.row0 + r;
      unsigned char* row = static_cast<unsigned char*>(d.data) + r * d.ld * elem_size(OF);
      const int zshift = Bits * static_cast<int>(j % kPack);
      int64_t g = -1, next = 0;
      float sc = 0;
      int32_t z = 0;
      for (int64_t i = ib; i < ie; ++i) {
        int64_t gi;
        if (v.g_idx != nullptr) {
          gi = static_cast<int32_t>(dq::ld32(v.g_idx, i));
        } else {
          if (g < 0) {
            gi = i / v.group_size;
            next = (gi + 1) * v.group_size;
          } else {
            gi = g;
            if (i == next) {
              ++gi;
              next += v.group_size;
            }
          }
        }
        if (gi != g) {
          g = gi;
          sc = dq::ldf_t<SF>(v.scales, g * v.out + j);
          z = static_cast<int32_t>((dq::ld32(v.zeros, g * zcols + j / kPack) >> zshift) & kMask) +
              v.zero_offset;
        }
        const uint32_t w = dq::ld32(v.q, (i / kPack) * v.out + j);
        const int32_t q = static_cast<int32_t>((w >> (Bits * (i % kPack))) & kMask);
        put<OF>(row, i - d.col0, dq::mul(static_cast<float>(q - z), sc));
      }
    }
  }
}

// AWQ: qweight rows are input rows; output row j is one nibble of column j / 8.
template <int SF, int OF>
void awq_rows_each(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const int64_t wcols = v.out / 8;
  const int64_t c_end = d.col0 + d.cols;
  float buf[kColChunk];
  for (int64_t ib = d.col0; ib < c_end; ib += kColChunk) {
    const int64_t ie = std::min(c_end, ib + kColChunk);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t j = d.row0 + r;
      unsigned char* row = static_cast<unsigned char*>(d.data) + r * d.ld * elem_size(OF);
      const int shift = 4 * dq::awq_nibble(j & 7);
      const int64_t wc = j / 8;
      int64_t g = ib / v.group_size, next = (g + 1) * v.group_size;
      auto group = [&](int64_t gg, float* sc, int32_t* z) {
        *sc = dq::ldf_t<SF>(v.scales, gg * v.out + j);
        *z = static_cast<int32_t>((dq::ld32(v.zeros, gg * wcols + wc) >> shift) & 0xFu);
      };
      float sc;
      int32_t z;
      group(g, &sc, &z);
      for (int64_t i = ib; i < ie; ++i) {
        if (i == next) {
          ++g;
          next += v.group_size;
          group(g, &sc, &z);
        }
        const int32_t q = static_cast<int32_t>((dq::ld32(v.q, i * wcols + wc) >> shift) & 0xFu);
        buf[i - ib] = dq::mul(static_cast<float>(q - z), sc);
      }
      flush<OF>(row, ib - d.col0, buf, ie - ib);
    }
  }
}

// The 8 output rows of one qweight column at once: each word read once for its 8 nibbles.
template <int SF, int OF>
void awq_rows(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const int64_t a = std::min(r1, r0 + (8 - (d.row0 + r0) % 8) % 8);
  const int64_t b = std::max(a, r1 - (d.row0 + r1) % 8);
  if (r0 < a) awq_rows_each<SF, OF>(v, d, r0, a);
  if (b < r1) awq_rows_each<SF, OF>(v, d, b, r1);
  const int64_t wcols = v.out / 8;
  const int64_t c_end = d.col0 + d.cols;
  int shift[8];
  for (int k = 0; k < 8; ++k) shift[k] = 4 * dq::awq_nibble(k);
  float buf[8][kColChunk];
  // Tiles of 128 rows: the 16 qweight columns of one input row share a cache line.
  for (int64_t rt = a; rt < b; rt += 128) {
    for (int64_t ib = d.col0; ib < c_end; ib += kColChunk) {
      const int64_t ie = std::min(c_end, ib + kColChunk);
      for (int64_t r = rt; r < std::min(b, rt + 128); r += 8) {
        const int64_t j0 = d.row0 + r;
        const int64_t wc = j0 / 8;
        for (int64_t i = ib; i < ie;) {
          const int64_t g = i / v.group_size;
          const int64_t gend = std::min(ie, (g + 1) * v.group_size);
          float sc[8];
          int32_t z[8];
          const uint32_t zw = dq::ld32(v.zeros, g * wcols + wc);
          for (int k = 0; k < 8; ++k) {
            sc[k] = dq::ldf_t<SF>(v.scales, g * v.out + j0 + k);
            z[k] = static_cast<int32_t>((zw >> shift[k]) & 0xFu);
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
          unsigned char* row = static_cast<unsigned char*>(d.data) + (r + k) * d.ld * elem_size(OF);
          flush<OF>(row, ib - d.col0, buf[k], ie - ib);
        }
      }
    }
  }
}

// bitsandbytes 4-bit: per block a 16-entry table code[n] * absmax, then one lookup per element.
template <int OF>
void bnb4_rows(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const uint8_t* q = static_cast<const uint8_t*>(v.q);
  float code[16];
  for (int n = 0; n < 16; ++n) code[n] = dq::ldf(v.code, n, 0);
  float buf[kColChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = d.row0 + r;
    unsigned char* row = static_cast<unsigned char*>(d.data) + r * d.ld * elem_size(OF);
    const int64_t kr = j * v.in + d.col0, kr1 = kr + d.cols;
    for (int64_t k0 = kr; k0 < kr1; k0 += kColChunk) {
      const int64_t k1 = std::min(kr1, k0 + kColChunk);
      for (int64_t k = k0; k < k1;) {
        const int64_t b = k / v.group_size;
        const int64_t end = std::min(k1, (b + 1) * v.group_size);
        const float a = dq::bnb4_absmax(v, b);
        float lut[16];
        for (int n = 0; n < 16; ++n) lut[n] = dq::mul(code[n], a);
        if (k & 1) {
          buf[k - k0] = lut[q[k >> 1] & 0xF];
          ++k;
        }
        for (; k + 1 < end; k += 2) {
          const uint8_t byte = q[k >> 1];
          buf[k - k0] = lut[byte >> 4];
          buf[k + 1 - k0] = lut[byte & 0xF];
        }
        if (k < end) {
          buf[k - k0] = lut[q[k >> 1] >> 4];
          ++k;
        }
      }
      flush<OF>(row, k0 - kr, buf, k1 - k0);
    }
  }
}

template <int SF, int OF>
void bnb8_rows(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  float buf[kColChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = d.row0 + r;
    unsigned char* row = static_cast<unsigned char*>(d.data) + r * d.ld * elem_size(OF);
    const int8_t* q = static_cast<const int8_t*>(v.q) + j * v.in + d.col0;
    const float sc = dq::ldf_t<SF>(v.scales, j);
    for (int64_t c0 = 0; c0 < d.cols; c0 += kColChunk) {
      const int64_t n = std::min(kColChunk, d.cols - c0);
      for (int64_t c = 0; c < n; ++c) {  // compiler-vectorised (int8 -> f32, two multiplies)
        buf[c] = dq::mul(dq::mul(static_cast<float>(q[c0 + c]), sc), dq::kInv127);
      }
      flush<OF>(row, c0, buf, n);
    }
  }
}

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int b = 0; b < 256; ++b) a[b] = dq::fp8_e4m3(static_cast<uint8_t>(b));
    return a;
  }();
  return t;
}

template <int SF, int OF>
void fp8_rows(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const float* lut = fp8_table().data();
  const int64_t scols = ceil_div(v.in, v.block_in);
  const int64_t c_end = d.col0 + d.cols;
  float buf[kColChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = d.row0 + r;
    unsigned char* row = static_cast<unsigned char*>(d.data) + r * d.ld * elem_size(OF);
    const uint8_t* q = static_cast<const uint8_t*>(v.q) + j * v.in;
    for (int64_t ib = d.col0; ib < c_end; ib += kColChunk) {
      const int64_t ie = std::min(c_end, ib + kColChunk);
      for (int64_t i = ib; i < ie;) {
        const int64_t b = i / v.block_in;
        const int64_t end = std::min(ie, (b + 1) * v.block_in);
        const float sc = dq::ldf_t<SF>(v.scales, (j / v.group_size) * scols + b);
        for (; i < end; ++i) buf[i - ib] = dq::mul(lut[q[i]], sc);  // compiler-vectorised
      }
      flush<OF>(row, ib - d.col0, buf, ie - ib);
    }
  }
}

// compressed-tensors pack-quantized: per row, one group at a time (its scale and zero read once);
// 4 and 8 bits never straddle a word, so their fields come straight from one load.
template <int Bits, int SF, int OF>
void ct_rows(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const int bits = Bits > 0 ? Bits : v.bits;
  [[maybe_unused]] const uint32_t mask = (1u << bits) - 1u;
  const int64_t words = dq::ct_words(v);
  const int64_t c_end = d.col0 + d.cols;
  float buf[kColChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = d.row0 + r;
    unsigned char* row = static_cast<unsigned char*>(d.data) + r * d.ld * elem_size(OF);
    const int64_t w0 = j * words;
    for (int64_t ib = d.col0; ib < c_end; ib += kColChunk) {
      const int64_t ie = std::min(c_end, ib + kColChunk);
      for (int64_t i = ib; i < ie;) {
        const int64_t g = i / v.group_size;
        const int64_t end = std::min(ie, (g + 1) * v.group_size);
        const float sc = dq::ldf_t<SF>(v.scales, j * v.groups + g);
        const int32_t z = dq::ct_zero(v, j, g);
        for (; i < end; ++i) {
          uint32_t q;
          if constexpr (Bits == 4 || Bits == 8) {
            const int64_t p = i * Bits;
            q = (dq::ld32(v.q, w0 + (p >> 5)) >> (p & 31)) & mask;
          } else {
            q = dq::ct_field(v.q, w0, 1, i * bits, bits);
          }
          buf[i - ib] = dq::mul(static_cast<float>(static_cast<int32_t>(q) - z), sc);
        }
      }
      flush<OF>(row, ib - d.col0, buf, ie - ib);
    }
  }
}

// NVFP4: per group of 16 a table of the 16 codes times the group's scale, then one lookup per
// element.
template <int OF>
void nvfp4_rows(const QuantView& v, const DequantDst& d, int64_t r0, int64_t r1) {
  const uint8_t* q = static_cast<const uint8_t*>(v.q);
  float code[16];
  for (int n = 0; n < 16; ++n) code[n] = dq::e2m1(n);
  const int64_t c_end = d.col0 + d.cols;
  float buf[kColChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = d.row0 + r;
    unsigned char* row = static_cast<unsigned char*>(d.data) + r * d.ld * elem_size(OF);
    const uint8_t* qr = q + j * (v.in / 2);
    for (int64_t ib = d.col0; ib < c_end; ib += kColChunk) {
      const int64_t ie = std::min(c_end, ib + kColChunk);
      for (int64_t i = ib; i < ie;) {
        const int64_t g = i / v.group_size;
        const int64_t end = std::min(ie, (g + 1) * v.group_size);
        const float sc = dq::nvfp4_scale(v, j, g);
        float lut[16];
        for (int n = 0; n < 16; ++n) lut[n] = dq::mul(code[n], sc);
        for (; i < end; ++i) {
          const uint8_t byte = qr[i >> 1];
          buf[i - ib] = lut[(i & 1) ? (byte >> 4) : (byte & 0xF)];
        }
      }
      flush<OF>(row, ib - d.col0, buf, ie - ib);
    }
  }
}

using RowsFn = void (*)(const QuantView&, const DequantDst&, int64_t, int64_t);

template <int SF, int OF>
RowsFn pick_rows(const QuantView& v) {
  switch (v.scheme) {
    case QuantScheme::kGptq:
      return v.bits == 2 ? &gptq_rows<2, SF, OF>
                         : (v.bits == 4 ? &gptq_rows<4, SF, OF> : &gptq_rows<8, SF, OF>);
    case QuantScheme::kAwq:
      return &awq_rows<SF, OF>;
    case QuantScheme::kBnb4:
      return &bnb4_rows<OF>;
    case QuantScheme::kBnb8:
      return &bnb8_rows<SF, OF>;
    case QuantScheme::kCtInt:
      return v.bits == 4 ? &ct_rows<4, SF, OF>
                         : (v.bits == 8 ? &ct_rows<8, SF, OF> : &ct_rows<0, SF, OF>);
    case QuantScheme::kNvfp4:
      return &nvfp4_rows<OF>;
    default:
      return &fp8_rows<SF, OF>;
  }
}

template <int OF>
RowsFn pick_scales(const QuantView& v) {
  switch (v.scales_format) {
    case 0:
      return pick_rows<0, OF>(v);
    case 1:
      return pick_rows<1, OF>(v);
    default:
      return pick_rows<2, OF>(v);
  }
}

}  // namespace

namespace {

std::atomic<bool> g_vector_kernels{true};

// A checked window with its kernel: what every tile of it runs.
struct Prepared {
  QuantView v;
  DequantDst d;
  RowsFn fn = nullptr;
  int64_t grain = 8;  // rows per tile, a multiple of 8
};

// GPTQ checkpoints without act order still store g_idx, as i / group_size: the kernels then
// take the group from i (the same group, so the same bits) and GPTQ its word-at-a-time path.
QuantView drop_trivial_g_idx(QuantView w) {
  if (w.scheme == QuantScheme::kGptq && w.g_idx != nullptr && w.group_size >= 1) {
    bool trivial = true;
    for (int64_t i = 0; i < w.in && trivial; ++i) {
      trivial = static_cast<int32_t>(dq::ld32(w.g_idx, i)) == i / w.group_size;
    }
    if (trivial) w.g_idx = nullptr;
  }
  return w;
}

// Rows per tile: at least ~64k elements, a multiple of 8 (GPTQ / AWQ rows share words 8 or 4 at
// a time); GPTQ 64 and AWQ 128 rows, the tiles their kernels walk qweight's cache lines in.
int64_t row_grain(const QuantView& v, const DequantDst& d) {
  int64_t grain = std::max<int64_t>(8, (int64_t{1} << 16) / std::max<int64_t>(d.cols, 1));
  if (v.scheme == QuantScheme::kGptq) grain = std::max<int64_t>(grain, 64);
  if (v.scheme == QuantScheme::kAwq) grain = std::max<int64_t>(grain, 128);
  return (grain + 7) / 8 * 8;
}

Prepared prepare(const QuantView& v, const DequantDst& d) {
  check_dequant(v, d);
  check_g_idx(v);
  Prepared p;
  p.v = drop_trivial_g_idx(v);
  p.d = d;
  if (dequant_vector_kernels()) p.fn = dq_avx2::pick(p.v, d);
  if (p.fn == nullptr) {
    p.fn = d.format == 0   ? pick_scales<0>(p.v)
           : d.format == 1 ? pick_scales<1>(p.v)
                           : pick_scales<2>(p.v);
  }
  p.grain = row_grain(p.v, d);
  return p;
}

struct Tile {
  const Prepared* p;
  int64_t r0, r1;
};

void run_tile(const Tile& t, const DequantTouch& touch, const DequantSink& sink,
              std::vector<unsigned char>& buffer) {
  const DequantDst& d = t.p->d;
  if (sink && d.ld == d.cols) {  // rows [r0, r1) as the window rows of a buffer of their own
    const int64_t es = d.format == 0 ? 4 : 2;
    const size_t bytes = static_cast<size_t>((t.r1 - t.r0) * d.cols * es);
    if (buffer.size() < bytes) buffer.resize(bytes);
    DequantDst b = d;
    b.data = buffer.data();
    b.row0 = d.row0 + t.r0;
    b.rows = t.r1 - t.r0;
    t.p->fn(t.p->v, b, 0, b.rows);
    sink(static_cast<unsigned char*>(d.data) + t.r0 * d.ld * es, buffer.data(), bytes);
    return;
  }
  if (touch) {
    const int64_t es = d.format == 0 ? 4 : 2;
    touch(static_cast<unsigned char*>(d.data) + t.r0 * d.ld * es,
          static_cast<size_t>(((t.r1 - t.r0 - 1) * d.ld + d.cols) * es));
  }
  t.p->fn(t.p->v, d, t.r0, t.r1);
}

}  // namespace

void dequant_cpu(const QuantView& v, const DequantDst& d) {
  const Prepared p = prepare(v, d);
  if (d.rows == 0 || d.cols == 0) return;
  at::parallel_for(0, d.rows, p.grain, [&](int64_t r0, int64_t r1) { p.fn(p.v, p.d, r0, r1); });
}

void dequant_cpu_jobs(const std::vector<DequantJob>& jobs, int threads, const DequantTouch& touch,
                      const DequantSink& sink) {
  std::vector<Prepared> prepared;
  prepared.reserve(jobs.size());
  for (const DequantJob& j : jobs) prepared.push_back(prepare(j.view, j.dst));
  std::vector<Tile> tiles;
  for (const Prepared& p : prepared) {
    if (p.d.cols == 0) continue;
    for (int64_t r = 0; r < p.d.rows; r += p.grain) {
      tiles.push_back({&p, r, std::min(p.d.rows, r + p.grain)});
    }
  }
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t n = std::min(static_cast<size_t>(threads), tiles.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    std::vector<unsigned char> buffer;  // this thread's tile, where a sink takes them
    for (size_t i; (i = next.fetch_add(1)) < tiles.size();) run_tile(tiles[i], touch, sink, buffer);
  };
  std::vector<std::thread> pool;
  try {
    for (size_t t = 1; t < n; ++t) pool.emplace_back(work);
  } catch (const std::system_error&) {
    // No thread to be had: those started and this one take every tile between them.
  }
  work();
  for (std::thread& t : pool) t.join();
}

void set_dequant_vector_kernels(bool on) {
  g_vector_kernels.store(on);
}

bool dequant_vector_kernels() {
  return g_vector_kernels.load() && dq_avx2::cpu_supported();
}

namespace dq_avx2 {
// Here, not in dequant_avx2.cc: this must run on any x86-64 CPU.
bool cpu_supported() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}
}  // namespace dq_avx2

bool dequant_cuda_compiled() {
#ifdef METALOAD_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void dequant_cuda(const QuantView& v, const DequantDst& d, void* stream) {
  check_dequant(v, d);
#ifdef METALOAD_WITH_CUDA
  if (const char* err = cuda_detail::dequant(v, d, stream)) {
    throw ConversionError(std::string("CUDA dequant_") + quant_scheme_name(v.scheme) +
                          " failed: " + err);
  }
#else
  (void)stream;
  throw ConversionError(std::string("CUDA dequant_") + quant_scheme_name(v.scheme) +
                        " requested, but this build has no CUDA kernels (nvcc was not found)");
#endif
}

void dequant_cuda_sync(void* stream) {
#ifdef METALOAD_WITH_CUDA
  if (const char* err = cuda_detail::dequant_sync(stream)) {
    throw ConversionError(std::string("CUDA dequantization failed: ") + err);
  }
#else
  (void)stream;
  throw ConversionError("CUDA dequantization requested, but this build has no CUDA kernels");
#endif
}

}  // namespace metaload
