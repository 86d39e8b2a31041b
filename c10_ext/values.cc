// Values of small meta tensors: host memory behind a meta storage (values.h).
#include "c10_ext/values.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "base/torch_library.h"
#include "c10_ext/mode_key.h"

namespace metaload {
namespace {

// The buffer: its capacity first, the values 64 bytes in (aligned for every dtype). The deleter's
// address marks a storage as "holds values": a storage resized afterwards (meta resize only
// changes nbytes) is checked against the capacity, never read past it.
constexpr size_t kHeader = 64;

void free_values(void* ctx) {
  std::free(ctx);
}

size_t capacity(const c10::DataPtr& dp) {
  return *static_cast<const size_t*>(dp.get_context());
}

size_t bytes_viewed(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  return at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.element_size(),
                                          static_cast<size_t>(t.storage_offset()));
}

}  // namespace

bool has_values(const at::Tensor& t) {
  if (!t.defined() || !t.is_meta() || !t.has_storage()) return false;
  const c10::DataPtr& dp = t.storage().data_ptr();
  return dp.get_deleter() == &free_values && bytes_viewed(t) <= capacity(dp);
}

at::Tensor values_alias(const at::Tensor& t) {
  auto* base = static_cast<char*>(t.storage().data_ptr().get());
  return at::from_blob(base + t.storage_offset() * t.element_size(), t.sizes(), t.strides(),
                       at::TensorOptions().dtype(t.scalar_type()).device(c10::kCPU));
}

bool attach_values(const at::Tensor& meta, const at::Tensor& values) {
  if (!meta.defined() || !meta.is_meta() || !meta.has_storage() ||
      meta.numel() > kMaxValueElements || !values.defined() || !values.device().is_cpu() ||
      meta.sizes() != values.sizes() || meta.scalar_type() != values.scalar_type()) {
    return false;
  }
  c10::StorageImpl* impl = meta.storage().unsafeGetStorageImpl();
  // Only a storage of its own, with no memory yet: a view of another tensor's storage must not
  // give that tensor values for the elements it alone holds.
  if (c10::raw::intrusive_ptr::use_count(impl) != 1 || impl->data() != nullptr) return false;
  const size_t n = std::max(impl->nbytes(), bytes_viewed(meta));
  void* block = std::calloc(1, kHeader + n);
  if (!block) throw std::bad_alloc();
  *static_cast<size_t*>(block) = n;
  impl->set_data_ptr_noswap(c10::DataPtr(static_cast<char*>(block) + kHeader, block, &free_values,
                                         c10::Device(c10::kMeta)));
  values_alias(meta).copy_(values);
  return true;
}

void forget_values(const at::Tensor& t) {
  if (!t.defined() || !t.is_meta() || !t.has_storage()) return;
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  if (impl->data_ptr().get_deleter() != &free_values) return;
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, c10::Device(c10::kMeta)));
}

namespace {

// Python: torch.ops.metaload.values_of(t) -> a CPU copy of the values a meta tensor carries, or
// None (load_into materialises non-persistent buffers from them). The copy is made outside the
// meta mode, which would turn it into one more meta tensor.
c10::optional<at::Tensor> values_of_op(const at::Tensor& t) {
  if (!has_values(t)) return c10::nullopt;
  c10::impl::ExcludeDispatchKeyGuard real(kMetaModeKey);
  return values_alias(t).clone();
}

}  // namespace

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def("values_of(Tensor t) -> Tensor?", &values_of_op);
}

}  // namespace metaload
