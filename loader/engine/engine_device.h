// The device side of the staged (CUDA) engine, behind a small interface so the same ring, stream
// and event logic runs on a real GPU (CUDA runtime API on raw device pointers) and, in the tests
// here, on its CPU twin (streams are threads, copies are memcpy, kernels are the CPU kernels).
// Torch-free and CUDA-header-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kernels/convert.h"

namespace metaload {

class DeviceOps {
 public:
  using Stream = void*;
  using Event = void*;

  virtual ~DeviceOps() = default;
  virtual std::string name() const = 0;
  // Called first on every thread that uses this device (CUDA's current device is per thread).
  virtual void bind_thread() {}

  virtual void* alloc_pinned(size_t bytes) = 0;  // page-locked host memory
  virtual void free_pinned(void* p) = 0;
  virtual void* alloc_device(size_t bytes) = 0;
  virtual void free_device(void* p) = 0;

  virtual Stream create_stream() = 0;
  virtual void destroy_stream(Stream s) = 0;
  virtual Event create_event() = 0;
  virtual void destroy_event(Event e) = 0;

  // Asynchronous on `s`: rows x width bytes from host `src` (rows spitch apart) to device `dst`
  // (rows dpitch apart).
  virtual void copy_to_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch,
                                 size_t width, size_t rows, Stream s) = 0;
  // Asynchronous on `s`: the conversion kernel on device memory.
  virtual void convert_2d(const void* src, size_t src_pitch, FloatFormat from, void* dst,
                          size_t dst_pitch, FloatFormat to, size_t rows, size_t cols, Stream s) = 0;
  // Synchronous device -> host copy (results checks, tests).
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void record(Event e, Stream s) = 0;
  // Blocks the calling thread until everything queued before the last record(e) has run; throws
  // DeviceError if any of it failed.
  virtual void wait(Event e) = 0;
  virtual void synchronize(Stream s) = 0;
};

// The CUDA runtime on device `device`. Throws DeviceError when the build has no CUDA or the
// machine no such device.
std::unique_ptr<DeviceOps> make_cuda_device_ops(int device = 0);
// True when the build links the CUDA runtime and at least one device answers.
bool cuda_device_available();

// The CPU twin: "device" memory is host memory, each stream is a thread running its queue in
// order, events complete when their stream reaches them.
struct SimDeviceOptions {
  int op_delay_us = 0;   // sleep before every queued op: widens race windows in tests
  long fail_at_op = -1;  // the n-th queued op (0-based) fails asynchronously (fault injection)
  // Called as each op is queued, with its stream and kind ("copy" or "convert"): tests count the
  // streams copies went to.
  std::function<void(DeviceOps::Stream, const char* kind)> on_queue;
};
std::unique_ptr<DeviceOps> make_sim_device_ops(const SimDeviceOptions& options = {});

// Live allocations made through the twin (pinned + device), for leak checks in tests.
int64_t sim_device_live_allocations();

}  // namespace metaload
