#include "loader/load/swap.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <sstream>
#include <typeinfo>
#include <unordered_map>

#include "base/text.h"
#include "base/torch_library.h"

namespace metaload {

namespace {

std::string label(const std::vector<std::string>& names, size_t i) {
  return i < names.size() && !names[i].empty() ? quote_text(names[i], '\'')
                                               : "#" + std::to_string(i);
}

void check_pair(const at::Tensor& t, const at::Tensor& s, const std::string& who,
                bool meta_takes_shape) {
  if (!t.defined()) throw SwapError("target " + who + " is an undefined tensor");
  if (!s.defined()) throw SwapError("no loaded data for " + who + " (undefined source)");
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  // Subclasses (fake, batched, opaque, sparse, ...) keep state the shallow copy would not update.
  if (typeid(*impl) != typeid(c10::TensorImpl)) {
    throw SwapError("target " + who + " is a " + typeid(*impl).name() +
                    ", not a plain dense tensor; it cannot take loaded data in place");
  }
  if (s.layout() != at::kStrided || t.layout() != at::kStrided) {
    throw SwapError(who + ": only strided (dense) tensors can be swapped");
  }
  if (t.sizes() != s.sizes() && !(meta_takes_shape && t.is_meta())) {
    throw SwapError(who + ": shape " + shape_str(t.sizes()) + " in the module but " +
                    shape_str(s.sizes()) + " loaded");
  }
  if (t.requires_grad() &&
      !(at::isFloatingType(s.scalar_type()) || at::isComplexType(s.scalar_type()))) {
    throw SwapError(who + " requires grad but the loaded dtype " +
                    std::string(c10::toString(s.scalar_type())) + " cannot");
  }
  if (t.is_inference() != s.is_inference() && !t.is_inference()) {
    throw SwapError(who + ": an inference tensor cannot be swapped into a normal tensor");
  }
}

// Drops the cached AccumulateGrad node when the metadata it captured no longer holds (what
// VariableHooks::set_data does).
void reset_grad_accumulator(const at::Tensor& t, const at::TensorOptions& before) {
  torch::autograd::AutogradMeta* meta = torch::autograd::impl::get_autograd_meta(t);
  if (meta == nullptr) return;
  std::lock_guard<std::mutex> lock(meta->mutex_);
  if (meta->grad_accumulator_.lock() && !before.type_equal(t.options())) {
    meta->grad_accumulator_.reset();
  }
  if (meta->grad_accumulator_.lock() && before.device() != t.device()) {
    meta->grad_accumulator_.reset();
  }
}

}  // namespace

TensorSnapshot::TensorSnapshot(const std::vector<at::Tensor>& tensors) : tensors_(tensors) {
  before_.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    before_.push_back(impl->shallow_copy_and_detach(impl->version_counter(),
                                                    impl->allow_tensor_metadata_change()));
  }
}

void TensorSnapshot::restore(size_t n) const {
  for (size_t i = 0; i < tensors_.size() && i < n; ++i)
    tensors_[i].unsafeGetTensorImpl()->shallow_copy_from(before_[i]);
}

namespace {

// Whether `t` holds real memory that `s` can be copied into as it is (the in-place path).
bool writes_in_place(const at::Tensor& t, const at::Tensor& s) {
  return !t.is_meta() && t.has_storage() && t.device() == s.device() &&
         t.scalar_type() == s.scalar_type() && !t.is_inference() &&
         t.is_non_overlapping_and_dense() && t.unsafeGetTensorImpl()->storage().data() != nullptr;
}

}  // namespace

void swap_in(const std::vector<at::Tensor>& targets, const std::vector<at::Tensor>& sources,
             const std::vector<std::string>& names, bool meta_takes_shape) {
  if (targets.size() != sources.size()) {
    throw SwapError(std::to_string(targets.size()) + " targets but " +
                    std::to_string(sources.size()) + " sources");
  }
  // Everything that can be checked is checked before anything changes.
  std::unordered_map<const c10::TensorImpl*, size_t> seen;
  std::vector<at::Tensor> swapped, swapped_from, copied, copied_from;
  for (size_t i = 0; i < targets.size(); ++i) {
    check_pair(targets[i], sources[i], "tensor " + label(names, i), meta_takes_shape);
    auto [it, fresh] = seen.emplace(targets[i].unsafeGetTensorImpl(), i);
    if (!fresh && sources[it->second].unsafeGetTensorImpl() != sources[i].unsafeGetTensorImpl()) {
      throw SwapError("tensor " + label(names, i) + " is the same tensor as " +
                      label(names, it->second) + " (tied) but was given different data");
    }
    if (!fresh) continue;
    const bool in_place = writes_in_place(targets[i], sources[i]);
    (in_place ? copied : swapped).push_back(targets[i]);
    (in_place ? copied_from : swapped_from).push_back(sources[i]);
  }
  std::vector<at::TensorOptions> options;
  for (const at::Tensor& t : swapped) options.push_back(t.options());
  const TensorSnapshot before(swapped);
  size_t done = 0;
  try {
    for (; done < swapped.size(); ++done) {
      swapped[done].unsafeGetTensorImpl()->shallow_copy_from(swapped_from[done].getIntrusivePtr());
      reset_grad_accumulator(swapped[done], options[done]);
    }
  } catch (...) {
    before.restore(done);
    throw;
  }
  // Same shape, dtype and device: copy_ cannot fail now, and the old storage stays alive. Real
  // even inside a meta or fake mode on this thread (which would redirect the copy).
  at::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard real(
      c10::DispatchKeySet({c10::DispatchKey::DeferredInit, c10::DispatchKey::Fake}));
  for (size_t i = 0; i < copied.size(); ++i) copied[i].copy_(copied_from[i]);
}

at::Tensor arena_tensor(const std::shared_ptr<HostArena>& arena, uint64_t offset,
                        at::IntArrayRef sizes, at::ScalarType dtype) {
  std::shared_ptr<HostArena> keep = arena;
  return at::from_blob(
      arena->data() + offset, sizes, [keep](void*) mutable { keep.reset(); },
      at::TensorOptions().dtype(dtype).device(at::kCPU));
}

namespace {

// Python: torch.ops.metaload.swap_tensors(targets, sources, names, meta_takes_shape). Tensor
// lists arrive as the very TensorImpls the Python objects wrap, so the Parameters themselves
// change.
void swap_tensors_op(at::TensorList targets, at::TensorList sources,
                     c10::optional<std::vector<std::string>> names, bool meta_takes_shape) {
  swap_in(targets.vec(), sources.vec(), names.value_or(std::vector<std::string>{}),
          meta_takes_shape);
}

}  // namespace

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def(
      "swap_tensors(Tensor(a!)[] targets, Tensor[] sources, str[]? names=None, "
      "bool meta_takes_shape=False) -> ()",
      &swap_tensors_op);
}

}  // namespace metaload
