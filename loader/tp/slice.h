// Tensor-parallel slices: which bytes of a stored tensor rank r of n needs. Torch-free.
//
// For a row-major tensor of shape [d0, ..., dk], a slice of dimension `dim` is `outer` rows
// (d0 * ... * d(dim-1)) of `chunk * inner` elements (chunk = d(dim) / n, inner = the product of
// the dims after it), one row every d(dim) * inner elements. dim 0 (column-parallel: q/k/v,
// gate/up, embeddings by vocabulary) is therefore one contiguous run -- the rank reads only its own
// bytes; dim 1 (row-parallel: o/down projections) is strided; replicated tensors are read whole.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loader/engine/engine.h"
#include "loader/tp/shard.h"  // TpShard: the general shard a family's TP plan describes

namespace metaload {

struct TpSlice {
  int dim = -1;  // -1: replicated (every rank loads the whole tensor)
  int rank = 0;
  int size = 1;
  bool replicated() const { return dim < 0 || size == 1; }
};

struct SliceRegion {
  uint64_t offset = 0;  // absolute file offset of the first byte
  uint64_t rows = 1;
  uint64_t row_bytes = 0;
  uint64_t row_stride = 0;
  std::vector<int64_t> shape;  // the slice's shape
};

// `data_offset`: absolute file offset where the stored tensor begins; `name` is for errors.
SliceRegion slice_region(const std::vector<int64_t>& shape, uint64_t elem_size,
                         uint64_t data_offset, const TpSlice& slice, const std::string& name);

// The even split of TpSlice as a TpShard.
TpShard even_shard(const std::vector<int64_t>& shape, const TpSlice& slice,
                   const std::string& name);

// One range of a shard: a source region and where its rows land in the slot, in elements (the
// slot's element size may differ from the stored one).
struct ShardCopy {
  SliceRegion src;
  uint64_t dst_offset_elems = 0;
  uint64_t dst_row_stride_elems = 0;
};

// The copies that fill a shard's slot. Throws SliceError naming the tensor when the shard does not
// fit the stored shape (dim out of range, range outside the dim, slot shape inconsistent).
std::vector<ShardCopy> shard_copies(const std::vector<int64_t>& stored_shape, uint64_t elem_size,
                                    uint64_t data_offset, const TpShard& shard,
                                    const std::string& name);
// Elements of the slot not covered by any range (zero padding).
bool shard_has_padding(const TpShard& shard);

// Fills job.offset / rows / row_bytes / row_stride from a region.
inline void apply_region(CopyJob& job, const SliceRegion& r) {
  job.offset = r.offset;
  job.rows = r.rows;
  job.row_bytes = r.row_bytes;
  job.row_stride = r.row_stride;
}

}  // namespace metaload
