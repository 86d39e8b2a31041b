// The CUDA conversion kernels against the CPU kernels (which convert_test checks against torch):
// the same bits for every 16-bit pattern and millions of float32 patterns, through the vector path
// (aligned) and the any-alignment path, 1D and 2D. Skipped where there is no GPU; tools/gpu_check
// runs it where there is one.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/convert.h"
#include "loader/engine/engine_device.h"

namespace metaload {
namespace {

const FloatFormat kFormats[] = {FloatFormat::kF32, FloatFormat::kF16, FloatFormat::kBF16};

class ConvertCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    dev_ = make_cuda_device_ops(0);
    stream_ = dev_->create_stream();
  }
  void TearDown() override {
    if (dev_) dev_->destroy_stream(stream_);
  }

  // Converts bytes `src` (n elements of `from`, starting `skew` bytes into the device buffers)
  // on the device; returns the result bytes.
  std::vector<unsigned char> on_device(const std::vector<unsigned char>& src, FloatFormat from,
                                       FloatFormat to, size_t rows, size_t cols, size_t src_pitch,
                                       size_t dst_pitch, size_t skew) {
    const size_t src_bytes = src.size();
    const size_t dst_bytes = (rows - 1) * dst_pitch + cols * float_format_size(to);
    auto* s = static_cast<unsigned char*>(dev_->alloc_device(src_bytes + 16));
    auto* d = static_cast<unsigned char*>(dev_->alloc_device(dst_bytes + 16));
    dev_->copy_to_device_2d(s + skew, src_bytes, src.data(), src_bytes, src_bytes, 1, stream_);
    dev_->convert_2d(s + skew, src_pitch, from, d + skew, dst_pitch, to, rows, cols, stream_);
    dev_->synchronize(stream_);
    std::vector<unsigned char> out(dst_bytes);
    dev_->copy_to_host(out.data(), d + skew, dst_bytes);
    dev_->free_device(s);
    dev_->free_device(d);
    return out;
  }

  std::unique_ptr<DeviceOps> dev_;
  DeviceOps::Stream stream_ = nullptr;
};

TEST_F(ConvertCudaTest, SameBitsAsCpuKernels) {
  std::vector<unsigned char> all16(65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) std::memcpy(&all16[i * 2], &i, 2);
  std::mt19937 rng(5);
  std::vector<unsigned char> rand32((1 << 22) * 4);
  for (size_t i = 0; i < rand32.size(); i += 4) {
    const uint32_t x = rng();
    std::memcpy(&rand32[i], &x, 4);
  }
  for (FloatFormat from : kFormats) {
    const std::vector<unsigned char>& src = from == FloatFormat::kF32 ? rand32 : all16;
    const size_t n = src.size() / float_format_size(from);
    for (FloatFormat to : kFormats) {
      std::vector<unsigned char> want(n * float_format_size(to));
      convert_cpu(src.data(), from, want.data(), to, n);
      for (size_t skew : {0, 2}) {  // 0: vector path; 2: any-alignment path
        std::vector<unsigned char> got = on_device(src, from, to, 1, n, 0, 0, skew);
        EXPECT_EQ(got, want) << float_format_name(from) << " -> " << float_format_name(to)
                             << " skew " << skew;
      }
    }
  }
}

TEST_F(ConvertCudaTest, TwoDimensionalGather) {
  std::mt19937 rng(11);
  const size_t rows = 300, full_cols = 512, cols = 128, first = 256;
  for (FloatFormat from : kFormats) {
    const size_t in = float_format_size(from);
    std::vector<unsigned char> src(rows * full_cols * in);
    for (unsigned char& b : src) b = static_cast<unsigned char>(rng());
    for (FloatFormat to : kFormats) {
      const size_t out = float_format_size(to);
      std::vector<unsigned char> want(rows * cols * out);
      convert_cpu_2d(src.data() + first * in, full_cols * in, from, want.data(), cols * out, to,
                     rows, cols);
      // Offset the source so the gather starts at column `first`.
      std::vector<unsigned char> shifted(src.begin() + first * in, src.end());
      std::vector<unsigned char> got =
          on_device(shifted, from, to, rows, cols, full_cols * in, cols * out, 0);
      EXPECT_EQ(got, want) << float_format_name(from) << " -> " << float_format_name(to);
    }
  }
}

}  // namespace
}  // namespace metaload
