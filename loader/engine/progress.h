// Progress of a load while worker threads move its bytes: the bar on stderr, the
// EngineOptions::progress callback and cancellation, reported from the calling thread. Shared by
// the engines (engine.cc) and the zero-copy mapping (slots_torch.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

#include "loader/engine/engine.h"

namespace metaload {

// The worker count for EngineOptions::threads (0: one per hardware thread).
int resolve_threads(int requested);

// The progress bar on stderr ("metaload [###...] 0.12/0.50 GB  1.30 GB/s  ETA 0.3 s"), drawn
// when EngineOptions::bar says so.
class ProgressPrinter {
 public:
  ProgressPrinter(const EngineOptions& o, uint64_t total);
  void show(uint64_t done, double secs, bool final);
  // Ends a bar left mid-line by a failed load, so the error starts on its own line.
  void abandon();

 private:
  uint64_t total_;
  bool enabled_ = false;
  bool shown_ = false;
};

// Worker threads that count the bytes they move in `done`; the first failure (a worker's
// exception, the progress callback's, or a cancel) stops them all and is kept in `error`.
class ProgressRun {
 public:
  // `unit` names the bytes in a cancel message ("bytes", "mapped bytes"); progress seconds count
  // from `t0`.
  ProgressRun(const EngineOptions& o, uint64_t total, std::string unit = "bytes",
              std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now());

  const EngineOptions& opt;
  const std::chrono::steady_clock::time_point t0;
  uint64_t total = 0;  // bytes the run will move
  std::atomic<uint64_t> done{0};
  std::atomic<bool> stop{false};
  std::exception_ptr error;  // the first failure; read it after execute()

  void fail(std::exception_ptr e);
  // Whether workers should stop: a failure, or a cancel (recorded as the failure).
  bool should_stop();
  // Runs worker(t) for t in [0, threads), each on its own thread, while this thread shows progress
  // about 10 times a second and once at the end (unless a failure stopped the run).
  void execute(int threads, const std::function<void(int)>& worker);

 private:
  void report_progress(ProgressPrinter& printer, bool final);

  std::string unit_;
  std::atomic<int> running_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace metaload
