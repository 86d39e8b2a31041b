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
#include <vector>

#include "loader/engine.h"

namespace metaload {

// The rank's slice does not exist: the dim is out of range, or n does not divide it, or the rank
// is not in [0, n).
METALOAD_DEFINE_ERROR(SliceError, LoadError);

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

// Fills job.offset / rows / row_bytes / row_stride from a region.
inline void apply_region(CopyJob& job, const SliceRegion& r) {
  job.offset = r.offset;
  job.rows = r.rows;
  job.row_bytes = r.row_bytes;
  job.row_stride = r.row_stride;
}

}  // namespace metaload
