#include "loader/tp.h"

namespace metaload {

namespace {
std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace

SliceRegion slice_region(const std::vector<int64_t>& shape, uint64_t elem_size,
                         uint64_t data_offset, const TpSlice& slice, const std::string& name) {
  for (int64_t d : shape) {
    if (d < 0) throw SliceError("tensor '" + name + "': negative dimension in " + shape_str(shape));
  }
  uint64_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<uint64_t>(d);
  SliceRegion r;
  r.shape = shape;
  if (slice.replicated()) {
    r.offset = data_offset;
    r.rows = 1;
    r.row_bytes = numel * elem_size;
    r.row_stride = r.row_bytes;
    return r;
  }
  const std::string where = "tensor '" + name + "' " + shape_str(shape) +
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

}  // namespace metaload
