// Builds a 7B-sized projection stack with no weight memory through @metaload//c10_ext.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "c10_ext/meta_mode.h"

TEST(Consumer, BuildsOnMetaThroughTheBazelTarget) {
  torch::nn::Sequential layers;
  {
    metaload::MetaMode mode;
    for (int i = 0; i < 32; ++i) layers->push_back(torch::nn::Linear(4096, 11008));
  }
  for (const auto& p : layers->parameters()) EXPECT_TRUE(p.is_meta());
  EXPECT_TRUE(torch::zeros({2}).is_cpu());  // the mode ended with its scope
}
