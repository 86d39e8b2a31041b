#include "fake_mode/fake_tensor.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <typeinfo>

#include "c10_ext/mode_key.h"
#include "fake_mode/fake_mode.h"

namespace metaload {

namespace detail {
int& fake_kernel_depth() {
  thread_local int depth = 0;
  return depth;
}
}  // namespace detail

c10::DispatchKeySet fake_key_set(c10::Device device) {
  // TensorImpl's constructor adds the backend's autograd and autocast keys.
  return c10::DispatchKeySet(c10::computeDispatchKey(c10::nullopt, c10::kStrided, device))
      .add(c10::DispatchKey::Fake);
}

FakeTensorImpl::FakeTensorImpl(c10::Storage storage, caffe2::TypeMeta dtype, c10::Device device)
    : c10::TensorImpl(std::move(storage), fake_key_set(device), dtype), fake_device_(device) {
  ensure_fake_key_registered();  // ops on this tensor need the fallback (an atomic load after once)
  device_opt_ = device;
  set_custom_device(true);
}

c10::Device FakeTensorImpl::device_custom() const {
  return detail::fake_kernel_depth() > 0 ? c10::Device(c10::kMeta) : fake_device_;
}

bool FakeTensorImpl::has_storage() const {
  if (detail::fake_kernel_depth() > 0) return static_cast<bool>(storage_);
  throw DataDependentError(
      "the data of a fake tensor was accessed (" + std::string(data_type_.name()) + " " +
      c10::str(sizes()) + " on " + fake_device_.str() +
      "): fake tensors have shapes, dtypes and devices only; data_ptr, item() and printing "
      "values need a real tensor");
}

c10::intrusive_ptr<c10::TensorImpl> FakeTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<FakeTensorImpl>(storage_, data_type_, fake_device_);
  copy_tensor_metadata(this, impl.get(), version_counter, allow_tensor_metadata_change);
  impl->device_opt_ = fake_device_;
  impl->refresh_numel();
  impl->refresh_contiguous();
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> FakeTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<FakeTensorImpl>(storage_, data_type_, fake_device_);
  copy_tensor_metadata(this, impl.get(), std::move(version_counter), allow_tensor_metadata_change);
  impl->device_opt_ = fake_device_;
  impl->refresh_numel();
  impl->refresh_contiguous();
  return impl;
}

void FakeTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  copy_tensor_metadata(impl.get(), this, version_counter(), allow_tensor_metadata_change());
  if (auto* fake = dynamic_cast<const FakeTensorImpl*>(impl.get()))
    fake_device_ = fake->fake_device_;
  device_opt_ = fake_device_;
  refresh_numel();
  refresh_contiguous();
}

namespace {

// Asked for every tensor of every op in FakeMode: the Fake key first, then an exact type check
// (FakeTensorImpl is final), which is cheaper than a dynamic_cast.
const FakeTensorImpl* as_fake(const c10::TensorImpl* impl) {
  if (!impl->key_set().has(c10::DispatchKey::Fake) || typeid(*impl) != typeid(FakeTensorImpl)) {
    return nullptr;
  }
  return static_cast<const FakeTensorImpl*>(impl);
}

}  // namespace

bool is_fake(const at::Tensor& t) {
  return t.defined() && as_fake(t.unsafeGetTensorImpl()) != nullptr;
}

c10::Device claimed_device(const at::Tensor& t) {
  if (const FakeTensorImpl* fake = as_fake(t.unsafeGetTensorImpl())) return fake->fake_device();
  return t.device();
}

at::Tensor make_fake(const at::Tensor& meta, c10::Device device) {
  auto impl = c10::make_intrusive<FakeTensorImpl>(meta.storage(), meta.dtype(), device);
  impl->set_sizes_and_strides(meta.sizes(), meta.strides(), meta.storage_offset());
  return at::Tensor(std::move(impl));
}

at::Tensor empty_fake(at::IntArrayRef sizes, at::ScalarType dtype, c10::Device device) {
  at::Tensor meta;
  {
    c10::impl::ExcludeDispatchKeyGuard no_fake(c10::DispatchKey::Fake);
    c10::impl::ExcludeDispatchKeyGuard no_mode(kMetaModeKey);
    meta = at::empty(sizes, at::TensorOptions().dtype(dtype).device(c10::kMeta));
  }
  return make_fake(meta, device);
}

}  // namespace metaload
