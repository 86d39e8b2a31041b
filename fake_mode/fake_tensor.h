// Fake tensors: sizes, strides, dtype and autograd history of a tensor on a real device (cpu or
// cuda:N), with no memory. A fake tensor claims its device even on a build without CUDA; while one
// of metaload's fake kernels runs, it reports the meta device so that libtorch's Meta kernels
// compute its results. Touching its data raises DataDependentError.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>

namespace metaload {

class FakeTensorImpl final : public c10::TensorImpl {
 public:
  // `storage` is a meta storage (it records nbytes, holds no memory).
  FakeTensorImpl(c10::Storage storage, caffe2::TypeMeta dtype, c10::Device device);

  // The device this tensor claims.
  c10::Device fake_device() const { return fake_device_; }

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter,
      bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

  // Outside a fake kernel, asking for the storage (data_ptr, printing values) is a data read.
  bool has_storage() const override;

 protected:
  c10::Device device_custom() const override;
  const char* tensorimpl_type_name() const override { return "FakeTensorImpl"; }

 private:
  c10::Device fake_device_;
};

// The dispatch keys of a fake tensor on `device`: the device's backend and autograd keys plus Fake.
c10::DispatchKeySet fake_key_set(c10::Device device);

bool is_fake(const at::Tensor& t);

// The device a tensor counts as inside fake mode: a fake tensor's claimed device; otherwise its
// own.
c10::Device claimed_device(const at::Tensor& t);

// A fake tensor with `meta`'s sizes, strides, offset and storage, claiming `device`.
at::Tensor make_fake(const at::Tensor& meta, c10::Device device);

// A fake tensor of the given shape and dtype, contiguous, claiming `device`.
at::Tensor empty_fake(at::IntArrayRef sizes, at::ScalarType dtype, c10::Device device);

namespace detail {
// While > 0 on a thread, fake tensors report the meta device (a fake kernel is running).
int& fake_kernel_depth();
}  // namespace detail

}  // namespace metaload
