// Every difference between the libtorch versions metaload builds against (Debian's 1.13, PyPI's
// 2.x) lives here and nowhere else: other files use the names below, each saying what differs,
// and contain no version test of their own (tests/python/test_torch_compat.py checks this). The
// behaviour flags are constants, so code that branches on them compiles both ways on every
// version and only the branch of this libtorch runs.
#pragma once

#include <c10/core/Scalar.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>
#include <torch/version.h>

#include <cstddef>
#include <cstdint>
#include <string>

#define METALOAD_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// ---- The version itself ----
// "1.13.0", "2.11.0": the libtorch a translation unit is compiled against, as a string literal.
#define METALOAD_TORCH_STR2(x) #x
#define METALOAD_TORCH_STR(x) METALOAD_TORCH_STR2(x)
#define METALOAD_TORCH_VERSION_STRING     \
  METALOAD_TORCH_STR(TORCH_VERSION_MAJOR) \
  "." METALOAD_TORCH_STR(TORCH_VERSION_MINOR) "." METALOAD_TORCH_STR(TORCH_VERSION_PATCH)

// ---- c10::Allocator ----
// 2.x made allocate() non-const and added a pure copy_data(). An allocator written as
//   struct A final : c10::Allocator {
//     c10::DataPtr allocate(size_t n) METALOAD_ALLOCATE_CONST override;
//     METALOAD_ALLOCATOR_COPY_DATA ... };
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

// ---- torch's Python dispatch modes ----
// Whether torch's FakeTensorMode is on for this thread. 2.1+ keeps it in the dispatch-mode stack's
// FAKE slot; 1.13 has no such slot (and metaload's scopes do not interact with its FakeTensorMode).
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

// ---- torch's Python bindings: lazy device initialisation ----
// The bindings initialise CUDA (torch.cuda._lazy_init)
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

// A device argument that reached a mode's kernel went through torch's binding, which metaload's
// Python package told the device was initialised (python/metaload/_device_init.py): undo that at
// once, so a thread doing real work still gets torch's full initialisation on its first use. Both
// modes (c10_ext/mode.cc, fake_mode/fake_mode.cc) call this for every device argument they see.
inline void require_device_init_again_after(c10::DeviceType type) {
  if (type != c10::kCPU && type != c10::kMeta) require_device_init_again(type);
}
}  // namespace metaload
// ---- SymInt[] arguments read back as plain ints ----
// 2.x has a macro that records the call
// site, 1.13 a one-argument function. Shape kernels run on concrete sizes only (no symbolic
// shapes), so both simply read the ints. (Detected by the macro itself rather than the version: it
// appeared within the 2.x series.)
#if defined(C10_AS_INTARRAYREF_SLOW)
#define METALOAD_SYMINTS(x) C10_AS_INTARRAYREF_SLOW(x)
#else
#define METALOAD_SYMINTS(x) c10::asIntArrayRefSlow(x)
#endif

namespace metaload::compat {

// ---- Warning handlers ----
// c10::WarningHandler::process takes one c10::Warning in 2.x and (location, message, verbatim) in
// 1.13; the handler get/set functions and the guard moved from c10::Warning to c10::WarningUtils.
// A handler derives from WarningMessageHandler and overrides on_warning(message) instead.
class WarningMessageHandler : public c10::WarningHandler {
 public:
  virtual void on_warning(const std::string& message) = 0;
#if METALOAD_TORCH_AT_LEAST(2, 0)
  void process(const c10::Warning& warning) final {
    on_warning(warning.msg());
  }
#else
  void process(const c10::SourceLocation&, const std::string& message, const bool) final {
    on_warning(message);
  }
#endif
};

#if METALOAD_TORCH_AT_LEAST(2, 0)
using WarningHandlerGuard = c10::WarningUtils::WarningHandlerGuard;
inline c10::WarningHandler* warning_handler() {
  return c10::WarningUtils::get_warning_handler();
}
inline void set_warning_handler(c10::WarningHandler* h) {
  c10::WarningUtils::set_warning_handler(h);
}
#else
using WarningHandlerGuard = c10::Warning::WarningHandlerGuard;
inline c10::WarningHandler* warning_handler() {
  return c10::Warning::get_warning_handler();
}
inline void set_warning_handler(c10::WarningHandler* h) {
  c10::Warning::set_warning_handler(h);
}
#endif

// ---- Operator schemas ----
// var/std(.correction)
// take `int? correction` in 1.13 and `Scalar? correction` from 2.0 on.
#if METALOAD_TORCH_AT_LEAST(2, 0)
using VarCorrectionArg = const c10::optional<c10::Scalar>&;
#else
using VarCorrectionArg = c10::optional<int64_t>;
#endif

inline constexpr bool kTorch2 = METALOAD_TORCH_AT_LEAST(2, 0);

// aten::_native_batch_norm_legit (and its .no_stats / _no_training forms): 2.x split
// native_batch_norm into these; 1.13 has none of them.
inline constexpr bool kAtenHasNativeBatchNormLegit = kTorch2;

// 1.13's C++ has no Meta kernel for the ops real models need (convolution, the norms, relu,
// where, index_select, ...), so metaload's serve all of them; 2.x brings some of its own.
inline constexpr bool kAtenLacksModelMetaKernels = !kTorch2;

// aten::diag.out: a kernel of metaload's in 1.13 (its message for a 3-d input: "matrix or a
// vector expected"), torch's composite in 2.x ("Supports 1D or 2D tensors. Got 3D").
inline constexpr bool kAtenDiagOutIsComposite = kTorch2;

// ---- What the CPU kernels do, which the Meta kernels in kernels/ follow ----
// Convolution: 2.x's transposed CPU backends give channels-last outputs
// for channels-last inputs or weights as the others do; 1.13's are always contiguous.
inline constexpr bool kCpuConvTransposedFollowsChannelsLast = kTorch2;
// Convolution: 2.x runs 3-d convolutions through oneDNN when it is worth it, and those come out
// channels-last-3d for channels-last-3d inputs or weights (not for double); 1.13's are contiguous.
inline constexpr bool kCpuConv3dMkldnnChannelsLast3d = kTorch2;
// Batch norm: 2.x's fast path also takes channels-last-3d inputs (1.13's: contiguous or 2-d
// channels-last only), which decides the output layout.
inline constexpr bool kCpuBatchNormFastPathChannelsLast3d = kTorch2;
// Group norm: 2.x takes Float weight/bias with a BFloat16/Half input ("mixed type"; mean and rstd
// are then Float); 1.13 wants the input's dtype throughout.
inline constexpr bool kCpuGroupNormMixedDtype = kTorch2;
// _masked_softmax: 2.x infers the mask type from the ranks ((B, L) padding mask, (L, L) attention
// mask, else the input's shape) and checks the dtype before the type; 1.13 wants a mask of the
// input's shape unless typed 0 or 1 with the matching 2-d shape.
inline constexpr bool kCpuMaskedSoftmaxInfersMaskType = kTorch2;
// max_pool3d: 2.x's kernel takes contiguous or channels-last-3d inputs (and refuses others) and
// keeps that layout; 1.13's returns contiguous outputs whatever the input.
inline constexpr bool kCpuMaxPool3dChannelsLast3d = kTorch2;
// reflection_pad2d: 2.x gives a batched output the input's suggested memory format; 1.13
// contiguous.
inline constexpr bool kCpuReflectionPad2dKeepsFormat = kTorch2;
// Float casts: 1.13's CPU casts produce the scalar conversion's NaN bits (kernels/convert_bits.h
// reproduces them exactly); 2.x vectorizes some directions with other NaN bits.
inline constexpr bool kCpuCastNanBitsAreScalar = !kTorch2;

}  // namespace metaload::compat

// ---- CPU kernels that changed after 1.13 (kernels/meta_reductions.cc, meta_linalg.cc) ----
// The Meta kernels follow the CPU kernel of the libtorch they run on. Each entry names a
// difference seen between Debian's 1.13 and PyPI's 2.11 (the 2.x release that made it is not
// pinned).

// rrelu_with_noise's `noise` became a mutable argument (Tensor(b!)): its C++ type in a kernel.
#if METALOAD_TORCH_AT_LEAST(2, 0)
#define METALOAD_RRELU_NOISE_ARG at::Tensor&
#else
#define METALOAD_RRELU_NOISE_ARG const at::Tensor&
#endif

namespace metaload::compat {
// rrelu_with_noise rejects a noise tensor whose shape is not self's.
inline constexpr bool kRreluChecksNoiseShape = METALOAD_TORCH_AT_LEAST(2, 0);
// multi_margin_loss rejects a weight that does not hold one entry per class.
inline constexpr bool kMultiMarginLossChecksWeight = METALOAD_TORCH_AT_LEAST(2, 0);
// segment_reduce accepts "amax" and "amin" as reductions.
inline constexpr bool kSegmentReduceTakesAmaxAmin = METALOAD_TORCH_AT_LEAST(2, 0);
// segment_reduce accepts data with no elements.
inline constexpr bool kSegmentReduceTakesEmptyData = METALOAD_TORCH_AT_LEAST(2, 0);
// ormqr requires one reflector per column it can apply:
// tau.shape[-1] == min(other.shape[side], input.shape[-1]).
inline constexpr bool kOrmqrChecksTauLength = METALOAD_TORCH_AT_LEAST(2, 0);
// linalg_matrix_exp of matrices larger than 1x1 returns a contiguous tensor (1.13: empty_like of
// its (-1, n, n) view).
inline constexpr bool kMatrixExpIsContiguous = METALOAD_TORCH_AT_LEAST(2, 0);
}  // namespace metaload::compat
