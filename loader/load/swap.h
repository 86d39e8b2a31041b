// The all-or-nothing swap of filled slots into a module's existing tensors.
//
// `Tensor::set_data` refuses meta -> cpu (its _has_compatible_shallow_copy_type check wants the
// same backend), so the swap goes one level lower: TensorImpl::shallow_copy_from, which is what
// set_data does after its check. The target keeps its TensorImpl (so every reference to the
// Parameter, C++ or Python, sees the new data), its AutogradMeta (requires_grad, hooks, .grad) and
// its version counter; it takes the source's storage, sizes, strides, dtype, device and dispatch
// keys. As set_data does, a cached gradient accumulator is dropped when the device or dtype
// changes. A meta target takes the source's shape too where the caller says so (a
// tensor-parallel shard of a tensor built whole on meta).
//
// Every pair is checked before the first swap; if a swap still throws, the ones already done are
// undone from snapshots, so the targets end exactly as they were.
//
// A target that already holds real memory of the source's shape, dtype and device is written in
// place instead (copy_, as torch's load_state_dict does): its storage is never freed, because
// another thread may be running a kernel on it that released the GIL and holds only its data
// pointer (a forward, a sum). A real target whose dtype or device changes takes the new storage
// like a meta one, which frees the old one as module.to() does: don't run such a load while
// another thread reads the module.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "loader/engine/engine.h"
#include "loader/engine/slots.h"

namespace metaload {

// The state of some tensors (their storage, sizes, dtype, device, keys), to put back exactly.
class TensorSnapshot {
 public:
  explicit TensorSnapshot(const std::vector<at::Tensor>& tensors);
  // Puts back the first `n` tensors (all by default) as they were at construction.
  void restore(size_t n = static_cast<size_t>(-1)) const;

 private:
  std::vector<at::Tensor> tensors_;
  std::vector<c10::intrusive_ptr<c10::TensorImpl>> before_;
};

// names[i] (optional, same length) is used in error messages. meta_takes_shape: a meta target
// takes its source's shape (a TP shard the planner checked: load_tensors); otherwise the shapes
// must be equal.
void swap_in(const std::vector<at::Tensor>& targets, const std::vector<at::Tensor>& sources,
             const std::vector<std::string>& names = {}, bool meta_takes_shape = false);

// A module's tensor, as the tensors staged for it by name meet it (pair_staged).
struct StagedTarget {
  std::string name;  // one of its names; a tied tensor comes once under each
  at::Tensor tensor;
  bool required = true;  // in the module's state_dict: a strict load must fill it
  bool plain = true;     // a torch.Tensor or Parameter, no subclass of them (Python's to know)
};

// The pairs swap_in takes: one per target tensor.
struct SwapPairs {
  std::vector<at::Tensor> targets, sources;
  std::vector<std::string> names;
};

// A module's tensors paired with the tensors staged for them by name (a rank's slice of a
// distributed load, read from the files or received from the source), before the vote and so
// before anything changes. A tied tensor pairs once, with the first of its names that was staged.
// MismatchError ("<where> does not fit the module: N problems", the names as fields) listing:
// missing (strict: required and not staged; strict=False leaves it as it is), unexpected (strict:
// a staged name no target has), mismatched (a shape that differs, except in one dim of a meta
// target, which takes its shard's shape; a target that is not a plain dense tensor; one that
// requires grad staged as integers).
SwapPairs pair_staged(const std::vector<StagedTarget>& targets,
                      const std::vector<std::string>& staged_names,
                      const std::vector<at::Tensor>& staged, bool strict, const std::string& where);

// A CPU tensor over arena bytes [offset, offset + numel * itemsize); it keeps the arena alive.
at::Tensor arena_tensor(const std::shared_ptr<HostArena>& arena, uint64_t offset,
                        at::IntArrayRef sizes, at::ScalarType dtype);

}  // namespace metaload
