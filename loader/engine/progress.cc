#include "loader/engine/progress.h"

#include <unistd.h>

#include <cstdio>
#include <thread>
#include <vector>

namespace metaload {

int checked_loader_threads(int64_t threads, const char* argument) {
  if (threads < 0 || threads > kMaxLoaderThreads) {
    throw PlanError(std::string(argument) + " must be 0 (one per core) or from 1 to " +
                    std::to_string(kMaxLoaderThreads) + ", got " + std::to_string(threads));
  }
  return static_cast<int>(threads);
}

int resolve_threads(int requested) {
  if (checked_loader_threads(requested) > 0) return requested;
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

ProgressPrinter::ProgressPrinter(const EngineOptions& o, uint64_t total) : total_(total) {
  enabled_ = o.bar == ProgressBar::kOn || (o.bar == ProgressBar::kAuto && ::isatty(2));
}

void ProgressPrinter::show(uint64_t done, double secs, bool final) {
  if (!enabled_ || total_ == 0) return;
  const double gbs = secs > 0 ? done / secs / 1e9 : 0;
  const double eta = gbs > 0 ? (total_ - done) / 1e9 / gbs : 0;
  const int width = 24;
  const int filled = static_cast<int>(width * static_cast<double>(done) / total_);
  char bar[width + 1];
  for (int i = 0; i < width; ++i) bar[i] = i < filled ? '#' : '.';
  bar[width] = 0;
  std::fprintf(stderr, "\rmetaload [%s] %.2f/%.2f GB  %.2f GB/s  ETA %.1f s ", bar, done / 1e9,
               total_ / 1e9, gbs, eta);
  if (final) {  // the exact figure: small loads would read 0.00 GB
    std::fprintf(stderr, " %llu bytes in %.2f s\n", static_cast<unsigned long long>(done), secs);
  }
  std::fflush(stderr);
  shown_ = !final;
}

void ProgressPrinter::abandon() {
  if (shown_) std::fputc('\n', stderr);
  shown_ = false;
}

ProgressRun::ProgressRun(const EngineOptions& o, uint64_t total, std::string unit,
                         std::chrono::steady_clock::time_point t0)
    : opt(o), t0(t0), total(total), unit_(std::move(unit)) {}

void ProgressRun::fail(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error) error = e;
  }
  stop = true;
  cv_.notify_all();
}

bool ProgressRun::should_stop() {
  if (stop.load(std::memory_order_relaxed)) return true;
  if (opt.cancel != nullptr && opt.cancel->load()) {
    fail(std::make_exception_ptr(LoadCancelled("load cancelled after " + std::to_string(done) +
                                               " of " + std::to_string(total) + " " + unit_)));
    return true;
  }
  return false;
}

void ProgressRun::execute(int threads, const std::function<void(int)>& worker) {
  ProgressPrinter printer(opt, total);
  std::vector<std::thread> pool;
  running_ = threads;
  try {
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([this, &worker, t] {
        try {
          worker(t);
        } catch (...) {
          fail(std::current_exception());
        }
        if (--running_ == 0) {
          std::lock_guard<std::mutex> lock(mu_);
          cv_.notify_all();
        }
      });
    }
  } catch (...) {
    // Could not start a thread: stop the ones that run, then report.
    fail(std::current_exception());
    running_ -= threads - static_cast<int>(pool.size());
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (running_ > 0) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (running_ == 0) break;
      lock.unlock();
      report_progress(printer, false);
      lock.lock();
    }
  }
  for (std::thread& t : pool) t.join();
  if (!error) report_progress(printer, true);
  if (error) printer.abandon();
}

void ProgressRun::report_progress(ProgressPrinter& printer, bool final) {
  Progress pr;
  pr.bytes_done = done;
  pr.bytes_total = total;
  pr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printer.show(pr.bytes_done, pr.seconds, final);
  if (opt.progress) {
    try {
      opt.progress(pr);
    } catch (...) {
      fail(std::current_exception());
    }
  }
  should_stop();  // notices a cancel even while every worker is busy
}

}  // namespace metaload
