// DeviceOps on the CUDA runtime API (raw device pointers, no torch). Compiled in every build; the
// CUDA calls exist only where the build links the CUDA runtime (METALOAD_WITH_CUDA), and fail with
// a DeviceError where the machine has no GPU.
#include <string>

#include "loader/engine/engine.h"
#include "loader/engine/engine_device.h"

#ifdef METALOAD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace metaload {

#ifdef METALOAD_WITH_CUDA

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw DeviceError(std::string("CUDA ") + what + " failed: " + cudaGetErrorName(err) + ": " +
                      cudaGetErrorString(err));
  }
}

class CudaDevice : public DeviceOps {
 public:
  explicit CudaDevice(int device) : device_(device) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      throw DeviceError(std::string("no usable CUDA device: ") + cudaGetErrorString(err));
    }
    if (device < 0 || device >= count) {
      throw DeviceError("CUDA device " + std::to_string(device) + " requested but " +
                        std::to_string(count) + " exist");
    }
    bind_thread();
  }
  std::string name() const override { return "cuda:" + std::to_string(device_); }
  void bind_thread() override { check(cudaSetDevice(device_), "cudaSetDevice"); }

  void* alloc_pinned(size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc (pinned staging)");
    return p;
  }
  void free_pinned(void* p) override { cudaFreeHost(p); }
  void* alloc_device(size_t bytes) override {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc (conversion scratch)");
    return p;
  }
  void free_device(void* p) override { cudaFree(p); }

  Stream create_stream() override {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return s;
  }
  void destroy_stream(Stream s) override { cudaStreamDestroy(static_cast<cudaStream_t>(s)); }
  Event create_event() override {
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }
  void destroy_event(Event e) override { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }

  void copy_to_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t rows, Stream s) override {
    auto stream = static_cast<cudaStream_t>(s);
    if (rows == 1) {
      check(cudaMemcpyAsync(dst, src, width, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    } else {
      check(
          cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyHostToDevice, stream),
          "cudaMemcpy2DAsync");
    }
  }
  void convert_2d(const void* src, size_t src_pitch, FloatFormat from, void* dst, size_t dst_pitch,
                  FloatFormat to, size_t rows, size_t cols, Stream s) override {
    try {
      convert_cuda_2d(src, src_pitch, from, dst, dst_pitch, to, rows, cols, s);
    } catch (const ConversionError& e) {
      throw DeviceError(e.message());
    }
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
  }
  void record(Event e, Stream s) override {
    check(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)),
          "cudaEventRecord");
  }
  void wait(Event e) override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize");
  }
  void synchronize(Stream s) override {
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(s)), "cudaStreamSynchronize");
  }

 private:
  int device_;
};

}  // namespace

std::unique_ptr<DeviceOps> make_cuda_device_ops(int device) {
  return std::make_unique<CudaDevice>(device);
}

bool cuda_device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#else  // no CUDA in this build

std::unique_ptr<DeviceOps> make_cuda_device_ops(int device) {
  throw DeviceError("CUDA device " + std::to_string(device) +
                    " requested, but metaload was built without CUDA (nvcc not found)");
}

bool cuda_device_available() {
  return false;
}

#endif

}  // namespace metaload
