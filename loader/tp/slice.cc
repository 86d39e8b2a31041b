#include "loader/tp/slice.h"

#include "base/checked.h"
#include "base/text.h"

namespace metaload {

namespace {}  // namespace

SliceRegion slice_region(const std::vector<int64_t>& shape, uint64_t elem_size,
                         uint64_t data_offset, const TpSlice& slice, const std::string& name) {
  for (int64_t d : shape) {
    if (d < 0) {
      throw SliceError("tensor " + quote_text(name, '\'') + ": negative dimension in " +
                       shape_str(shape));
    }
  }
  // Every product below is a part of this one, so it fits when this does.
  const uint64_t bytes =
      checked_product<uint64_t>(shape, elem_size, "bytes of tensor " + quote_text(name));
  checked_add<uint64_t>(data_offset, bytes, "end offset of tensor " + quote_text(name));
  SliceRegion r;
  r.shape = shape;
  if (slice.replicated()) {
    r.offset = data_offset;
    r.rows = 1;
    r.row_bytes = bytes;
    r.row_stride = r.row_bytes;
    return r;
  }
  const std::string where = "tensor " + quote_text(name, '\'') + " " + shape_str(shape) +
                            ": tensor-parallel slice of dim " + std::to_string(slice.dim) +
                            " for rank " + std::to_string(slice.rank) + " of " +
                            std::to_string(slice.size);
  if (slice.size < 1) throw SliceError(where + ": size must be at least 1");
  if (slice.rank < 0 || slice.rank >= slice.size) throw SliceError(where + ": rank out of range");
  if (slice.dim >= static_cast<int>(shape.size())) {
    throw SliceError(where + ": the tensor has only " + std::to_string(shape.size()) + " dims");
  }
  const uint64_t extent = static_cast<uint64_t>(shape[slice.dim]);
  if (extent % static_cast<uint64_t>(slice.size) != 0) {
    throw SliceError(where + ": " + std::to_string(extent) + " is not divisible by " +
                     std::to_string(slice.size));
  }
  uint64_t outer = 1, inner = 1;
  for (int i = 0; i < slice.dim; ++i) outer *= static_cast<uint64_t>(shape[i]);
  for (size_t i = slice.dim + 1; i < shape.size(); ++i) inner *= static_cast<uint64_t>(shape[i]);
  const uint64_t chunk = extent / slice.size;
  r.shape[slice.dim] = static_cast<int64_t>(chunk);
  r.rows = outer;
  r.row_bytes = chunk * inner * elem_size;
  r.row_stride = extent * inner * elem_size;
  r.offset = data_offset + static_cast<uint64_t>(slice.rank) * chunk * inner * elem_size;
  if (outer == 1) r.row_stride = r.row_bytes;  // one row: contiguous
  return r;
}

TpShard even_shard(const std::vector<int64_t>& shape, const TpSlice& slice,
                   const std::string& name) {
  TpShard shard;
  shard.shape = shape;
  if (slice.replicated()) return shard;
  const SliceRegion r = slice_region(shape, 1, 0, slice, name);  // validates
  const int64_t chunk = r.shape[slice.dim];
  shard.dim = slice.dim;
  shard.ranges = {{slice.rank * chunk, (slice.rank + 1) * chunk}};
  shard.shape = r.shape;
  return shard;
}

bool shard_has_padding(const TpShard& shard) {
  if (shard.dim < 0) return false;
  int64_t covered = 0;
  for (const auto& r : shard.ranges) covered += r.second - r.first;
  return covered < shard.shape[shard.dim];
}

std::vector<ShardCopy> shard_copies(const std::vector<int64_t>& stored_shape, uint64_t elem_size,
                                    uint64_t data_offset, const TpShard& shard,
                                    const std::string& name) {
  const std::string where =
      "tensor " + quote_text(name, '\'') + " " + shape_str(stored_shape) + ": shard";
  if (shard.dim < 0) {
    if (!shard.shape.empty() && shard.shape != stored_shape) {
      throw SliceError(where + " of the whole tensor has shape " + shape_str(shard.shape));
    }
    ShardCopy c;
    c.src = slice_region(stored_shape, elem_size, data_offset, TpSlice{}, name);
    return {c};
  }
  const int dim = shard.dim;
  if (dim >= static_cast<int>(stored_shape.size())) {
    throw SliceError(where + " of dim " + std::to_string(dim) + ": the tensor has only " +
                     std::to_string(stored_shape.size()) + " dims");
  }
  if (shard.shape.size() != stored_shape.size()) {
    throw SliceError(where + " shape " + shape_str(shard.shape) + " has another rank");
  }
  for (size_t i = 0; i < stored_shape.size(); ++i) {
    if (static_cast<int>(i) != dim && shard.shape[i] != stored_shape[i]) {
      throw SliceError(where + " shape " + shape_str(shard.shape) + " differs outside dim " +
                       std::to_string(dim));
    }
  }
  // The products below are parts of the whole tensor's bytes, which must fit.
  const uint64_t bytes =
      checked_product<uint64_t>(stored_shape, elem_size, "bytes of tensor " + quote_text(name));
  checked_add<uint64_t>(data_offset, bytes, "end offset of tensor " + quote_text(name));
  checked_product<uint64_t>(shard.shape, elem_size,
                            "bytes of the shard of tensor " + quote_text(name));
  uint64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= static_cast<uint64_t>(stored_shape[i]);
  for (size_t i = dim + 1; i < stored_shape.size(); ++i) {
    inner *= static_cast<uint64_t>(stored_shape[i]);
  }
  const int64_t extent = stored_shape[dim];
  std::vector<ShardCopy> out;
  int64_t at = 0;  // along dim, in the slot
  for (const auto& [b, e] : shard.ranges) {
    if (b < 0 || e > extent || b >= e) {
      throw SliceError(where + " range [" + std::to_string(b) + ", " + std::to_string(e) +
                       ") is not inside dim " + std::to_string(dim) + " of size " +
                       std::to_string(extent));
    }
    ShardCopy c;
    c.src.offset = data_offset + static_cast<uint64_t>(b) * inner * elem_size;
    c.src.rows = outer;
    c.src.row_bytes = static_cast<uint64_t>(e - b) * inner * elem_size;
    c.src.row_stride =
        outer == 1 ? c.src.row_bytes : static_cast<uint64_t>(extent) * inner * elem_size;
    c.src.shape = shard.shape;
    c.dst_offset_elems = static_cast<uint64_t>(at) * inner;
    c.dst_row_stride_elems = static_cast<uint64_t>(shard.shape[dim]) * inner;
    out.push_back(c);
    at += e - b;
  }
  if (at > shard.shape[dim]) {
    throw SliceError(where + " ranges cover " + std::to_string(at) + " of dim " +
                     std::to_string(dim) + " but the slot has only " +
                     std::to_string(shard.shape[dim]));
  }
  return out;
}

}  // namespace metaload
