// Internal to kernels/: what every Meta kernel file shares -- output allocation without the
// dispatcher, the memory-format rules of the CPU kernels, argument checks that throw ShapeError,
// and the table entry type the registry walks.
#pragma once

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/util/StringUtil.h>
#include <torch/library.h>

#include <vector>

#include "base/torch_compat.h"
#include "kernels/meta_registry.h"

namespace metaload::meta {

// var/std(.correction)'s correction argument (its type differs between versions).
using CorrectionArg = compat::VarCorrectionArg;

using at::IntArrayRef;
using at::ScalarType;
using at::Tensor;
using c10::MemoryFormat;

// ---- registration table -------------------------------------------------------------------

// One Meta kernel: the op ("relu", "where.self"; a name with "::" names its own namespace) and a
// function that puts the kernel on a Meta-keyed torch::Library.
struct KernelDef {
  const char* op;
  void (*add)(torch::Library&);
};

// The debug string of every kernel we register; the registry recognises its own kernels by it.
constexpr const char* kKernelDebug = "registered by metaload (kernels/)";

// Registers `fn` for `name` on the Meta library `m`, tagged as ours.
#define METALOAD_META_KERNEL(name, fn)                                                      \
  ::metaload::meta::KernelDef {                                                             \
    name, [](torch::Library& m) {                                                           \
      m.impl(name, torch::CppFunction(TORCH_FN(fn)).debug(::metaload::meta::kKernelDebug)); \
    }                                                                                       \
  }

// Registers the kernels of `defs` that are missing (or only Python-registered), recording what it
// did in `round`; ensure_meta_kernels() runs it over the full table. For tests with their own ops.
std::vector<std::string> ensure_kernels(const std::vector<KernelDef>& defs,
                                        MetaKernelReport* round = nullptr);

// The tables of the kernel files (one per translation unit).
const std::vector<KernelDef>& conv_norm_kernels();
const std::vector<KernelDef>& pool_kernels();
const std::vector<KernelDef>& pointwise_index_kernels();
const std::vector<KernelDef>& linalg_kernels();
const std::vector<KernelDef>& reduction_kernels();

// ---- errors -------------------------------------------------------------------------------

template <typename... Args>
[[noreturn]] C10_NOINLINE void fail(const char* op, const Args&... args) {
  throw ShapeError(c10::str(op, ": ", args...));
}

// META_CHECK(cond, "op", message parts...): ShapeError "op: message" unless cond holds.
#define META_CHECK(cond, op, ...)              \
  do {                                         \
    if (C10_UNLIKELY(!(cond))) {               \
      ::metaload::meta::fail(op, __VA_ARGS__); \
    }                                          \
  } while (0)

// Wraps a possibly negative dim into [0, ndim) or throws like maybe_wrap_dim (a 0-dim tensor
// accepts dims 0 and -1).
int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim);

// Fails unless `list` has `n` entries (or 1 when `allow_single`); returns it expanded to n.
c10::SmallVector<int64_t, 4> expand_param(const char* op, const char* what, IntArrayRef list,
                                          int64_t n, bool allow_single = true);

// ---- SymInt ---------------------------------------------------------------------------------

inline int64_t concrete(const c10::SymInt& s) {
  return s.expect_int();
}
inline IntArrayRef concrete(c10::SymIntArrayRef s) {
  return METALOAD_SYMINTS(s);
}

// ---- output allocation (no dispatcher round trip, like the generated Meta kernels) -----------

inline Tensor new_meta(IntArrayRef sizes, IntArrayRef strides, ScalarType dtype) {
  return Tensor(at::detail::empty_strided_meta(sizes, strides, dtype));
}
Tensor new_meta(IntArrayRef sizes, ScalarType dtype,
                MemoryFormat format = MemoryFormat::Contiguous);

// at::empty_like(t, dtype, format) on meta: Preserve keeps t's strides when t is non-overlapping
// and dense, keeps its dimension order otherwise; other formats as at::empty.
Tensor new_meta_like(const Tensor& t, ScalarType dtype,
                     MemoryFormat format = MemoryFormat::Preserve);

// The strides `t.to(dtype)` (or `.contiguous(format)`) gives: as new_meta_like with Preserve,
// except that a non-dense input becomes dense in t.suggest_memory_format() (that is what
// _to_copy does).
Tensor converted_like(const Tensor& t, ScalarType dtype);

// A tensor viewing base's storage (what select/slice of a freshly allocated output gives).
Tensor view_of(const Tensor& base, IntArrayRef sizes, IntArrayRef strides, int64_t offset);

// Resizes an out= tensor the way at::native::resize_output does (warning when a non-empty
// tensor of another shape is resized; `warn` false for kernels that call resize_ directly), then
// restrides it to `strides` (contiguous if empty). Nothing happens when the sizes already match.
// Returns whether it resized.
bool resize_out(const Tensor& out, IntArrayRef sizes, IntArrayRef strides = {}, bool warn = true);

// Sizes and strides of contiguous / channels-last layouts.
c10::SmallVector<int64_t, 5> contiguous_strides(IntArrayRef sizes);
c10::SmallVector<int64_t, 5> format_strides(IntArrayRef sizes, MemoryFormat format);

// t.suggest_memory_format() computed from sizes and strides alone (for views that are not made).
MemoryFormat suggest_format(IntArrayRef sizes, IntArrayRef strides);

}  // namespace metaload::meta
