// Builds a Llama-2-7B-sized stack of projections with no weight memory, through the installed
// metaload package (find_package(metaload)); exits non-zero if anything landed off meta.
#include <torch/torch.h>

#include <cstdio>

#include "c10_ext/meta_mode.h"

int main() {
  torch::nn::Sequential layers;
  {
    metaload::MetaMode mode;
    for (int i = 0; i < 32; ++i) layers->push_back(torch::nn::Linear(4096, 11008));
  }
  int64_t bytes = 0;
  for (const auto& p : layers->parameters()) {
    if (!p.is_meta()) {
      std::fprintf(stderr, "a parameter is on %s, not meta\n", p.device().str().c_str());
      return 1;
    }
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  if (!torch::zeros({2}).is_cpu()) {  // the mode ended with its scope
    std::fprintf(stderr, "the mode outlived its scope\n");
    return 1;
  }
  std::printf("%lld bytes of weights on meta, none allocated\n", static_cast<long long>(bytes));
  return 0;
}
