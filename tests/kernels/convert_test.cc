// The CPU conversion kernels against libtorch's own Tensor.to(): every 16-bit pattern exhaustively,
// and millions of float32 patterns (random bits plus every edge: NaNs, infinities, zeros,
// subnormals, rounding ties, overflow thresholds), bit for bit.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "base/torch_compat.h"
#include "kernels/convert.h"
#include "kernels/convert_bits.h"
#include "loader/engine/engine_device.h"

namespace metaload {
namespace {

const FloatFormat kFormats[] = {FloatFormat::kF32, FloatFormat::kF16, FloatFormat::kBF16};

at::ScalarType torch_type(FloatFormat f) {
  switch (f) {
    case FloatFormat::kF32:
      return at::kFloat;
    case FloatFormat::kF16:
      return at::kHalf;
    case FloatFormat::kBF16:
      return at::kBFloat16;
  }
  return at::kFloat;
}

at::ScalarType bits_type(FloatFormat f) {
  return f == FloatFormat::kF32 ? at::kInt : at::kShort;
}

// What torch writes for f32 -> bf16 NaN depends on the kernel it dispatches to: 0xFFFF from its
// AVX2/AVX512 kernels (every x86-64 CPU here), 0x7FC0 from its scalar kernel
// (ATEN_CPU_CAPABILITY=default). Ours matches the vectorized one; with the scalar one only NaN-ness
// can be compared.
bool torch_f32_bf16_nan_is_ffff() {
  at::Tensor t = at::full({64}, NAN, at::kFloat).to(at::kBFloat16).view(at::kShort);
  return static_cast<uint16_t>(t[0].item<int16_t>()) == 0xFFFF;
}

bool is_nan_bits(uint32_t v, FloatFormat f) {
  if (f == FloatFormat::kF32) return (v & 0x7FFFFFFFu) > 0x7F800000u;
  if (f == FloatFormat::kF16) return (v & 0x7FFFu) > 0x7C00u;
  return (v & 0x7FFFu) > 0x7F80u;
}

// Converts `src` (raw bits of format `from`) with our kernel and with torch; compares bit for bit.
void expect_same_as_torch(const at::Tensor& src_bits, FloatFormat from, FloatFormat to) {
  const int64_t n = src_bits.numel();
  at::Tensor src = src_bits.view(torch_type(from));
  at::Tensor want = src.to(torch_type(to)).contiguous().view(bits_type(to));
  at::Tensor got = at::empty({n}, at::TensorOptions().dtype(bits_type(to)));
  convert_cpu(src.data_ptr(), from, got.data_ptr(), to, static_cast<size_t>(n));
  // Exact NaN bits where torch's casts keep the scalar rules (convert_bits.h); elsewhere they
  // may vectorize some directions with other NaN bits, and there only NaN-ness is compared.
  const bool exact_nan =
      compat::kCpuCastNanBitsAreScalar &&
      (!(from == FloatFormat::kF32 && to == FloatFormat::kBF16) || torch_f32_bf16_nan_is_ffff());
  const size_t width = float_format_size(to);
  auto bits_at = [&](const at::Tensor& t, int64_t i) -> uint32_t {
    uint32_t v = 0;
    std::memcpy(&v, static_cast<const char*>(t.data_ptr()) + i * width, width);
    return v;
  };
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t w = bits_at(want, i), g = bits_at(got, i);
    if (w == g) continue;
    if (!exact_nan && is_nan_bits(w, to) && is_nan_bits(g, to)) continue;
    if (++mismatches <= 5) {
      uint32_t s = 0;
      std::memcpy(&s, static_cast<const char*>(src.data_ptr()) + i * float_format_size(from),
                  float_format_size(from));
      ADD_FAILURE() << float_format_name(from) << " -> " << float_format_name(to) << " of 0x"
                    << std::hex << s << ": torch 0x" << w << ", ours 0x" << g;
    }
  }
  EXPECT_EQ(mismatches, 0) << float_format_name(from) << " -> " << float_format_name(to);
}

TEST(ConvertTest, EverySixteenBitPatternMatchesTorch) {
  at::Tensor all = at::arange(0, 65536, at::kInt).to(at::kShort);  // wraps to every pattern
  for (FloatFormat from : {FloatFormat::kF16, FloatFormat::kBF16}) {
    for (FloatFormat to : kFormats) expect_same_as_torch(all, from, to);
  }
}

std::vector<uint32_t> float32_edge_patterns() {
  std::vector<uint32_t> v = {
      0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  // zeros, infinities
      0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0xFFFFFFFF,
      0x7FA12345,                                      // NaNs: quiet, signalling, payloads
      0x00000001, 0x807FFFFF, 0x00400000, 0x00800000,  // f32 subnormals, smallest normal
      0x7F7FFFFF, 0xFF7FFFFF,                          // largest finite
      0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000, 0xC77FF000,  // f16 overflow
      0x38800000, 0x387FFFFF, 0x387FF000, 0x33800000, 0x33000000, 0x33000001, 0x32FFFFFF,
      0x33C00000, 0x33400000,  // f16 subnormal range and its ties
      0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF, 0x7F7F8000, 0x7F7F7FFF,  // bf16 ties
  };
  // Every f16 rounding tie and its neighbours across the whole f16 range.
  for (uint32_t e = 0x33000000; e < 0x47800000; e += 0x00400000 + 0x1357) {
    const uint32_t base = e & ~0x1FFFu;
    for (uint32_t d : {0x0FFFu, 0x1000u, 0x1001u, 0x2FFFu, 0x3000u, 0x3001u}) v.push_back(base + d);
  }
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(v[i] ^ 0x80000000u);  // both signs
  return v;
}

TEST(ConvertTest, Float32EdgesAndRandomBitsMatchTorch) {
  std::vector<uint32_t> v = float32_edge_patterns();
  std::mt19937 rng(1234);
  for (int i = 0; i < (1 << 22); ++i) v.push_back(rng());
  // Values in the f16 range too, which random bits rarely hit.
  std::uniform_real_distribution<float> small(-70000.0f, 70000.0f);
  for (int i = 0; i < (1 << 20); ++i) {
    const float f = small(rng) * std::ldexp(1.0f, -static_cast<int>(rng() % 40));
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v.push_back(u);
  }
  at::Tensor t = at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kInt).clone();
  for (FloatFormat to : kFormats) expect_same_as_torch(t, FloatFormat::kF32, to);
}

TEST(ConvertTest, OddLengthsAndUnalignedPointersMatchContiguousResult) {
  // Vector loops have tails and misaligned starts; every length 0..70 and offset 0..3 elements.
  std::mt19937 rng(7);
  std::vector<uint32_t> src(200);
  for (uint32_t& x : src) x = rng();
  for (FloatFormat from : kFormats) {
    for (FloatFormat to : kFormats) {
      const size_t in = float_format_size(from), out = float_format_size(to);
      for (size_t n = 0; n <= 70; ++n) {
        for (size_t skew = 0; skew < 3; ++skew) {
          std::vector<unsigned char> dst(n * out + 8, 0xAB), ref(n * out);
          const unsigned char* s = reinterpret_cast<const unsigned char*>(src.data()) + skew;
          convert_cpu(s, from, dst.data() + 1, to, n);
          for (size_t i = 0; i < n; ++i) convert_cpu(s + i * in, from, ref.data() + i * out, to, 1);
          ASSERT_EQ(std::memcmp(dst.data() + 1, ref.data(), n * out), 0) << n << " " << skew;
          EXPECT_EQ(dst[0], 0xAB);  // nothing written outside
          EXPECT_EQ(dst[1 + n * out], 0xAB);
        }
      }
    }
  }
}

TEST(ConvertTest, TwoDimensionalGatherEqualsSliceThenConvert) {
  // A dim-1 slice: 37 rows, columns [24, 24 + 40) of 104, pitches in bytes.
  at::Tensor full = at::randn({37, 104});
  full.index_put_({5, 7}, NAN);
  full.index_put_({9, 30}, INFINITY);
  for (FloatFormat from : kFormats) {
    at::Tensor src = full.to(torch_type(from));
    for (FloatFormat to : kFormats) {
      at::Tensor want = src.slice(1, 24, 64).to(torch_type(to)).contiguous();
      at::Tensor got = at::empty({37, 40}, torch_type(to));
      const size_t in = float_format_size(from), out = float_format_size(to);
      convert_cpu_2d(static_cast<char*>(src.data_ptr()) + 24 * in, 104 * in, from, got.data_ptr(),
                     40 * out, to, 37, 40);
      EXPECT_TRUE(at::equal(got.view(bits_type(to)), want.view(bits_type(to))))
          << float_format_name(from) << " -> " << float_format_name(to);
    }
  }
}

TEST(ConvertTest, DisjointChunksOnManyThreadsEqualOneCall) {
  std::mt19937 rng(99);
  const size_t n = 1 << 20;
  std::vector<uint32_t> src(n);
  for (uint32_t& x : src) x = rng();
  std::vector<uint16_t> one(n), many(n);
  convert_cpu(src.data(), FloatFormat::kF32, one.data(), FloatFormat::kBF16, n);
  std::vector<std::thread> threads;
  const size_t chunk = 4099;  // odd, so chunks start misaligned
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t c = t * chunk; c < n; c += 4 * chunk) {
        convert_cpu(src.data() + c, FloatFormat::kF32, many.data() + c, FloatFormat::kBF16,
                    std::min(chunk, n - c));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(one, many);
}

TEST(ConvertTest, FormatNames) {
  FloatFormat f;
  EXPECT_TRUE(parse_float_format("BF16", &f));
  EXPECT_EQ(f, FloatFormat::kBF16);
  EXPECT_TRUE(parse_float_format("F16", &f));
  EXPECT_EQ(f, FloatFormat::kF16);
  EXPECT_TRUE(parse_float_format("F32", &f));
  EXPECT_EQ(f, FloatFormat::kF32);
  EXPECT_FALSE(parse_float_format("F64", &f));
  EXPECT_FALSE(parse_float_format("bf16", &f));
  EXPECT_STREQ(float_format_name(FloatFormat::kBF16), "BF16");
  EXPECT_EQ(float_format_size(FloatFormat::kF32), 4u);
}

TEST(ConvertTest, CudaLaunchWithoutGpuIsATypedError) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU exists: covered by convert_cuda_test";
  std::vector<uint32_t> a(16), b(16);
  try {
    convert_cuda_2d(a.data(), 64, FloatFormat::kF32, b.data(), 32, FloatFormat::kBF16, 1, 16,
                    nullptr);
    FAIL() << "no error";
  } catch (const ConversionError& e) {
    EXPECT_NE(std::string(e.what()).find("[metaload.ConversionError] CUDA conversion F32 -> BF16"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace metaload
