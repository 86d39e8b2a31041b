// The CUDA dequantization kernels against the CPU kernels (which dequant_test checks against
// values computed from the codes): the same bits for every scheme, output format and window.
// Skipped where there is no GPU; tools/gpu_check runs it where there is one.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/dequant.h"
#include "loader/engine/engine_device.h"

namespace metaload {
namespace {

class DequantCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    dev_ = make_cuda_device_ops(0);
    stream_ = dev_->create_stream();
  }
  void TearDown() override {
    if (dev_) dev_->destroy_stream(stream_);
    for (void* p : allocs_) dev_->free_device(p);
  }

  // A device copy of host bytes.
  template <class T>
  const void* up(const std::vector<T>& host) {
    const size_t bytes = host.size() * sizeof(T);
    void* p = dev_->alloc_device(bytes + 16);
    allocs_.push_back(p);
    dev_->copy_to_device_2d(p, bytes, host.data(), bytes, bytes, 1, stream_);
    return p;
  }

  // Runs `v` (host pointers) and `dv` (the same on the device) over the window in every format and
  // compares the bytes.
  void compare(const QuantView& v, const QuantView& dv) {
    struct W {
      int64_t r0, rows, c0, cols;
    };
    const W windows[] = {{0, v.out, 0, v.in},
                         {v.out / 2, v.out - v.out / 2, 0, v.in},
                         {0, v.out, v.in / 2, v.in - v.in / 2},
                         {1, v.out - 2, 8, v.in - 16}};
    for (int fmt = 0; fmt < 3; ++fmt) {
      for (const W& w : windows) {
        const size_t bytes = w.rows * w.cols * (fmt == 0 ? 4 : 2);
        std::vector<unsigned char> cpu(bytes), gpu(bytes);
        DequantDst d{cpu.data(), fmt, w.cols, w.r0, w.rows, w.c0, w.cols};
        dequant_cpu(v, d);
        void* out = dev_->alloc_device(bytes);
        allocs_.push_back(out);
        DequantDst dd = d;
        dd.data = out;
        dev_->synchronize(stream_);
        dequant_cuda(dv, dd, stream_);
        dequant_cuda_sync(stream_);
        dev_->copy_to_host(gpu.data(), out, bytes);
        ASSERT_EQ(0, std::memcmp(cpu.data(), gpu.data(), bytes))
            << quant_scheme_name(v.scheme) << " fmt " << fmt << " window " << w.r0 << "+" << w.rows
            << " x " << w.c0 << "+" << w.cols;
      }
    }
  }

  std::unique_ptr<DeviceOps> dev_;
  DeviceOps::Stream stream_ = nullptr;
  std::vector<void*> allocs_;
};

template <class T>
std::vector<T> random_words(std::mt19937& rng, size_t n) {
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(rng());
  return v;
}

std::vector<uint16_t> f16_scales(std::mt19937& rng, size_t n) {
  std::vector<uint16_t> s(n);
  for (auto& x : s) x = 0x2000 + (rng() & 0x0FFF);  // small positive halves
  return s;
}

TEST_F(DequantCudaTest, GptqActOrderAndPlain) {
  std::mt19937 rng(1);
  const int64_t out = 128, in = 256, groups = 8;
  const auto qweight = random_words<uint32_t>(rng, in / 8 * out);
  const auto qzeros = random_words<uint32_t>(rng, groups * out / 8);
  const auto scales = f16_scales(rng, groups * out);
  std::vector<int32_t> g_idx(in);
  for (auto& g : g_idx) g = static_cast<int32_t>(rng() % groups);
  QuantView v;
  v.scheme = QuantScheme::kGptq;
  v.out = out;
  v.in = in;
  v.q = qweight.data();
  v.zeros = qzeros.data();
  v.scales = scales.data();
  v.scales_format = 1;
  v.group_size = 32;
  v.groups = groups;
  v.zero_offset = 1;
  QuantView dv = v;
  dv.q = up(qweight);
  dv.zeros = up(qzeros);
  dv.scales = up(scales);
  compare(v, dv);
  v.g_idx = g_idx.data();
  dv.g_idx = up(g_idx);
  compare(v, dv);
}

TEST_F(DequantCudaTest, Awq) {
  std::mt19937 rng(2);
  const int64_t out = 64, in = 256, groups = 2;
  const auto qweight = random_words<uint32_t>(rng, in * out / 8);
  const auto qzeros = random_words<uint32_t>(rng, groups * out / 8);
  const auto scales = f16_scales(rng, groups * out);
  QuantView v;
  v.scheme = QuantScheme::kAwq;
  v.out = out;
  v.in = in;
  v.q = qweight.data();
  v.zeros = qzeros.data();
  v.scales = scales.data();
  v.scales_format = 1;
  v.group_size = 128;
  v.groups = groups;
  QuantView dv = v;
  dv.q = up(qweight);
  dv.zeros = up(qzeros);
  dv.scales = up(scales);
  compare(v, dv);
}

TEST_F(DequantCudaTest, Bnb4PlainAndNested) {
  std::mt19937 rng(3);
  const int64_t out = 40, in = 100, n = out * in, blocks = (n + 63) / 64;
  const auto packed = random_words<uint8_t>(rng, (n + 1) / 2);
  std::vector<float> code(16), absmax(blocks), ncode(256), nabs((blocks + 255) / 256);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& x : code) x = u(rng);
  for (auto& x : absmax) x = 1 + u(rng);
  for (auto& x : ncode) x = u(rng);
  for (auto& x : nabs) x = 1 + u(rng);
  const auto qabs = random_words<uint8_t>(rng, blocks);
  QuantView v;
  v.scheme = QuantScheme::kBnb4;
  v.out = out;
  v.in = in;
  v.q = packed.data();
  v.scales = absmax.data();
  v.code = code.data();
  v.group_size = 64;
  QuantView dv = v;
  dv.q = up(packed);
  dv.scales = up(absmax);
  dv.code = up(code);
  compare(v, dv);
  v.scales = qabs.data();
  v.nested_scales = nabs.data();
  v.nested_code = ncode.data();
  v.nested_block = 256;
  v.offset = 0.0371f;
  dv.scales = up(qabs);
  dv.nested_scales = up(nabs);
  dv.nested_code = up(ncode);
  dv.nested_block = 256;
  dv.offset = v.offset;
  compare(v, dv);
}

TEST_F(DequantCudaTest, Bnb8AndFp8) {
  std::mt19937 rng(4);
  const int64_t out = 200, in = 300;
  const auto w = random_words<uint8_t>(rng, out * in);
  std::vector<float> scb(out);
  for (auto& s : scb) s = 0.01f * (1 + rng() % 1000);
  QuantView v;
  v.scheme = QuantScheme::kBnb8;
  v.out = out;
  v.in = in;
  v.q = w.data();
  v.scales = scb.data();
  QuantView dv = v;
  dv.q = up(w);
  dv.scales = up(scb);
  compare(v, dv);
  std::vector<float> sinv(2 * 3);
  for (auto& s : sinv) s = 0.001f * (1 + rng() % 100);
  v.scheme = QuantScheme::kFp8;
  v.scales = sinv.data();
  v.group_size = 128;
  v.block_in = 128;
  dv = v;
  dv.q = up(w);
  dv.scales = up(sinv);
  compare(v, dv);
}

}  // namespace
}  // namespace metaload
