// The family-to-loader adapter: what metaload::load needs to know about a family (its names and
// its TP plan), computed from the FamilyConfig. Private to the model library (TransformersModel's
// dispatch is its user).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "loader/load/plan.h"
#include "model/families/family.h"

namespace metaload {

// The family's names as the loader wants them: checkpoint names mapped onto module names
// (base-model prefixes), tied groups, computed buffers skipped, and each parameter's TP shard from
// the family's plan (spec.h tp_shard, the loader's TpShard).
NameMapping family_name_mapping(const FamilyConfig& config);

// The family's computed (non-persistent) buffers of `config` by module name, made real on
// `device` (a causal mask, rotary inv_freq: their values as an eager build's), each shared buffer
// under each of its names. What a load by the family's plan (load_into's name_mapping="family")
// puts into a module's buffers that were built on meta, as TransformersModel's dispatch does.
// Python: torch.ops.metaload.family_buffers(checkpoint handle, device).
std::vector<std::pair<std::string, at::Tensor>> family_buffers(const FamilyConfig& config,
                                                               at::Device device);

// A tensor-parallel rank's skeleton with its shard shapes, so that the loader's shape checks
// compare like with like; undo() gives the parameters their whole shapes back (a failed load).
class ShardShapes {
 public:
  // Sets every parameter the family's plan splits to the shape rank `rank` of `size` holds.
  // MismatchError listing every parameter the plan cannot split (`reference` names the model);
  // then nothing has changed. Nothing to do for size 1.
  ShardShapes(CausalLM& module, int rank, int size, const std::string& reference);
  void undo();

 private:
  std::vector<std::pair<at::Tensor, std::vector<int64_t>>> whole_;  // tensor, its whole shape
};

}  // namespace metaload
