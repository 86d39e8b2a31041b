// What the streaming engines move (engine.h has the overview): one CopyJob per destination.
// The errors every engine throws are the loader's (loader/errors.h). Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/convert.h"
#include "loader/errors.h"  // LoadError and its subclasses

namespace metaload {

// One destination: `rows` runs of `row_bytes` bytes, `row_stride` bytes apart in file `file`,
// starting at absolute offset `offset`. A whole tensor or a dim-0 slice is one row (or rows with
// row_stride == row_bytes); a dim-1 slice has row_stride > row_bytes. Row r lands at
// dst + r * dst_pitch(): compact by default, wider when several jobs interleave into one slot (a
// fused q|k|v tensor's per-rank sections).
struct CopyJob {
  std::string name;  // for errors and progress
  size_t file = 0;   // index into the files given to the engine
  uint64_t offset = 0;
  uint64_t rows = 1;
  uint64_t row_bytes = 0;
  uint64_t row_stride = 0;  // 0 means row_bytes (contiguous)
  // Source element size in bytes: reads split only at multiples of it. For a conversion it must
  // be float_format_size(from).
  uint32_t unit = 1;
  bool convert = false;  // false: the bytes are copied as they are
  FloatFormat from = FloatFormat::kF32;
  FloatFormat to = FloatFormat::kF32;
  void* dst = nullptr;          // host memory (CPU engine) or device memory (staged engine)
  uint64_t dst_row_stride = 0;  // bytes between destination rows; 0 = dst_row_bytes()
  // Read only this job's bytes: no read runs through a hole before, after or (strided rows)
  // inside it (merge_gap does not apply); the rows of a strided slice are read one by one, into
  // staging back to back (a packed piece) or straight into the slot. Set for every TP rank's
  // slice, whose holes are other ranks' rows, so a rank reads exactly its own bytes.
  bool exact = false;

  uint64_t stride() const { return row_stride == 0 ? row_bytes : row_stride; }
  uint64_t dst_row_bytes() const {
    return convert ? row_bytes / float_format_size(from) * float_format_size(to) : row_bytes;
  }
  uint64_t dst_pitch() const { return dst_row_stride == 0 ? dst_row_bytes() : dst_row_stride; }
  // Bytes written into the slot.
  uint64_t dst_bytes() const { return rows * dst_row_bytes(); }
};

}  // namespace metaload
