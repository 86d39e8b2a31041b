// bench/scan (C++ part): what does scanning cost per op?
//
// The same GPT-2-small forward (the families' module tree, built on meta) runs (1) directly on
// meta tensors -- the anchor: libtorch's own Meta kernels with nothing in between -- and (2) under
// FakeMode claiming cuda:0, as scan() runs it. Same ops, so the time ratio is the per-op overhead
// of fake tensors. Ops are counted with a RecordFunction callback.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "bench/bench_util.h"
#include "fake_mode/fake_mode.h"
#include "fake_mode/scan.h"
#include "model/families/config.h"
#include "model/families/family.h"

namespace mb = metaload::bench;

namespace {

std::atomic<int64_t> g_ops{0};

int64_t count_ops(const std::function<void()>& fn) {
  g_ops = 0;
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction&)
                                     -> std::unique_ptr<at::ObserverContext> {
        g_ops.fetch_add(1, std::memory_order_relaxed);
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  fn();
  at::removeCallback(handle);
  return g_ops.load();
}

// Median times of several runs, interleaved (one of each per round) so that load on a shared
// machine hits every run alike: each run is around a millisecond.
std::vector<double> median_times(const std::vector<std::function<void()>>& fns, int reps) {
  std::vector<std::vector<double>> t(fns.size());
  for (const auto& fn : fns) fn();  // warm up caches (per-op tables, allocator)
  for (int i = 0; i < reps; ++i) {
    for (size_t j = 0; j < fns.size(); ++j) {
      const double t0 = mb::now_s();
      fns[j]();
      t[j].push_back(mb::now_s() - t0);
    }
  }
  std::vector<double> medians;
  for (auto& v : t) medians.push_back(mb::median(v));
  return medians;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 31;
  const int64_t batch = 8, seq = 1024;
  auto config = metaload::builtin_config("gpt2");
  metaload::BuildOptions options;
  options.device = at::kMeta;
  options.init_weights = false;
  auto model = metaload::build_causal_lm(config, options);
  model->eval();
  at::NoGradGuard no_grad;

  const at::Tensor ids =
      at::empty({batch, seq}, at::TensorOptions().dtype(at::kLong).device(at::kMeta));
  auto direct = [&] { (void)model->forward(ids); };
  const c10::Device cuda0("cuda:0");
  auto faked = [&] {
    metaload::FakeMode mode(cuda0);
    (void)model->forward(ids);
  };
  int64_t sink_modules = 0;
  auto scanned = [&] {
    auto r = metaload::scan(
        [&](const std::vector<at::Tensor>& in) {
          return std::vector<at::Tensor>{model->forward(in[0])};
        },
        {ids}, cuda0,
        [&](metaload::ModuleObserver o) { model->set_output_observer(std::move(o)); });
    sink_modules = static_cast<int64_t>(r.modules.size());
  };

  const int64_t ops_direct = count_ops(direct);
  const int64_t ops_fake = count_ops(faked);
  const auto times = median_times({direct, faked, scanned}, reps);
  const double t_direct = times[0], t_fake = times[1], t_scan = times[2];

  std::printf("metaload bench/scan, C++ (GPT-2 small, batch %lld x %lld tokens, medians of %d)\n\n",
              (long long)batch, (long long)seq, reps);
  std::printf("%-40s %8s %10s %10s %12s %9s\n", "run", "ops", "ms", "us/op", "ops/s", "x anchor");
  auto row = [&](const char* name, int64_t ops, double t) {
    std::printf("%-40s %8lld %10.2f %10.2f %12.0f %9.2f\n", name, (long long)ops, t * 1e3,
                t / ops * 1e6, ops / t, t / t_direct);
  };
  row("anchor: forward on meta tensors", ops_direct, t_direct);
  row("FakeMode(cuda:0) forward", ops_fake, t_fake);
  row("scan() with every module's output", ops_fake, t_scan);
  std::printf("\nmodules reported by scan: %lld; peak RSS %.1f MiB\n", (long long)sink_modules,
              mb::mib(mb::peak_rss_bytes()));
  // The target is on scan() itself (module observer included), not the bare mode. The
  // same forward runs the same ops, so the time ratio is the per-op ratio (counted ops may differ
  // by what the record function sees under the mode; the slower reading is kept).
  const double ratio = t_scan / t_direct;
  std::printf("target: scan() at most 2x the anchor per op: %.2fx (%s)\n", ratio,
              ratio <= 2.0 ? "met" : "NOT met");
  return 0;
}
