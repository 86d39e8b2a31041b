// The CPU dequantization kernels against values computed here from the unpacked integers: each
// test draws random codes, packs them the way the quantizing library does (written out below,
// independently of dequant_bits.h), and checks every element of full weights and of windows
// (tensor-parallel slices), in f32 exactly and in bf16 / f16 as the rounded f32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/convert_bits.h"
#include "kernels/dequant.h"

namespace metaload {
namespace {

struct Case {
  int64_t out, in;
  std::vector<float> expect;  // [out, in]
};

std::vector<float> run(const QuantView& v, int fmt, int64_t row0, int64_t rows, int64_t col0,
                       int64_t cols) {
  std::vector<unsigned char> buf(rows * cols * (fmt == 0 ? 4 : 2) + 3);
  DequantDst d;
  d.data = buf.data() + 1;  // deliberately misaligned
  d.format = fmt;
  d.ld = cols;
  d.row0 = row0;
  d.rows = rows;
  d.col0 = col0;
  d.cols = cols;
  dequant_cpu(v, d);
  std::vector<float> out(rows * cols);
  for (int64_t k = 0; k < rows * cols; ++k) {
    if (fmt == 0) {
      std::memcpy(&out[k], buf.data() + 1 + k * 4, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, buf.data() + 1 + k * 2, 2);
      out[k] = bits::f32_from_bits(fmt == 1 ? bits::f16_to_f32(h) : bits::bf16_to_f32(h));
    }
  }
  return out;
}

float rounded(float f, int fmt) {
  if (fmt == 0) return f;
  if (fmt == 1) return bits::f32_from_bits(bits::f16_to_f32(bits::f32_to_f16(bits::f32_bits(f))));
  return bits::f32_from_bits(bits::bf16_to_f32(bits::f32_to_bf16(bits::f32_bits(f))));
}

// Checks the whole weight and a few windows in every output format.
void check_all(const QuantView& v, const std::vector<float>& expect) {
  const int64_t out = v.out, in = v.in;
  struct W {
    int64_t r0, rows, c0, cols;
  };
  const W windows[] = {{0, out, 0, in},
                       {0, out / 2, 0, in},
                       {out / 2, out - out / 2, 0, in},
                       {0, out, in / 2, in - in / 2},
                       {1, out - 3, 3, in - 8},
                       // rows off AWQ's 8-row words, a word-aligned start and a partial last word
                       {2, out - 5, 8, in - 13}};
  for (int fmt = 0; fmt < 3; ++fmt) {
    for (const W& w : windows) {
      const std::vector<float> got = run(v, fmt, w.r0, w.rows, w.c0, w.cols);
      for (int64_t r = 0; r < w.rows; ++r) {
        for (int64_t c = 0; c < w.cols; ++c) {
          const float e = rounded(expect[(w.r0 + r) * in + w.c0 + c], fmt);
          const float g = got[r * w.cols + c];
          ASSERT_TRUE(e == g || (std::isnan(e) && std::isnan(g)))
              << quant_scheme_name(v.scheme) << " fmt " << fmt << " window " << w.r0 << "+"
              << w.rows << " x " << w.c0 << "+" << w.cols << " at (" << w.r0 + r << ", " << w.c0 + c
              << "): expected " << e << " got " << g;
        }
      }
    }
  }
}

std::vector<uint16_t> f16_scales(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> u(0.001f, 0.05f);
  std::vector<uint16_t> s(n);
  for (auto& x : s) x = bits::f32_to_f16(bits::f32_bits(u(rng)));
  return s;
}

float f16(uint16_t h) {
  return bits::f32_from_bits(bits::f16_to_f32(h));
}

void gptq_case(int nbits, int64_t group, bool act_order, int zero_offset, int64_t in = 256) {
  std::mt19937 rng(nbits * 100 + group + act_order);
  const int64_t out = 64, pack = 32 / nbits;
  const int64_t groups = (in + group - 1) / group;
  const uint32_t mask = (1u << nbits) - 1;
  std::vector<uint32_t> q(in * out), z(groups * out);  // q[i][j], z[g][j]
  for (auto& x : q) x = rng() & mask;
  // Stored zeros: z - zero_offset must stay in the field.
  for (auto& x : z) x = rng() & mask;
  std::vector<int32_t> g_idx(in);
  for (int64_t i = 0; i < in; ++i) g_idx[i] = static_cast<int32_t>(i / group);
  if (act_order) std::shuffle(g_idx.begin(), g_idx.end(), rng);
  const std::vector<uint16_t> scales = f16_scales(rng, groups * out);
  // Pack qweight [in / pack, out]: input row i goes to field i % pack of word row i / pack.
  std::vector<uint32_t> qweight(in / pack * out, 0), qzeros(groups * (out / pack), 0);
  for (int64_t i = 0; i < in; ++i)
    for (int64_t j = 0; j < out; ++j)
      qweight[(i / pack) * out + j] |= q[i * out + j] << (nbits * (i % pack));
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t j = 0; j < out; ++j)
      qzeros[g * (out / pack) + j / pack] |= z[g * out + j] << (nbits * (j % pack));
  std::vector<float> expect(out * in);
  for (int64_t j = 0; j < out; ++j)
    for (int64_t i = 0; i < in; ++i) {
      const int64_t g = g_idx[i];
      const float zz = static_cast<float>(z[g * out + j]) + zero_offset;
      expect[j * in + i] = (static_cast<float>(q[i * out + j]) - zz) * f16(scales[g * out + j]);
    }
  QuantView v;
  v.scheme = QuantScheme::kGptq;
  v.out = out;
  v.in = in;
  v.q = qweight.data();
  v.zeros = qzeros.data();
  v.scales = scales.data();
  v.scales_format = 1;
  v.g_idx = act_order ? g_idx.data() : nullptr;
  v.bits = nbits;
  v.group_size = group;
  v.groups = groups;
  v.zero_offset = zero_offset;
  check_all(v, expect);
}

TEST(DequantCpu, Gptq4Bit) {
  gptq_case(4, 32, false, 1);
}
TEST(DequantCpu, Gptq4BitActOrder) {
  gptq_case(4, 32, true, 1);
}
TEST(DequantCpu, Gptq8BitV2Zeros) {
  gptq_case(8, 64, false, 0);
}
TEST(DequantCpu, Gptq2BitOneGroup) {
  gptq_case(2, 256, false, 1);
}
TEST(DequantCpu, Gptq4BitRowsLongerThanAChunk) {  // 1280 inputs: three column chunks of 512
  gptq_case(4, 128, false, 1, 1280);
  gptq_case(4, 128, true, 1, 1280);
}

TEST(DequantCpu, GptqRejectsGroupIndexOutOfRange) {
  std::vector<uint32_t> qweight(32 / 8 * 8, 0), qzeros(1, 0);
  std::vector<uint16_t> scales(8, 0x3C00);
  std::vector<int32_t> g_idx(32, 0);
  g_idx[17] = 1;  // only group 0 exists
  QuantView v;
  v.scheme = QuantScheme::kGptq;
  v.out = 8;
  v.in = 32;
  v.q = qweight.data();
  v.zeros = qzeros.data();
  v.scales = scales.data();
  v.scales_format = 1;
  v.g_idx = g_idx.data();
  v.groups = 1;
  v.group_size = 32;
  std::vector<float> dst(8 * 32);
  DequantDst d{dst.data(), 0, 32, 0, 8, 0, 32};
  try {
    dequant_cpu(v, d);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("g_idx[17] = 1"), std::string::npos) << e.what();
  }
  v.g_idx = nullptr;
  v.groups = 2;  // 32 rows in groups of 32 make 1
  EXPECT_THROW(dequant_cpu(v, d), ShapeError);
  v.groups = 1;
  d.cols = 33;  // window past the weight
  EXPECT_THROW(dequant_cpu(v, d), ShapeError);
}

TEST(DequantCpu, Awq) {
  std::mt19937 rng(7);
  const int64_t out = 64, in = 128, group = 32, groups = in / group;
  std::vector<uint32_t> q(in * out), z(groups * out);
  for (auto& x : q) x = rng() & 15;
  for (auto& x : z) x = rng() & 15;
  const std::vector<uint16_t> scales = f16_scales(rng, groups * out);
  // AWQ packs output columns 8c + order[k] into nibble k, order = 0 2 4 6 1 3 5 7.
  const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  std::vector<uint32_t> qweight(in * (out / 8), 0), qzeros(groups * (out / 8), 0);
  for (int64_t i = 0; i < in; ++i)
    for (int64_t c = 0; c < out / 8; ++c)
      for (int k = 0; k < 8; ++k)
        qweight[i * (out / 8) + c] |= q[i * out + 8 * c + order[k]] << (4 * k);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t c = 0; c < out / 8; ++c)
      for (int k = 0; k < 8; ++k)
        qzeros[g * (out / 8) + c] |= z[g * out + 8 * c + order[k]] << (4 * k);
  std::vector<float> expect(out * in);
  for (int64_t j = 0; j < out; ++j)
    for (int64_t i = 0; i < in; ++i) {
      const int64_t g = i / group;
      expect[j * in + i] =
          (static_cast<float>(q[i * out + j]) - static_cast<float>(z[g * out + j])) *
          f16(scales[g * out + j]);
    }
  QuantView v;
  v.scheme = QuantScheme::kAwq;
  v.out = out;
  v.in = in;
  v.q = qweight.data();
  v.zeros = qzeros.data();
  v.scales = scales.data();
  v.scales_format = 1;
  v.group_size = group;
  v.groups = groups;
  check_all(v, expect);
}

void bnb4_case(bool nested, int64_t out, int64_t in) {
  std::mt19937 rng(nested ? 11 : 12);
  const int64_t n = out * in, block = 64, blocks = (n + block - 1) / block;
  std::vector<float> code(16);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& c : code) c = u(rng);
  std::vector<uint8_t> codes(n);
  for (auto& c : codes) c = rng() & 15;
  std::vector<uint8_t> packed((n + 1) / 2, 0);
  for (int64_t k = 0; k < n; ++k) packed[k / 2] |= k % 2 == 0 ? codes[k] << 4 : codes[k];
  std::vector<float> absmax(blocks), nested_code(256), nested_absmax;
  std::vector<uint8_t> qabsmax(blocks);
  const float offset = 0.125f;
  const int64_t nested_block = 4;
  if (nested) {
    for (auto& c : nested_code) c = u(rng);
    nested_absmax.resize((blocks + nested_block - 1) / nested_block);
    for (auto& a : nested_absmax) a = 0.5f + u(rng) * 0.25f;
    for (int64_t b = 0; b < blocks; ++b) {
      qabsmax[b] = rng() & 255;
      absmax[b] = nested_code[qabsmax[b]] * nested_absmax[b / nested_block] + offset;
    }
  } else {
    for (auto& a : absmax) a = 0.5f + u(rng);
  }
  std::vector<float> expect(n);
  for (int64_t k = 0; k < n; ++k) expect[k] = code[codes[k]] * absmax[k / block];
  QuantView v;
  v.scheme = QuantScheme::kBnb4;
  v.out = out;
  v.in = in;
  v.q = packed.data();
  v.code = code.data();
  v.group_size = block;
  if (nested) {
    v.scales = qabsmax.data();
    v.nested_scales = nested_absmax.data();
    v.nested_code = nested_code.data();
    v.nested_block = nested_block;
    v.offset = offset;
  } else {
    v.scales = absmax.data();
  }
  check_all(v, expect);
}

TEST(DequantCpu, Bnb4) {
  bnb4_case(false, 48, 80);
}
TEST(DequantCpu, Bnb4DoubleQuant) {
  bnb4_case(true, 48, 80);
}
TEST(DequantCpu, Bnb4OddShape) {
  bnb4_case(false, 13, 37);
}  // blocks span rows, odd bytes

TEST(DequantCpu, Bnb8) {
  std::mt19937 rng(3);
  const int64_t out = 24, in = 40;
  std::vector<int8_t> w(out * in);
  for (auto& x : w) x = static_cast<int8_t>(rng() & 255);
  std::vector<float> scb(out);
  for (auto& s : scb) s = 0.01f * (1 + rng() % 1000);
  std::vector<float> expect(out * in);
  for (int64_t j = 0; j < out; ++j)
    for (int64_t i = 0; i < in; ++i)
      expect[j * in + i] = static_cast<float>(w[j * in + i]) * scb[j] * 7.874015718698502e-3f;
  QuantView v;
  v.scheme = QuantScheme::kBnb8;
  v.out = out;
  v.in = in;
  v.q = w.data();
  v.scales = scb.data();
  check_all(v, expect);
}

// e4m3fn by its definition: 2^(e - 7) * (1 + m / 8), subnormals m / 8 * 2^-6, S.1111.111 NaN.
float e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float mag = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1 + m / 8.0f, e - 7);
  if (e == 15 && m == 7) mag = NAN;
  return (b & 0x80) ? -mag : mag;
}

TEST(DequantCpu, Fp8Blocks) {
  std::mt19937 rng(9);
  const int64_t out = 40, in = 72, bo = 16, bi = 32;  // partial blocks at both ends
  const int64_t so = (out + bo - 1) / bo, si = (in + bi - 1) / bi;
  std::vector<uint8_t> w(out * in);
  for (auto& x : w) x = rng() & 255;
  std::vector<uint16_t> s(so * si);  // bf16 scales
  for (auto& x : s) x = bits::f32_to_bf16(bits::f32_bits(0.001f * (1 + rng() % 100)));
  std::vector<float> expect(out * in);
  for (int64_t j = 0; j < out; ++j)
    for (int64_t i = 0; i < in; ++i)
      expect[j * in + i] =
          e4m3(w[j * in + i]) * bits::f32_from_bits(bits::bf16_to_f32(s[(j / bo) * si + i / bi]));
  QuantView v;
  v.scheme = QuantScheme::kFp8;
  v.out = out;
  v.in = in;
  v.q = w.data();
  v.scales = s.data();
  v.scales_format = 2;
  v.group_size = bo;
  v.block_in = bi;
  check_all(v, expect);
}

}  // namespace
}  // namespace metaload
