// Helpers shared by the transformers_model*.cc files; private to the model library.
#pragma once

#include <chrono>

#include <ATen/ATen.h>

#include "identity/model_key.h"

namespace metaload {

// ModelKeyError unless `key` is one TransformersModel builds: class metaload.TransformersModel (or
// an alias) with repo_id and revision only (transformers_model_factory.cc).
void check_transformers_model_key(const ModelKey& key);
namespace model_detail {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "cuda" means cuda:0, as metaload.fake and torch's default device do.
inline at::Device normalized(at::Device d) {
  if (d.is_cuda() && !d.has_index()) return at::Device(at::kCUDA, 0);
  return d;
}

}  // namespace model_detail
}  // namespace metaload
