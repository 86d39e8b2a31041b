#include "loader/load/swap.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <sstream>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

#include "base/text.h"
#include "base/torch_library.h"
#include "loader/errors.h"
#include "loader/format/safetensors.h"
#include "loader/load/torch_save.h"

namespace metaload {

namespace {

std::string label(const std::vector<std::string>& names, size_t i) {
  return i < names.size() && !names[i].empty() ? quote_text(names[i], '\'')
                                               : "#" + std::to_string(i);
}

// torch's own TensorImpl: subclasses (fake, batched, opaque, sparse, ...) keep state the shallow
// copy would not update.
bool plain_impl(const at::Tensor& t) {
  return typeid(*t.unsafeGetTensorImpl()) == typeid(c10::TensorImpl);
}

// Whether a tensor that requires grad can hold data of this dtype.
bool grad_dtype(at::ScalarType d) {
  return at::isFloatingType(d) || at::isComplexType(d);
}

void check_pair(const at::Tensor& t, const at::Tensor& s, const std::string& who,
                bool meta_takes_shape) {
  if (!t.defined()) throw SwapError("target " + who + " is an undefined tensor");
  if (!s.defined()) throw SwapError("no loaded data for " + who + " (undefined source)");
  if (!plain_impl(t)) {
    throw SwapError("target " + who + " is a " + typeid(*t.unsafeGetTensorImpl()).name() +
                    ", not a plain dense tensor; it cannot take loaded data in place");
  }
  if (s.layout() != at::kStrided || t.layout() != at::kStrided) {
    throw SwapError(who + ": only strided (dense) tensors can be swapped");
  }
  if (t.sizes() != s.sizes() && !(meta_takes_shape && t.is_meta())) {
    throw SwapError(who + ": shape " + shape_str(t.sizes()) + " in the module but " +
                    shape_str(s.sizes()) + " loaded");
  }
  if (t.requires_grad() && !grad_dtype(s.scalar_type())) {
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

namespace {

// Why staged tensor `s` cannot take target `t`'s place, or "" when it can.
std::string pair_problem(const StagedTarget& t, const at::Tensor& s, const std::string& where) {
  const at::Tensor& m = t.tensor;
  if (m.sizes() != s.sizes()) {
    // A meta target takes its rank's shard shape (one dimension split); a real one must already
    // have it (a reload).
    int differ = 0;
    if (m.dim() == s.dim()) {
      for (int64_t d = 0; d < m.dim(); ++d) differ += m.size(d) != s.size(d);
    }
    if (!m.is_meta() || m.dim() != s.dim() || differ > 1) {
      return ": shape " + shape_str(m.sizes()) + " in the module but " + where + " holds " +
             shape_str(s.sizes());
    }
  }
  // What swap_in would refuse after the vote, refused before it.
  if (!t.plain || m.layout() != at::kStrided || !plain_impl(m)) return ": not a plain dense tensor";
  if (m.requires_grad() && !grad_dtype(s.scalar_type())) {
    const std::optional<DType> d = safetensors_dtype_of(s.scalar_type());
    const char* attr = d ? dtype_torch_attr(*d) : nullptr;
    return std::string(": requires grad but loads as ") +
           (attr ? std::string("torch.") + attr : c10::toString(s.scalar_type()));
  }
  return "";
}

}  // namespace

SwapPairs pair_staged(const std::vector<StagedTarget>& targets,
                      const std::vector<std::string>& staged_names,
                      const std::vector<at::Tensor>& staged, bool strict,
                      const std::string& where) {
  if (staged_names.size() != staged.size()) {
    throw SwapError(std::to_string(staged_names.size()) + " staged names but " +
                    std::to_string(staged.size()) + " staged tensors");
  }
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < staged_names.size(); ++i) by_name.emplace(staged_names[i], i);
  // Every name of each target tensor, in order: a tie is staged under any of them.
  std::unordered_map<const c10::TensorImpl*, std::vector<size_t>> names_of;
  std::unordered_set<std::string> known;
  for (size_t i = 0; i < targets.size(); ++i) {
    names_of[targets[i].tensor.unsafeGetTensorImpl()].push_back(i);
    known.insert(targets[i].name);
  }
  SwapPairs out;
  std::vector<MismatchItem> missing, unexpected, mismatched;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const StagedTarget& t : targets) {
    const c10::TensorImpl* impl = t.tensor.unsafeGetTensorImpl();
    if (!seen.insert(impl).second) continue;  // a tie is checked once, as it is staged once
    const at::Tensor* s = nullptr;
    for (size_t j : names_of[impl]) {
      auto it = by_name.find(targets[j].name);
      if (it != by_name.end()) {
        s = &staged[it->second];
        break;
      }
    }
    if (s == nullptr) {
      if (strict && t.required) missing.push_back({t.name, " " + shape_str(t.tensor.sizes())});
      continue;  // strict=False: left as it is
    }
    const std::string problem = pair_problem(t, *s, where);
    if (!problem.empty()) {
      mismatched.push_back({t.name, problem});
      continue;
    }
    out.targets.push_back(t.tensor);
    out.sources.push_back(*s);
    out.names.push_back(t.name);
  }
  if (strict) {
    for (const std::string& n : staged_names)
      if (!known.count(n)) unexpected.push_back({n, ""});
  }
  const size_t problems = missing.size() + unexpected.size() + mismatched.size();
  if (problems > 0) {
    throw MismatchError(
        where + " does not fit the module: " + std::to_string(problems) + " problems",
        std::move(missing), std::move(unexpected), std::move(mismatched));
  }
  return out;
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

// Python: torch.ops.metaload.pair_staged(targets, names, required, plain, staged_names, staged,
// strict, where) -> (targets, sources, names), for swap_tensors after the vote.
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<std::string>>
pair_staged_op(at::TensorList targets, std::vector<std::string> names, c10::List<bool> required,
               c10::List<bool> plain, std::vector<std::string> staged_names, at::TensorList staged,
               bool strict, std::string where) {
  if (names.size() != targets.size() || required.size() != targets.size() ||
      plain.size() != targets.size()) {
    throw SwapError("pair_staged: targets, names, required and plain differ in length");
  }
  std::vector<StagedTarget> t;
  for (size_t i = 0; i < targets.size(); ++i)
    t.push_back({names[i], targets[i], required[i], plain[i]});
  SwapPairs p = pair_staged(t, staged_names, staged.vec(), strict, where);
  return {std::move(p.targets), std::move(p.sources), std::move(p.names)};
}

}  // namespace

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def(
      "pair_staged(Tensor[] targets, str[] names, bool[] required, bool[] plain, "
      "str[] staged_names, Tensor[] staged, bool strict, str where) -> (Tensor[], Tensor[], str[])",
      &pair_staged_op);
  m.def(
      "swap_tensors(Tensor(a!)[] targets, Tensor[] sources, str[]? names=None, "
      "bool meta_takes_shape=False) -> ()",
      &swap_tensors_op);
}

}  // namespace metaload
