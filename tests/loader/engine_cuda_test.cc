// The staged engine on a real GPU: the same scenarios as the CPU twin (every kind of job, ring and
// stream counts, faults), device results compared byte for byte with the CPU kernels. Skipped where
// there is no GPU; tools/gpu_check runs it where there is one.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <vector>

#include "loader/engine/engine.h"
#include "loader/engine/engine_device.h"
#include "loader/load/slots_torch.h"
#include "tests/loader/engine_test_util.h"

namespace metaload {
namespace {

using namespace testing_util;

class CudaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    dev_ = make_cuda_device_ops(0);
  }
  // Points every job at fresh device memory; returns the allocations.
  std::vector<void*> on_device(std::vector<CopyJob>& jobs) {
    std::vector<void*> mem;
    for (CopyJob& j : jobs) {
      mem.push_back(dev_->alloc_device(std::max<uint64_t>(j.dst_bytes(), 1)));
      j.dst = mem.back();
    }
    return mem;
  }
  void free_all(const std::vector<void*>& mem) {
    for (void* p : mem) dev_->free_device(p);
  }
  std::unique_ptr<DeviceOps> dev_;
};

TEST_F(CudaEngineTest, EveryKindOfJobMatchesTheCpuKernels) {
  struct Config {
    int threads;
    uint64_t chunk, staging;
    int ring, streams;
  };
  for (Config c : {Config{2, 16 << 20, 64 << 20, 4, 2}, Config{4, 64 << 10, 256 << 10, 3, 3},
                   Config{1, 1 << 20, 4096, 2, 2}}) {
    Scenario s;
    build_mixed(s);
    std::vector<CopyJob> jobs = s.jobs;
    const std::vector<void*> mem = on_device(jobs);
    EngineOptions opt;
    opt.bar = ProgressBar::kOff;
    opt.threads = c.threads;
    opt.chunk_bytes = c.chunk;
    opt.staging_bytes = c.staging;
    opt.ring_buffers = c.ring;
    opt.streams = c.streams;
    LoadReport r = run_staged_engine(s.files, jobs, *dev_, opt);
    EXPECT_EQ(r.engine, "staged:cuda:0");
    for (size_t i = 0; i < jobs.size(); ++i) {
      std::vector<unsigned char> got(jobs[i].dst_bytes());
      if (!got.empty()) dev_->copy_to_host(got.data(), jobs[i].dst, got.size());
      EXPECT_EQ(got, expected(jobs[i], s.data[jobs[i].file])) << jobs[i].name;
    }
    free_all(mem);
  }
}

TEST_F(CudaEngineTest, ReadErrorStopsCleanly) {
  Scenario s;
  build_mixed(s);
  std::vector<CopyJob> jobs = s.jobs;
  const std::vector<void*> mem = on_device(jobs);
  EngineOptions opt;
  opt.bar = ProgressBar::kOff;
  opt.chunk_bytes = 128 << 10;
  opt.hooks.pread = [](int fd, void* buf, size_t n, uint64_t off) -> ssize_t {
    if (off >= 1500000) {
      errno = EIO;
      return -1;
    }
    return ::pread(fd, buf, n, static_cast<off_t>(off));
  };
  EXPECT_THROW(run_staged_engine(s.files, jobs, *dev_, opt), ReadError);
  // The device is still usable: a clean load right after works.
  opt.hooks.pread = nullptr;
  run_staged_engine(s.files, jobs, *dev_, opt);
  free_all(mem);
}

TEST_F(CudaEngineTest, SlotsAsCudaTensors) {
  if (!at::hasCUDA()) GTEST_SKIP() << "this libtorch has no CUDA";
  Scenario s;
  s.add_file(1 << 20, 3);
  SlotSpec a;
  a.name = "w";
  a.data_offset = 64;
  a.stored_shape = {256, 512};
  a.stored_dtype = at::kBFloat16;
  a.dtype = at::kFloat;
  SlotSpec b = a;
  b.name = "w.rows";
  b.dtype = at::kBFloat16;
  b.slice = {1, 1, 4};
  EngineOptions opt;
  opt.bar = ProgressBar::kOff;
  SlotLoad gpu = load_slots(s.files, {a, b}, at::Device("cuda:0"), opt);
  SlotLoad cpu = load_slots(s.files, {a, b}, at::kCPU, opt);
  ASSERT_TRUE(gpu.tensors[0].is_cuda());
  EXPECT_TRUE(at::equal(gpu.tensors[0].cpu(), cpu.tensors[0]));
  EXPECT_TRUE(at::equal(gpu.tensors[1].cpu(), cpu.tensors[1]));
}

}  // namespace
}  // namespace metaload
