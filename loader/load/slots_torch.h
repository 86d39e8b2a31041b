// Slots as tensors: allocate every destination on the target device, run the engine that fits the
// device, and hand back the filled tensors -- or, on any failure, free them all and rethrow.
// The planner (names -> SlotSpecs) and the swap (swap.h) sit on either side of this.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loader/engine/engine.h"
#include "loader/engine/engine_device.h"
#include "loader/engine/file_mapping.h"
#include "loader/load/assembly.h"
#include "loader/tp/slice.h"

namespace metaload {

// One checkpoint tensor's rows in an assembled slot (SlotSpec::parts): a fused expert tensor is
// filled from many checkpoint tensors (assembly.h), each read once straight into its place.
struct SlotPart {
  std::string name;  // the checkpoint tensor
  size_t file = 0;
  uint64_t data_offset = 0;  // absolute file offset of its first byte
  at::ScalarType stored_dtype = at::kFloat;
  AssembledCopy copy;  // which of its rows land where in the slot (elements)
};

// One tensor to load: where it is stored, which slice of it this rank takes, the dtype it gets.
struct SlotSpec {
  std::string name;
  size_t file = 0;                    // index into the file list
  uint64_t data_offset = 0;           // absolute file offset of the stored tensor's first byte
  std::vector<int64_t> stored_shape;  // as stored
  at::ScalarType stored_dtype = at::kFloat;
  at::ScalarType dtype = at::kFloat;  // of the slot; differs only among float32/float16/bfloat16
  TpSlice slice;                      // an even split of one dim ...
  std::optional<TpShard> shard;       // ... or any shard a family's TP plan describes (wins)
  // Part of a tensor-parallel load: no read runs through a hole beside it (CopyJob::exact), even
  // when it is replicated -- a hole may be a split tensor of which this rank holds nothing (a
  // vocabulary block past the vocabulary). A split tensor's slice is always exact.
  bool exact = false;
  // An assembled slot of `assembled_shape`: filled by these parts instead of the one stored tensor
  // above (of which only `name`, the target's, and `dtype` then count).
  std::vector<SlotPart> parts;
  std::vector<int64_t> assembled_shape;
};

struct SlotLoad {
  std::vector<at::Tensor> tensors;  // one per spec, shaped as the slice
  LoadReport report;
};

// CPU: one HostArena (slots.h) for all slots and the CPU engine. CUDA: per-tensor at::empty on the
// device (torch's caching allocator) and the staged engine on the CUDA runtime. `staged` (tests,
// or a caller with its own DeviceOps): the staged engine on that device, slots allocated by
// at::empty on `device` -- with the CPU twin, device is the CPU. Throws PlanError for a spec that
// cannot be loaded (dtype conversion not supported, slice not possible), and whatever the engine
// throws; nothing allocated here survives a throw.
SlotLoad load_slots(const std::vector<std::string>& files, const std::vector<SlotSpec>& specs,
                    at::Device device, const EngineOptions& options = {},
                    DeviceOps* staged = nullptr);

// The file mappings (file_mapping.h) that `tensors` point into, each once: what a zero-copy load
// left them on. Tensors elsewhere (copied loads, other devices, meta) have none.
std::vector<std::shared_ptr<FileMapping>> mappings_of(const std::vector<at::Tensor>& tensors);
// Checks those mappings (FileMapping::check): FileChangedError names the first file truncated or
// written in place since it was mapped. Returns them.
std::vector<std::shared_ptr<FileMapping>> check_mapped(const std::vector<at::Tensor>& tensors);

// FloatFormat of a float32/float16/bfloat16 dtype; false for any other.
bool float_format_of(at::ScalarType t, FloatFormat* out);

}  // namespace metaload
