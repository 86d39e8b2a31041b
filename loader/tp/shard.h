// TpShard: what one tensor-parallel rank holds of a stored tensor. The one shard type of the tree:
// a family's TP plan computes it (family_plan.h, tp_shard) and the loader fills a slot
// from it (tp.h, shard_copies). Header-only and torch-free, so the format layer's users can name
// it without the engine.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace metaload {

// The slot is the concatenation along `dim` of the stored tensor's [begin, end) ranges (a fused
// q|k|v tensor has one range per section), followed by zero rows up to shape[dim] (a vocabulary
// padded for TP: the vocabulary is padded to a multiple of lcm(64, size), so the last ranks may
// hold padding only, with no range at all). dim -1: the whole tensor.
struct TpShard {
  int dim = -1;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<int64_t> shape;  // the rank's local (slot) shape
};

}  // namespace metaload
