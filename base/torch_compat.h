// Every difference between the libtorch versions metaload builds against (Debian's 1.13 here,
// pip's 2.x elsewhere) lives here, behind TORCH_VERSION_MAJOR / TORCH_VERSION_MINOR checks.
#pragma once

#include <torch/version.h>

#define METALOAD_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// ---- c10::Allocator
// ------------------------------------------------------------------------------ 2.x made
// allocate() non-const and added a pure copy_data(). An allocator written as
//   struct A final : c10::Allocator { c10::DataPtr allocate(size_t n) METALOAD_ALLOCATE_CONST
//   override;
//                                     METALOAD_ALLOCATOR_COPY_DATA ... };
// compiles on both.
#if METALOAD_TORCH_AT_LEAST(2, 0)
#define METALOAD_ALLOCATE_CONST
#define METALOAD_ALLOCATOR_COPY_DATA                                              \
  void copy_data(void* dest, const void* src, std::size_t count) const override { \
    default_copy_data(dest, src, count);                                          \
  }
#else
#define METALOAD_ALLOCATE_CONST const
#define METALOAD_ALLOCATOR_COPY_DATA
#endif

// ---- torch's Python dispatch modes
// --------------------------------------------------------------- Whether torch's FakeTensorMode is
// on for this thread. 2.1+ keeps it in the dispatch-mode stack's FAKE slot; 1.13 has no such slot
// (and metaload's scopes do not interact with its FakeTensorMode).
#if METALOAD_TORCH_AT_LEAST(2, 1)
#include <c10/core/impl/TorchDispatchModeTLS.h>
namespace metaload {
inline bool torch_fake_mode_is_on() {
  using c10::impl::TorchDispatchModeTLS;
  return TorchDispatchModeTLS::any_modes_set() &&
         TorchDispatchModeTLS::get_mode(c10::impl::TorchDispatchModeKey::FAKE).has_value();
}
}  // namespace metaload
#else
namespace metaload {
inline bool torch_fake_mode_is_on() {
  return false;
}
}  // namespace metaload
#endif

// ---- torch's Python bindings: lazy device initialisation
// ------------------------------------------ The bindings initialise CUDA (torch.cuda._lazy_init)
// before any call with a cuda device unless a flag in libtorch_python says it is done. metaload's
// Python package lets that flag be set while it forces tensors onto meta;
// require_device_init_again(type) clears it, through the setter libtorch_python exports (2.x: per
// device type; 1.13: cuda only). Looked up at run time: C++ programs have no libtorch_python, and
// then there is nothing to clear.
#include <c10/core/DeviceType.h>
#include <dlfcn.h>
namespace metaload {
namespace compat_detail {
// A symbol of libtorch_python, looked up once: in a Python process torch has loaded it before any
// call can reach metaload's kernels; a C++ program has none (nullptr, also remembered).
inline void* torch_python_symbol(const char* symbol) {
  void* found = nullptr;
  for (const char* name : {"libtorch_python.so", "libtorch_python.so.1.13"}) {
    if (void* lib = dlopen(name, RTLD_LAZY | RTLD_NOLOAD)) {
      found = dlsym(lib, symbol);
      dlclose(lib);  // NOLOAD took a reference; the library stays loaded by torch
      if (found) break;
    }
  }
  return found;
}
}  // namespace compat_detail

inline void require_device_init_again(c10::DeviceType type) {
#if METALOAD_TORCH_AT_LEAST(2, 0)
  using Setter = void (*)(c10::DeviceType, bool);
  static const auto setter = reinterpret_cast<Setter>(compat_detail::torch_python_symbol(
      "_ZN5torch5utils24set_requires_device_initEN3c1010DeviceTypeEb"));
  if (setter) setter(type, true);
#else
  using Setter = void (*)(bool);
  static const auto setter = reinterpret_cast<Setter>(
      compat_detail::torch_python_symbol("_ZN5torch5utils22set_requires_cuda_initEb"));
  if (setter && type == c10::kCUDA) setter(true);
#endif
}
}  // namespace metaload
