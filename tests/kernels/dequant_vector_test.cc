// The AVX2 dequantization kernels against the portable ones, bit for bit: every scheme and bit
// width, every scales format and output format, on random windows (odd offsets and sizes, across
// column chunks), with raw random codes and scales that include NaN, infinities and denormals.
// The portable kernels are checked against independent references in dequant_test.cc, so a
// difference here is a broken vector path. Skipped where the CPU has no AVX2 / F16C.
#include <gtest/gtest.h>

#include <atomic>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/convert_bits.h"
#include "kernels/dequant.h"
#include "kernels/dequant_avx2.h"

namespace metaload {
namespace {

// Restores the default (vector kernels on) however a test ends.
struct VectorKernels {
  explicit VectorKernels(bool on) { set_dequant_vector_kernels(on); }
  ~VectorKernels() { set_dequant_vector_kernels(true); }
};

bool vector_cpu() {
  VectorKernels on(true);
  return dequant_vector_kernels();
}

// Random bits, and floats of the scales format where about one in eight is special: NaN (with
// a payload), +-inf, a denormal, zero or a huge value.
struct Data {
  std::mt19937 rng;
  std::vector<uint32_t> words;
  explicit Data(uint32_t seed) : rng(seed), words(1 << 18) {
    for (auto& w : words) w = rng();
  }
  uint32_t special32() {
    // 0x7FFFFFFF: a NaN whose rounding to bf16 without the NaN patch would carry into -0.
    const uint32_t s[] = {0x7FC00001u, 0xFFA00000u, 0x7F800000u, 0xFF800000u, 0x00000003u,
                          0x80400000u, 0x00000000u, 0x7F7FFFFFu, 0x7FFFFFFFu};
    return s[rng() % 9];
  }
  // n scales in format fmt, one in 8 a special value (NaN, inf, denormal...) unless `finite`.
  std::vector<unsigned char> scales(int fmt, size_t n, bool finite = false) {
    std::vector<unsigned char> b(n * 4 + 4);
    std::uniform_real_distribution<float> u(-0.05f, 0.05f);
    for (size_t k = 0; k < n; ++k) {
      const uint32_t f = !finite && rng() % 8 == 0 ? special32() : bits::f32_bits(u(rng));
      if (fmt == 0) {
        std::memcpy(b.data() + 4 * k, &f, 4);
      } else {
        const uint16_t h = fmt == 1 ? bits::f32_to_f16(f) : bits::f32_to_bf16(f);
        std::memcpy(b.data() + 2 * k, &h, 2);
      }
    }
    return b;
  }
};

std::vector<unsigned char> run(const QuantView& v, const DequantDst& d0, bool vec) {
  VectorKernels mode(vec);
  const int es = d0.format == 0 ? 4 : 2;
  std::vector<unsigned char> out(static_cast<size_t>(d0.rows * d0.ld * es) + 1, 0xA5);
  DequantDst d = d0;
  d.data = out.data() + 1;  // misaligned on purpose
  dequant_cpu(v, d);
  return out;
}

bool is_nan(const unsigned char* p, int fmt) {
  uint32_t x = 0;
  std::memcpy(&x, p, fmt == 0 ? 4 : 2);
  return fmt == 0 ? (x & 0x7FFFFFFFu) > 0x7F800000u
                  : (fmt == 1 ? (x & 0x7FFFu) > 0x7C00u : (x & 0x7FFFu) > 0x7F80u);
}

// The first element (of the buffers run() fills) whose bits differ, or -1. A NaN matches any NaN:
// which operand's NaN a multiply of two NaNs returns follows the instruction's operand order,
// which the compiler picks for the scalar code (IEEE leaves sign and payload open, and the CUDA
// kernels return their canonical NaN). Every other value must match bit for bit.
int64_t first_difference(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b,
                         int fmt) {
  const size_t es = fmt == 0 ? 4 : 2;
  if (a.size() != b.size() || a[0] != b[0]) return 0;
  for (size_t k = 1; k + es <= a.size(); k += es) {
    if (std::memcmp(&a[k], &b[k], es) != 0 && !(is_nan(&a[k], fmt) && is_nan(&b[k], fmt))) {
      return static_cast<int64_t>((k - 1) / es);
    }
  }
  return -1;
}

// Windows of `v` in every output format, vector against portable; returns how many of them have
// a vector kernel (each test expects some: it cannot pass by never reaching one).
int compare(const QuantView& v, std::mt19937& rng, const std::string& what) {
  int vector = 0;
  for (int fmt = 0; fmt < 3; ++fmt) {
    for (int w = 0; w < 8; ++w) {
      DequantDst d;
      d.format = fmt;
      if (w == 0) {
        d.rows = v.out;
        d.cols = v.in;
      } else {
        d.row0 = rng() % v.out;
        d.rows = 1 + rng() % (v.out - d.row0);
        // Half the windows start on a multiple of 16 columns (GPTQ's word paths need one).
        d.col0 = w % 2 ? (rng() % v.in) / 16 * 16 : rng() % v.in;
        d.cols = 1 + rng() % (v.in - d.col0);
      }
      d.ld = d.cols + (w % 3);  // rows not packed too
      vector += dq_avx2::pick(v, d) != nullptr;
      const std::vector<unsigned char> a = run(v, d, true), b = run(v, d, false);
      const int64_t bad = first_difference(a, b, fmt);
      EXPECT_LT(bad, 0) << what << " fmt " << fmt << " window rows " << d.row0 << "+" << d.rows
                        << " cols " << d.col0 << "+" << d.cols << ": element " << bad / d.ld << ", "
                        << bad % d.ld << " differs";
      if (bad >= 0) return vector;
    }
  }
  return vector;
}

// A GPTQ / AWQ weight [out, in] in groups of `group` over `data`'s words (qzeros from word
// `zeros_at`) with `scales` in format sf.
QuantView grouped_view(QuantScheme scheme, int64_t out, int64_t in, int64_t group, const Data& data,
                       size_t zeros_at, const std::vector<unsigned char>& scales, int sf) {
  QuantView v;
  v.scheme = scheme;
  v.out = out;
  v.in = in;
  v.q = data.words.data();
  v.zeros = data.words.data() + zeros_at;
  v.scales = scales.data();
  v.scales_format = sf;
  v.group_size = group;
  v.groups = (in + group - 1) / group;
  return v;
}

TEST(DequantVector, Gptq) {
  if (!vector_cpu()) GTEST_SKIP() << "no AVX2 / F16C";
  int n = 0;
  Data data(1);
  const int64_t out = 80, in = 1056;  // three column chunks; 80 rows: 8-row blocks and a rest
  for (int bits : {2, 4, 8}) {
    for (int64_t group : {32, 48, 64, 128, 1056}) {  // 64, 128: gptq4_lut's 64-input steps
      for (bool act : {false, true}) {
        for (int sf = 0; sf < 6; ++sf) {
          // sf 3..5: act order with finite scales, the kernel's path without NaN patches.
          const bool finite = sf >= 3;
          if (finite && !act) continue;
          const int64_t groups = (in + group - 1) / group;
          std::vector<int32_t> g_idx(in);
          for (int64_t i = 0; i < in; ++i) g_idx[i] = static_cast<int32_t>(i / group);
          if (act) std::shuffle(g_idx.begin(), g_idx.end(), data.rng);
          const std::vector<unsigned char> scales = data.scales(sf % 3, groups * out, finite);
          QuantView v =
              grouped_view(QuantScheme::kGptq, out, in, group, data, 1000, scales, sf % 3);
          v.g_idx = act ? g_idx.data() : nullptr;
          v.bits = bits;
          v.zero_offset = act ? 0 : 1;
          n += compare(v, data.rng,
                       "gptq " + std::to_string(bits) + " bits group " + std::to_string(group) +
                           (act ? " act-order" : "") + " scales " + std::to_string(sf % 3) +
                           (finite ? " finite" : ""));
        }
      }
    }
  }
  EXPECT_GT(n, 0) << "no case reached a vector kernel";
}

// Act order with more groups than L1 holds tables for (288 > 256, which took gptq4_act's per-row
// gathers before): gptq4_act_rows8's blocks, and its rows off the blocks.
TEST(DequantVector, GptqActOrderManyGroups) {
  if (!vector_cpu()) GTEST_SKIP() << "no AVX2 / F16C";
  int n = 0;
  Data data(3);
  const int64_t out = 32, in = 2304, group = 8, groups = in / group;
  std::vector<int32_t> g_idx(in);
  for (int64_t i = 0; i < in; ++i) g_idx[i] = static_cast<int32_t>(i / group);
  std::shuffle(g_idx.begin(), g_idx.end(), data.rng);
  for (int sf = 0; sf < 3; ++sf) {
    for (bool finite : {false, true}) {
      const std::vector<unsigned char> scales = data.scales(sf, groups * out, finite);
      QuantView v = grouped_view(QuantScheme::kGptq, out, in, group, data, 1000, scales, sf);
      v.g_idx = g_idx.data();
      v.bits = 4;
      n += compare(
          v, data.rng,
          "gptq act-order 288 groups scales " + std::to_string(sf) + (finite ? " finite" : ""));
    }
  }
  EXPECT_GT(n, 0) << "no case reached a vector kernel";
}

TEST(DequantVector, Awq) {
  if (!vector_cpu()) GTEST_SKIP() << "no AVX2 / F16C";
  int n = 0;
  Data data(2);
  // 200 rows: a 128-row block, a lone 64-row one and 8-row words after them (awq4_lut or
  // awq_rows64, and awq_rows8); finite scales take the kernels' path without NaN patches.
  const int64_t out = 200, in = 600;
  for (int64_t group : {32, 40, 64, 128, 600}) {  // 64, 128: awq4_lut's 64-input steps
    for (int sf = 0; sf < 3; ++sf) {
      for (bool finite : {false, true}) {
        const int64_t groups = (in + group - 1) / group;
        const std::vector<unsigned char> scales = data.scales(sf, groups * out, finite);
        const QuantView v = grouped_view(QuantScheme::kAwq, out, in, group, data, 7, scales, sf);
        n += compare(v, data.rng,
                     "awq group " + std::to_string(group) + " scales " + std::to_string(sf) +
                         (finite ? " finite" : ""));
      }
    }
  }
  EXPECT_GT(n, 0) << "no case reached a vector kernel";
}

// NF4 and FP4 differ only in the 16-entry code table (the kernel's input); the table here has
// specials too.
TEST(DequantVector, Bnb4) {
  if (!vector_cpu()) GTEST_SKIP() << "no AVX2 / F16C";
  int n = 0;
  Data data(3);
  for (bool nested : {false, true}) {
    for (int64_t shape : {0, 1}) {
      const int64_t out = shape ? 37 : 64, in = shape ? 531 : 1024, block = shape ? 64 : 128;
      const int64_t blocks = (out * in + block - 1) / block;
      const std::vector<unsigned char> code = data.scales(0, 16), ncode = data.scales(0, 256);
      const std::vector<unsigned char> absmax = data.scales(0, blocks);
      const std::vector<unsigned char> nabs = data.scales(0, blocks / 4 + 1);
      QuantView v;
      v.scheme = QuantScheme::kBnb4;
      v.out = out;
      v.in = in;
      v.q = data.words.data();
      v.code = code.data();
      v.group_size = block;
      v.scales = nested ? static_cast<const void*>(data.words.data() + 5) : absmax.data();
      if (nested) {
        v.nested_scales = nabs.data();
        v.nested_code = ncode.data();
        v.nested_block = 4;
        v.offset = 0.25f;
      }
      n += compare(v, data.rng,
                   std::string("bnb4") + (nested ? " nested" : "") + " shape " +
                       std::to_string(out) + "x" + std::to_string(in));
    }
  }
  EXPECT_GT(n, 0) << "no case reached a vector kernel";
}

TEST(DequantVector, Bnb8AndFp8) {
  if (!vector_cpu()) GTEST_SKIP() << "no AVX2 / F16C";
  int n = 0;
  Data data(4);
  const int64_t out = 45, in = 1100;
  for (int sf = 0; sf < 3; ++sf) {
    const std::vector<unsigned char> scb = data.scales(sf, out);
    QuantView v;
    v.scheme = QuantScheme::kBnb8;
    v.out = out;
    v.in = in;
    v.q = data.words.data();
    v.scales = scb.data();
    v.scales_format = sf;
    n += compare(v, data.rng, "bnb8 scales " + std::to_string(sf));
    if (sf == 0) {  // every scale the NaN 0x7FFFFFFF: rounded without the NaN patch it is -0
      const std::vector<uint32_t> nan(out, 0x7FFFFFFFu);
      v.scales = nan.data();
      n += compare(v, data.rng, "bnb8 NaN scales");
    }
    const std::vector<unsigned char> s = data.scales(sf, 3 * 28);  // blocks of 16 x 40
    v.scheme = QuantScheme::kFp8;                                  // every byte, NaN codes included
    v.scales = s.data();
    v.group_size = 16;
    v.block_in = 40;
    n += compare(v, data.rng, "fp8 scales " + std::to_string(sf));
    if (sf != 1) {  // scales whose 256-fold overflows: the kernel's unfolded path, finite outputs
      std::vector<unsigned char> big(3 * 28 * 4);
      for (size_t k = 0; k < 3 * 28; ++k) {
        const uint32_t f = 0x7C000000u;  // 2^121
        const uint16_t h = bits::f32_to_bf16(f);
        if (sf == 0) std::memcpy(big.data() + 4 * k, &f, 4);
        if (sf == 2) std::memcpy(big.data() + 2 * k, &h, 2);
      }
      v.scales = big.data();
      n += compare(v, data.rng, "fp8 scales " + std::to_string(sf) + " of 2^121");
    }
  }
  EXPECT_GT(n, 0) << "no case reached a vector kernel";
}

TEST(DequantVector, CompressedTensors) {
  if (!vector_cpu()) GTEST_SKIP() << "no AVX2 / F16C";
  int n = 0;
  Data data(5);
  const int64_t out = 41, in = 1064;
  for (int bits : {3, 4, 8}) {
    for (bool symmetric : {true, false}) {
      for (int64_t group : {32, 56, 128}) {
        const int64_t groups = (in + group - 1) / group;
        const std::vector<unsigned char> scales = data.scales(2, out * groups);
        QuantView v;
        v.scheme = QuantScheme::kCtInt;
        v.out = out;
        v.in = in;
        v.bits = bits;
        v.q = data.words.data();
        v.zeros = symmetric ? nullptr : data.words.data() + 3;
        v.scales = scales.data();
        v.scales_format = 2;
        v.group_size = group;
        v.groups = groups;
        n += compare(v, data.rng,
                     "ct " + std::to_string(bits) + " bits" + (symmetric ? "" : " asymmetric") +
                         " group " + std::to_string(group));
      }
    }
  }
  const int64_t groups = (in + 15) / 16;  // a partial last group
  QuantView v;
  v.scheme = QuantScheme::kNvfp4;
  v.out = out;
  v.in = in;
  v.q = data.words.data();
  v.scales = data.words.data() + 9;  // e4m3 bytes, NaN included
  v.group_size = 16;
  v.groups = groups;
  for (uint32_t g : {0x42C80000u, 0x00000005u, 0x7F800000u}) {  // 100, a denormal, inf
    v.global_scale = &g;
    n += compare(v, data.rng, "nvfp4 global " + std::to_string(g));
  }
  EXPECT_GT(n, 0) << "no case reached a vector kernel";
}

// An AWQ weight [296, 512] (groups of 128) over `data`'s words with scales in `fmt`, for the
// threaded entry's tests; d1 a bf16 window of rows, d2 an f32 one with a column offset.
QuantView awq_view(const Data& data, const std::vector<unsigned char>& scales, int fmt) {
  return grouped_view(QuantScheme::kAwq, 296, 512, 128, data, 11, scales, fmt);
}
const DequantDst d1{nullptr, 2, 512, 3, 291, 0, 512}, d2{nullptr, 0, 100, 8, 200, 37, 100};

// The threaded entry (a load's) writes what dequant_cpu writes, and asks `touch` for every
// output byte of every job exactly once.
TEST(DequantVector, JobsOnThreads) {
  Data data(6);
  const std::vector<unsigned char> scales = data.scales(1, 4 * 296);
  const QuantView v = awq_view(data, scales, 1);
  const std::vector<unsigned char> want1 = run(v, d1, true), want2 = run(v, d2, true);
  for (int threads : {1, 3}) {
    std::vector<unsigned char> got1(want1.size(), 0xA5), got2(want2.size(), 0xA5);
    std::vector<int> touched1(got1.size(), 0), touched2(got2.size(), 0);
    DequantDst a = d1, b = d2;
    a.data = got1.data() + 1;
    b.data = got2.data() + 1;
    dequant_cpu_jobs({{v, a}, {v, b}}, threads, [&](void* p, size_t n) {
      auto* c = static_cast<unsigned char*>(p);
      const bool first = c >= got1.data() && c < got1.data() + got1.size();
      std::vector<int>& t = first ? touched1 : touched2;
      const size_t at = c - (first ? got1.data() : got2.data());
      for (size_t k = at; k < at + n; ++k) ++t[k];
    });
    EXPECT_EQ(got1, want1) << threads << " threads";
    EXPECT_EQ(got2, want2) << threads << " threads";
    for (size_t k = 1; k < got1.size(); ++k) ASSERT_EQ(touched1[k], 1) << "byte " << k;
    for (size_t k = 1; k < got2.size(); ++k) ASSERT_EQ(touched2[k], 1) << "byte " << k;
  }
}

// With a sink, each tile goes through a buffer of its thread's and the sink puts it in place
// (a page copier, in a load): the same bytes, every output byte handed over exactly once.
TEST(DequantVector, JobsThroughASink) {
  Data data(8);
  const std::vector<unsigned char> scales = data.scales(2, 4 * 296);
  const QuantView v = awq_view(data, scales, 2);
  const std::vector<unsigned char> want1 = run(v, d1, true), want2 = run(v, d2, true);
  for (int threads : {1, 3}) {
    std::vector<unsigned char> got1(want1.size(), 0xA5), got2(want2.size(), 0xA5);
    std::vector<std::atomic<int>> handed(got1.size() + got2.size());
    DequantDst a = d1, b = d2;
    a.data = got1.data() + 1;
    b.data = got2.data() + 1;
    dequant_cpu_jobs({{v, a}, {v, b}}, threads, nullptr, [&](void* dst, const void* src, size_t n) {
      auto* c = static_cast<unsigned char*>(dst);
      const bool first = c >= got1.data() && c < got1.data() + got1.size();
      const size_t at = c - (first ? got1.data() : got2.data());
      for (size_t k = 0; k < n; ++k) ++handed[(first ? 0 : got1.size()) + at + k];
      std::memcpy(dst, src, n);
    });
    EXPECT_EQ(got1, want1) << threads << " threads";
    EXPECT_EQ(got2, want2) << threads << " threads";
    for (size_t k = 1; k < got1.size(); ++k) ASSERT_EQ(handed[k].load(), 1) << "byte " << k;
    for (size_t k = 1; k < got2.size(); ++k)
      ASSERT_EQ(handed[got1.size() + k].load(), 1) << "byte " << k;
  }
}

// The vector output conversion against convert_bits.h on special and random f32 bit patterns
// (every NaN payload class, denormals, rounding ties, overflow).
TEST(DequantVector, FlushRoundsAsConvertBits) {
  if (!vector_cpu()) GTEST_SKIP() << "no AVX2 / F16C";
  std::mt19937 rng(7);
  std::vector<uint32_t> x = {0x7FC00000u, 0x7F800001u, 0xFFBFFFFFu, 0x7F800000u, 0xFF800000u,
                             0x00000001u, 0x80000001u, 0x33800000u, 0x33000000u, 0x387FE000u,
                             0x38800000u, 0x477FE000u, 0x477FF000u, 0x477FEFFFu, 0x3F808000u,
                             0x3F818000u, 0x7F7FFFFFu, 0x00800000u, 0x00000000u, 0x80000000u};
  for (int k = 0; k < (1 << 20); ++k) x.push_back(rng());
  std::vector<float> f(x.size());
  std::memcpy(f.data(), x.data(), x.size() * 4);
  for (int fmt = 1; fmt < 3; ++fmt) {
    std::vector<uint16_t> got(x.size());
    dq_avx2::flush_for_test(fmt, got.data(), f.data(), static_cast<int64_t>(f.size()));
    for (size_t k = 0; k < x.size(); ++k) {
      const uint16_t want = fmt == 1 ? bits::f32_to_f16(x[k]) : bits::f32_to_bf16(x[k]);
      ASSERT_EQ(got[k], want) << "fmt " << fmt << " f32 bits 0x" << std::hex << x[k];
    }
  }
}

}  // namespace
}  // namespace metaload
