// The CPU twin of the CUDA device (engine_device.h): same queue-per-stream ordering, same
// asynchrony (a stream is a thread), same sticky-error behaviour as the CUDA runtime, so the ring
// logic of the staged engine is exercised for real where no GPU exists.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "loader/engine/engine.h"
#include "loader/engine/engine_device.h"

namespace metaload {

namespace {

std::atomic<int64_t> g_live{0};

class SimDevice;

class SimStream {
 public:
  explicit SimStream(SimDevice* dev) : dev_(dev), worker_([this] { loop(); }) {}
  ~SimStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void enqueue(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(op));
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || !queue_.empty(); });
      if (queue_.empty()) return;  // quit with nothing left
      std::function<void()> op = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      op();
      lock.lock();
      busy_ = false;
      if (queue_.empty()) idle_.notify_all();
    }
  }

  SimDevice* dev_;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::function<void()>> queue_;
  bool quit_ = false;
  bool busy_ = false;
  std::thread worker_;
};

struct SimEvent {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;
  uint64_t completed = 0;
};

class SimDevice : public DeviceOps {
 public:
  explicit SimDevice(const SimDeviceOptions& o) : opt_(o) {}
  std::string name() const override { return "sim"; }

  void* alloc_pinned(size_t bytes) override { return alloc(bytes); }
  void free_pinned(void* p) override { release(p); }
  void* alloc_device(size_t bytes) override { return alloc(bytes); }
  void free_device(void* p) override { release(p); }

  Stream create_stream() override { return new SimStream(this); }
  void destroy_stream(Stream s) override { delete static_cast<SimStream*>(s); }
  Event create_event() override { return new SimEvent(); }
  void destroy_event(Event e) override { delete static_cast<SimEvent*>(e); }

  void copy_to_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t rows, Stream s) override {
    if (opt_.on_queue) opt_.on_queue(s, "copy");
    queue_op(s, [=] {
      for (size_t r = 0; r < rows; ++r) {
        std::memcpy(static_cast<char*>(dst) + r * dpitch,
                    static_cast<const char*>(src) + r * spitch, width);
      }
    });
  }

  void convert_2d(const void* src, size_t src_pitch, FloatFormat from, void* dst, size_t dst_pitch,
                  FloatFormat to, size_t rows, size_t cols, Stream s) override {
    if (opt_.on_queue) opt_.on_queue(s, "convert");
    queue_op(s, [=] { convert_cpu_2d(src, src_pitch, from, dst, dst_pitch, to, rows, cols); });
  }

  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    check();
    std::memcpy(dst, src, bytes);
  }

  void record(Event e, Stream s) override {
    auto* ev = static_cast<SimEvent*>(e);
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(ev->mu);
      gen = ++ev->recorded;
    }
    static_cast<SimStream*>(s)->enqueue([ev, gen] {
      std::lock_guard<std::mutex> lock(ev->mu);
      if (gen > ev->completed) ev->completed = gen;
      ev->cv.notify_all();
    });
  }

  void wait(Event e) override {
    auto* ev = static_cast<SimEvent*>(e);
    {
      std::unique_lock<std::mutex> lock(ev->mu);
      const uint64_t target = ev->recorded;
      ev->cv.wait(lock, [&] { return ev->completed >= target; });
    }
    check();
  }

  void synchronize(Stream s) override {
    static_cast<SimStream*>(s)->drain();
    check();
  }

 private:
  void* alloc(size_t bytes) {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == nullptr)
      throw DeviceError("sim device: out of memory allocating " + std::to_string(bytes) + " bytes");
    ++g_live;
    return p;
  }
  void release(void* p) {
    if (p == nullptr) return;
    std::free(p);
    --g_live;
  }

  // Like CUDA: an op that fails poisons the device; later ops are skipped and every later wait or
  // synchronize reports the error.
  void queue_op(Stream s, std::function<void()> op) {
    const long index = ops_++;
    const int delay = opt_.op_delay_us;
    const bool fail = index == opt_.fail_at_op;
    static_cast<SimStream*>(s)->enqueue([this, op = std::move(op), delay, fail, index] {
      if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
      {
        std::lock_guard<std::mutex> lock(err_mu_);
        if (!error_.empty()) return;
        if (fail) {
          error_ = "simulated device fault in queued operation " + std::to_string(index);
          return;
        }
      }
      try {
        op();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(err_mu_);
        if (error_.empty()) error_ = e.what();
      }
    });
  }
  void check() {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (!error_.empty()) throw DeviceError("sim device: " + error_);
  }

  SimDeviceOptions opt_;
  std::atomic<long> ops_{0};
  std::mutex err_mu_;
  std::string error_;
};

}  // namespace

std::unique_ptr<DeviceOps> make_sim_device_ops(const SimDeviceOptions& options) {
  return std::make_unique<SimDevice>(options);
}

int64_t sim_device_live_allocations() {
  return g_live.load();
}

}  // namespace metaload
