// An ordinary libtorch program that knows nothing of metaload: builds a stack of Linear layers
// worth 1.6 GB and prints where the weights are and how much the resident set grew.
// tests/c10_ext/env_test.sh runs it under LD_PRELOAD=libmetaload.so with METALOAD=meta / off.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>

static long rss_bytes() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * 4096;
}

int main() {
  const long before = rss_bytes();
  torch::nn::Sequential stack;
  for (int i = 0; i < 25; ++i) stack->push_back(torch::nn::Linear(4096, 4096));  // 25 x 64 MiB
  const long after = rss_bytes();
  long params = 0;
  bool all_meta = true, any_meta = false;
  for (const auto& p : stack->parameters()) {
    params += p.numel();
    all_meta = all_meta && p.is_meta();
    any_meta = any_meta || p.is_meta();
  }
  std::printf("device=%s params=%ld weight_bytes=%ld rss_growth=%ld\n",
              all_meta ? "meta" : (any_meta ? "mixed" : "cpu"), params, params * 4, after - before);
  return 0;
}
