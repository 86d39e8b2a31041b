// The table of libtorch's C++ shape kernels that metaload calls directly (native_meta.h says why).
//
// An entry names an op and the C++ function that libtorch itself runs for it on meta tensors:
// at::meta::<op> (the Meta kernel the dispatcher has, inactive under a Python one), or the op's
// CompositeExplicitAutograd kernel. Where that composite kernel would dispatch nested ops (and
// land in Python again), the entry is a small function here that makes the same calls to
// at::meta:: directly. Each entry's signature is checked against the op's schema before its first
// use; one that does not fit is never called.
#include "kernels/native_meta.h"

#include <ATen/CompositeExplicitAutogradFunctions.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MetaFunctions.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/op_registration/infer_schema.h>
#include <c10/core/DispatchKey.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "base/torch_library.h"
#include "kernels/meta_common.h"
#include "kernels/meta_registry.h"

namespace metaload {
namespace native_meta {
namespace {

using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;
using c10::optional;

// ---- kernels that stand for a composite one ---------------------------------------------------
// Each computes what the op's CompositeExplicitAutograd kernel computes, but calls at::meta::
// where that kernel dispatches (to a Meta key that Python serves).

// add/sub/mul/div with a Scalar: the composite kernels wrap the scalar the same way.
Tensor add_scalar(const Tensor& self, const Scalar& other, const Scalar& alpha) {
  return at::meta::add(self, at::native::wrapped_scalar_tensor(other), alpha);
}
Tensor& add_scalar_(Tensor& self, const Scalar& other, const Scalar& alpha) {
  return at::meta::add_(self, at::native::wrapped_scalar_tensor(other), alpha);
}
Tensor sub_scalar(const Tensor& self, const Scalar& other, const Scalar& alpha) {
  return at::meta::sub(self, at::native::wrapped_scalar_tensor(other), alpha);
}
Tensor& sub_scalar_(Tensor& self, const Scalar& other, const Scalar& alpha) {
  return at::meta::sub_(self, at::native::wrapped_scalar_tensor(other), alpha);
}
Tensor mul_scalar(const Tensor& self, const Scalar& other) {
  return at::meta::mul(self, at::native::wrapped_scalar_tensor(other));
}
Tensor& mul_scalar_(Tensor& self, const Scalar& other) {
  return at::meta::mul_(self, at::native::wrapped_scalar_tensor(other));
}
Tensor div_scalar(const Tensor& self, const Scalar& other) {
  return at::meta::div(self, at::native::wrapped_scalar_tensor(other));
}
Tensor& div_scalar_(Tensor& self, const Scalar& other) {
  return at::meta::div_(self, at::native::wrapped_scalar_tensor(other));
}

// libtorch declares at::meta::relu_ but exports none: its Meta kernel is the CPU one, which checks
// the dtype and calls clamp_min_ (through the dispatcher).
Tensor& relu_(Tensor& self) {
  TORCH_CHECK(self.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
  return at::meta::clamp_min_(self, 0);
}

// clone: a tensor like self in the requested layout (empty_like, whose Meta kernel is Python's
// in 2.x), then a copy, which changes no shape.
Tensor clone(const Tensor& self, optional<c10::MemoryFormat> format) {
  return meta::new_meta_like(self, self.scalar_type(),
                             format.value_or(c10::MemoryFormat::Preserve));
}

// _safe_softmax (2.x, scaled_dot_product_attention's math path): softmax, with rows that are all
// -inf set to 0 by a where. The composite's 0-dim scalar tensors are made here without a value.
Tensor safe_softmax(const Tensor& self, int64_t dim, optional<ScalarType> dtype) {
  const Tensor input = dtype ? self.to(*dtype) : self;
  const Tensor out = at::meta::_softmax(input, dim, false);
  const Tensor scalar(at::detail::empty_meta({}, out.scalar_type(), c10::nullopt));
  const Tensor masked_rows = at::meta::all(at::meta::eq(self, scalar), dim, true);
  return at::where(masked_rows, scalar, out);
}

// cudnn_batch_norm, which batch_norm picks for tensors that claim cuda on a CUDA build: libtorch
// has no C++ shape kernel for it, and torch's Python one is its decomposition into
// native_batch_norm (metaload's C++ kernel) plus empty statistics in eval and an empty reserve
// space. This computes the same.
std::tuple<Tensor, Tensor, Tensor, Tensor> cudnn_batch_norm(
    const Tensor& input, const Tensor& weight, const optional<Tensor>& bias,
    const optional<Tensor>& running_mean, const optional<Tensor>& running_var, bool training,
    double momentum, double eps) {
  auto [out, mean, invstd] = at::native_batch_norm(input, weight, bias, running_mean, running_var,
                                                   training, momentum, eps);
  auto empty = [](ScalarType dtype) {
    return Tensor(at::detail::empty_meta({0}, dtype, c10::nullopt));
  };
  if (training) return {out, mean, invstd, empty(at::kByte)};
  return {out, empty(weight.scalar_type()), empty(weight.scalar_type()), empty(at::kByte)};
}

// Factories: the composite kernels are at::empty(...) or at::empty_like(...) (Python in 2.x),
// followed by a fill_, which changes no shape; the fake fallback has already put `meta` in the
// device argument. Only strided tensors: a sparse layout is refused as the Meta key refuses it.
void check_strided(optional<at::Layout> layout, const char* op) {
  TORCH_CHECK(layout.value_or(at::kStrided) == at::kStrided, op,
              ": metaload's fake tensors are strided; got layout ", *layout);
}
Tensor like(const Tensor& self, optional<ScalarType> dtype, optional<at::Layout> layout,
            optional<at::Device>, optional<bool>, optional<c10::MemoryFormat> format) {
  check_strided(layout, "empty_like");
  return meta::new_meta_like(self, dtype.value_or(self.scalar_type()),
                             format.value_or(c10::MemoryFormat::Preserve));
}
Tensor full_like(const Tensor& self, const Scalar&, optional<ScalarType> dtype,
                 optional<at::Layout> layout, optional<at::Device> device, optional<bool> pin,
                 optional<c10::MemoryFormat> format) {
  return like(self, dtype, layout, device, pin, format);
}
Tensor new_filled(const Tensor& self, IntArrayRef size, optional<ScalarType> dtype,
                  optional<at::Layout> layout, optional<at::Device>, optional<bool>) {
  check_strided(layout, "new_empty");
  return meta::new_meta(size, dtype.value_or(self.scalar_type()));
}
Tensor scalar_tensor(const Scalar&, optional<ScalarType> dtype, optional<at::Layout> layout,
                     optional<at::Device> device, optional<bool> pin_memory) {
  return at::detail::empty_meta({}, dtype, layout, device, pin_memory, c10::nullopt);
}
Tensor filled(IntArrayRef size, optional<ScalarType> dtype, optional<at::Layout> layout,
              optional<at::Device> device, optional<bool> pin_memory) {
  return at::detail::empty_meta(size, dtype, layout, device, pin_memory, c10::nullopt);
}

// ---- the table -------------------------------------------------------------------------------

enum class Kind : uint8_t {
  kMeta,       // at::meta::<op>: libtorch registered it for Meta
  kComposite,  // the op's CompositeExplicitAutograd behaviour
  kPython,     // libtorch has no shape behaviour for the op: what torch's Python kernel computes
};

struct Entry {
  const char* op;
  Kind kind;
  c10::KernelFunction (*make)();
  c10::FunctionSchema (*schema)();
};

template <class Sig, Sig* Fn>
c10::KernelFunction make_kernel() {
  return c10::KernelFunction::makeFromUnboxedFunction(c10::CompileTimeFunctionPointer<Sig, Fn>());
}

template <class Sig>
c10::FunctionSchema infer_schema() {
  return c10::inferFunctionSchemaFlattenedReturns<Sig>();
}

// `fn` is named with its signature, which picks one overload of an overloaded name.
#define NATIVE(kind, op, sig, fn)                        \
  Entry {                                                \
    op, kind, &make_kernel<sig, &fn>, &infer_schema<sig> \
  }
#define META(op, sig, fn) NATIVE(Kind::kMeta, op, sig, at::meta::fn)
#define COMPOSITE(op, sig, fn) NATIVE(Kind::kComposite, op, sig, fn)
#define AS_PYTHON(op, sig, fn) NATIVE(Kind::kPython, op, sig, fn)

using CT = const Tensor&;
using CS = const Scalar&;
using OptS = const optional<Scalar>&;
using OptT = const optional<Tensor>&;
using OptDtype = optional<ScalarType>;
using OptGen = optional<at::Generator>;
using Unary = Tensor(CT);
using UnaryIn = Tensor&(Tensor&);
using Binary = Tensor(CT, CT);
using BinaryIn = Tensor&(Tensor&, CT);
using BinaryAlpha = Tensor(CT, CT, CS);
using BinaryAlphaIn = Tensor&(Tensor&, CT, CS);
using ScalarAlpha = Tensor(CT, CS, CS);  // add.Scalar, sub.Scalar
using ScalarAlphaIn = Tensor&(Tensor&, CS, CS);
using WithScalar = Tensor(CT, CS);
using WithScalarIn = Tensor&(Tensor&, CS);
using Affine = Tensor(CT, CT, CT, CS, CS);  // addmm, baddbmm, addmv: beta * self + alpha * (a @ b)
using AffineIn = Tensor&(Tensor&, CT, CT, CS, CS);
using Pointwise3 = Tensor(CT, CT, CT, CS);  // addcmul, addcdiv
using Softmax = Tensor(CT, int64_t, bool);
using Reduce = Tensor(CT, at::OptionalIntArrayRef, bool, OptDtype);  // sum.dim_IntList, mean.dim
using ReduceDims = Tensor(CT, IntArrayRef, bool);                    // amax, amin
using ArgReduce = Tensor(CT, optional<int64_t>, bool);
using DimReduce = Tensor(CT, int64_t, bool);  // any.dim, all.dim
using Pair = std::tuple<Tensor, Tensor>;
using ValuesIndices = Pair(CT, int64_t, bool);
using Diagonal = Tensor(CT, int64_t);  // tril, triu
using Gelu = Tensor(CT, c10::string_view);
using GeluIn = Tensor&(Tensor&, c10::string_view);
using Clamp = Tensor(CT, OptS, OptS);
using ClampIn = Tensor&(Tensor&, OptS, OptS);
using Random = Tensor&(Tensor&, double, double, OptGen);
using CudnnBatchNorm = std::tuple<Tensor, Tensor, Tensor, Tensor>(CT, CT, OptT, OptT, OptT, bool,
                                                                  double, double);
using Like = Tensor(CT, OptDtype, optional<at::Layout>, optional<at::Device>, optional<bool>,
                    optional<c10::MemoryFormat>);
using FullLike = Tensor(CT, CS, OptDtype, optional<at::Layout>, optional<at::Device>,
                        optional<bool>, optional<c10::MemoryFormat>);
using New = Tensor(CT, IntArrayRef, OptDtype, optional<at::Layout>, optional<at::Device>,
                   optional<bool>);
using Factory = Tensor(IntArrayRef, OptDtype, optional<at::Layout>, optional<at::Device>,
                       optional<bool>);

// A comparison's Tensor and Scalar forms.
#define COMPARISONS(op) \
  META("aten::" #op ".Tensor", Binary, op), META("aten::" #op ".Scalar", WithScalar, op)

// The ops that dominate transformer and CNN forwards (measured: GPT-2, Llama, ViT, ResNet scans),
// their in-place forms, and the pointwise/reduction ops around them. Ops with a kernel in
// metaload's own table (relu, where, index_select, layer/batch norm, convolution, ...) are not
// here: that kernel is C++ already and serves Meta. A constant table: no code runs to build it.
const Entry kEntries[] = {
    // binary pointwise
    META("aten::add.Tensor", BinaryAlpha, add),
    META("aten::add_.Tensor", BinaryAlphaIn, add_),
    META("aten::sub.Tensor", BinaryAlpha, sub),
    META("aten::sub_.Tensor", BinaryAlphaIn, sub_),
    META("aten::mul.Tensor", Binary, mul),
    META("aten::mul_.Tensor", BinaryIn, mul_),
    META("aten::div.Tensor", Binary, div),
    META("aten::div_.Tensor", BinaryIn, div_),
    META("aten::div.Tensor_mode", Tensor(CT, CT, optional<c10::string_view>), div),
    META("aten::maximum", Binary, maximum),
    META("aten::minimum", Binary, minimum),
    META("aten::atan2", Binary, atan2),
    META("aten::pow.Tensor_Tensor", Binary, pow),
    META("aten::pow.Tensor_Scalar", WithScalar, pow),
    META("aten::pow_.Scalar", WithScalarIn, pow_),
    META("aten::pow.Scalar", Tensor(CS, CT), pow),
    META("aten::fmod.Tensor", Binary, fmod),
    META("aten::remainder.Tensor", Binary, remainder),
    COMPARISONS(eq),
    COMPARISONS(ne),
    COMPARISONS(lt),
    COMPARISONS(le),
    COMPARISONS(gt),
    COMPARISONS(ge),
    META("aten::bitwise_and.Tensor", Binary, bitwise_and),
    META("aten::bitwise_or.Tensor", Binary, bitwise_or),
    META("aten::bitwise_xor.Tensor", Binary, bitwise_xor),
    META("aten::lerp.Scalar", Tensor(CT, CT, CS), lerp),
    META("aten::lerp.Tensor", Tensor(CT, CT, CT), lerp),
    META("aten::addcmul", Pointwise3, addcmul),
    META("aten::addcdiv", Pointwise3, addcdiv),
    COMPOSITE("aten::add.Scalar", ScalarAlpha, add_scalar),
    COMPOSITE("aten::add_.Scalar", ScalarAlphaIn, add_scalar_),
    COMPOSITE("aten::sub.Scalar", ScalarAlpha, sub_scalar),
    COMPOSITE("aten::sub_.Scalar", ScalarAlphaIn, sub_scalar_),
    COMPOSITE("aten::mul.Scalar", WithScalar, mul_scalar),
    COMPOSITE("aten::mul_.Scalar", WithScalarIn, mul_scalar_),
    COMPOSITE("aten::div.Scalar", WithScalar, div_scalar),
    COMPOSITE("aten::div_.Scalar", WithScalarIn, div_scalar_),
    // unary pointwise and activations
    META("aten::neg", Unary, neg),
    META("aten::neg_", UnaryIn, neg_),
    META("aten::exp", Unary, exp),
    META("aten::exp_", UnaryIn, exp_),
    META("aten::log", Unary, log),
    META("aten::sqrt", Unary, sqrt),
    META("aten::rsqrt", Unary, rsqrt),
    META("aten::reciprocal", Unary, reciprocal),
    META("aten::sin", Unary, sin),
    META("aten::cos", Unary, cos),
    META("aten::tanh", Unary, tanh),
    META("aten::tanh_", UnaryIn, tanh_),
    META("aten::sigmoid", Unary, sigmoid),
    META("aten::sigmoid_", UnaryIn, sigmoid_),
    META("aten::erf", Unary, erf),
    META("aten::sign", Unary, sign),
    META("aten::floor", Unary, floor),
    META("aten::ceil", Unary, ceil),
    META("aten::round", Unary, round),
    META("aten::trunc", Unary, trunc),
    META("aten::log1p", Unary, log1p),
    META("aten::expm1", Unary, expm1),
    META("aten::gelu", Gelu, gelu),
    META("aten::gelu_", GeluIn, gelu_),
    META("aten::silu", Unary, silu),
    META("aten::silu_", UnaryIn, silu_),
    NATIVE(Kind::kMeta, "aten::relu_", UnaryIn, relu_),
    META("aten::mish", Unary, mish),
    META("aten::hardsigmoid", Unary, hardsigmoid),
    META("aten::leaky_relu", WithScalar, leaky_relu),
    META("aten::leaky_relu_", WithScalarIn, leaky_relu_),
    META("aten::elu", Tensor(CT, CS, CS, CS), elu),
    META("aten::softplus", Tensor(CT, CS, CS), softplus),
    META("aten::threshold", Tensor(CT, CS, CS), threshold),
    META("aten::clamp", Clamp, clamp),
    META("aten::clamp.Tensor", Tensor(CT, OptT, OptT), clamp),
    META("aten::clamp_", ClampIn, clamp_),
    META("aten::clamp_min", WithScalar, clamp_min),
    META("aten::clamp_max", WithScalar, clamp_max),
    // matrix products
    META("aten::mm", Binary, mm),
    META("aten::bmm", Binary, bmm),
    META("aten::addmm", Affine, addmm),
    META("aten::addmm_", AffineIn, addmm_),
    META("aten::baddbmm", Affine, baddbmm),
    META("aten::baddbmm_", AffineIn, baddbmm_),
    META("aten::addmv", Affine, addmv),
    // softmax and reductions
    META("aten::_softmax", Softmax, _softmax),
    META("aten::_log_softmax", Softmax, _log_softmax),
    META("aten::sum.dim_IntList", Reduce, sum),
    META("aten::mean.dim", Reduce, mean),
    META("aten::amax", ReduceDims, amax),
    META("aten::amin", ReduceDims, amin),
    META("aten::argmax", ArgReduce, argmax),
    META("aten::argmin", ArgReduce, argmin),
    META("aten::any.dim", DimReduce, any),
    META("aten::all.dim", DimReduce, all),
    META("aten::max.dim", ValuesIndices, max),
    META("aten::min.dim", ValuesIndices, min),
    META("aten::cumsum", Tensor(CT, int64_t, OptDtype), cumsum),
    META("aten::topk", Pair(CT, int64_t, int64_t, bool, bool), topk),
    META("aten::sort.stable", Pair(CT, optional<bool>, int64_t, bool), sort),
    // joining, masking, gathering
    META("aten::cat", Tensor(const at::ITensorListRef&, int64_t), cat),
    META("aten::tril", Diagonal, tril),
    META("aten::triu", Diagonal, triu),
    META("aten::gather", Tensor(CT, int64_t, CT, bool), gather),
    META("aten::scatter.src", Tensor(CT, int64_t, CT, CT), scatter),
    META("aten::scatter.value", Tensor(CT, int64_t, CT, CS), scatter),
    META("aten::scatter_add", Tensor(CT, int64_t, CT, CT), scatter_add),
    META("aten::index_add", Tensor(CT, int64_t, CT, CT, CS), index_add),
    META("aten::index_copy", Tensor(CT, int64_t, CT, CT), index_copy),
    META("aten::index.Tensor", Tensor(CT, const c10::List<optional<Tensor>>&), index),
    COMPOSITE("aten::embedding", Tensor(CT, CT, int64_t, bool, bool),
              at::compositeexplicitautograd::embedding),
    COMPOSITE("aten::_safe_softmax", Tensor(CT, int64_t, OptDtype), safe_softmax),
    COMPOSITE("aten::clone", Tensor(CT, optional<c10::MemoryFormat>), clone),
    COMPOSITE("aten::_unsafe_view", Tensor(CT, IntArrayRef),
              at::compositeexplicitautograd::_unsafe_view),
    // normalisation
    AS_PYTHON("aten::cudnn_batch_norm", CudnnBatchNorm, cudnn_batch_norm),
    // pooling and resampling
    META("aten::max_pool2d_with_indices",
         Pair(CT, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef, bool),
         max_pool2d_with_indices),
    META("aten::avg_pool2d",
         Tensor(CT, IntArrayRef, IntArrayRef, IntArrayRef, bool, bool, optional<int64_t>),
         avg_pool2d),
    META("aten::upsample_nearest2d", Tensor(CT, IntArrayRef, optional<double>, optional<double>),
         upsample_nearest2d),
    META("aten::upsample_bilinear2d",
         Tensor(CT, IntArrayRef, bool, optional<double>, optional<double>), upsample_bilinear2d),
    // initialisation and factories
    META("aten::uniform_", Random, uniform_),
    META("aten::normal_", Random, normal_),
    META("aten::fill_.Scalar", WithScalarIn, fill_),
    META("aten::zero_", UnaryIn, zero_),
    COMPOSITE("aten::scalar_tensor",
              Tensor(CS, OptDtype, optional<at::Layout>, optional<at::Device>, optional<bool>),
              scalar_tensor),
    COMPOSITE("aten::ones", Factory, filled),
    COMPOSITE("aten::empty_like", Like, like),
    COMPOSITE("aten::zeros_like", Like, like),
    COMPOSITE("aten::ones_like", Like, like),
    COMPOSITE("aten::full_like", FullLike, full_like),
    COMPOSITE("aten::new_empty", New, new_filled),
    COMPOSITE("aten::new_zeros", New, new_filled),
    COMPOSITE("aten::new_ones", New, new_filled),
    COMPOSITE("aten::zeros", Factory, filled),
};

c10::ArrayRef<Entry> entries() {
  return kEntries;
}

#undef COMPARISONS
#undef AS_PYTHON
#undef COMPOSITE
#undef META
#undef NATIVE

std::string name_of(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// libtorch's own Meta kernels are registered by its generated RegisterMeta*.cpp.
bool from_libtorch_meta(const std::string& meta_line) {
  return classify_meta_kernel(meta_line) == MetaKernelOwner::kNative &&
         meta_line.find("/RegisterMeta") != std::string::npos;
}

// Whether an entry of `kind` computes what `op`'s Meta key runs now, or what it would run without
// the Python kernel torch put over it (kernel_for in the header).
bool stands_for_meta(const c10::OperatorHandle& op, Kind kind) {
  const std::string dump = op.dumpState();
  const MetaKernelOwner active = classify_meta_kernel(dump);
  // The dump has one line per kernel registered for Meta: "Meta: ..." for the active one, then
  // "Meta (inactive): ..." for those it stands over.
  bool active_libtorch = false;    // the active kernel is libtorch's C++ Meta kernel
  bool inactive_libtorch = false;  // libtorch's C++ Meta kernel is under another one
  std::istringstream lines(dump);
  std::string line;
  const std::string inactive = "Meta (inactive): ";
  while (std::getline(lines, line)) {
    if (line.rfind("Meta: ", 0) == 0) {
      active_libtorch = from_libtorch_meta(line);
    } else if (line.rfind(inactive, 0) == 0) {
      inactive_libtorch =
          inactive_libtorch || from_libtorch_meta("Meta: " + line.substr(inactive.size()));
    }
  }
  switch (kind) {
    case Kind::kMeta:
      // Python's over libtorch's, or libtorch's itself (calling it directly saves a dispatch).
      return active_libtorch || (active == MetaKernelOwner::kPython && inactive_libtorch);
    case Kind::kComposite:
      // No C++ Meta kernel: Meta runs the composite kernel, or Python's over it.
      return !active_libtorch && !inactive_libtorch &&
             (active == MetaKernelOwner::kPython || active == MetaKernelOwner::kNone) &&
             op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
    case Kind::kPython:
      // Python's kernel stands for nothing of libtorch's: ours computes what it computes.
      return !active_libtorch && !inactive_libtorch && active == MetaKernelOwner::kPython &&
             !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
  }
  return false;
}

// The table's entries by op name, each with its kernel once made (and its fit with the schema).
struct Resolved {
  const Entry* entry;
  bool checked = false;
  std::string unfit;  // why the signature does not fit the schema ("" = fits)
  std::unique_ptr<c10::KernelFunction> kernel;
};

struct State {
  std::mutex mu;
  std::map<std::string, Resolved> by_name;
  State() {
    for (const Entry& e : entries()) by_name.emplace(e.op, Resolved{&e});
  }
};

State& state() {
  static State s;
  return s;
}

// Checks the entry against the schema once; makes its kernel if it fits. Caller holds the lock.
void check(Resolved& r, const c10::FunctionSchema& schema) {
  if (r.checked) return;
  r.checked = true;
  const c10::FunctionSchema inferred = r.entry->schema();
  if (auto diff = c10::findSchemaDifferences(inferred, schema)) {
    r.unfit = *diff;
    return;
  }
  r.kernel = std::make_unique<c10::KernelFunction>(r.entry->make());
}

c10::optional<c10::OperatorHandle> find_op(const std::string& full) {
  auto dot = full.find('.');
  std::string name = full.substr(0, dot);
  std::string overload = dot == std::string::npos ? "" : full.substr(dot + 1);
  return c10::Dispatcher::singleton().findOp(c10::OperatorName(name, overload));
}

}  // namespace

const c10::KernelFunction* kernel_for(const c10::OperatorHandle& op) {
  auto& s = state();
  const auto& schema = op.schema();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.by_name.find(name_of(schema.operator_name()));
  if (it == s.by_name.end()) return nullptr;
  Resolved& r = it->second;
  check(r, schema);
  if (!r.kernel || !stands_for_meta(op, r.entry->kind)) return nullptr;
  return r.kernel.get();
}

std::vector<std::string> table() {
  std::vector<std::string> names;
  for (const Entry& e : entries()) names.emplace_back(e.op);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> active() {
  std::vector<std::string> names;
  for (const Entry& e : entries()) {
    auto op = find_op(e.op);
    if (op && kernel_for(*op) != nullptr) names.emplace_back(e.op);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::pair<std::string, std::string>> unfit() {
  std::vector<std::pair<std::string, std::string>> out;
  auto& s = state();
  for (const Entry& e : entries()) {
    auto op = find_op(e.op);
    if (!op) continue;  // not in this libtorch: nothing to fit
    std::lock_guard<std::mutex> lock(s.mu);
    Resolved& r = s.by_name.at(e.op);
    check(r, op->schema());
    if (!r.unfit.empty()) out.emplace_back(e.op, r.unfit);
  }
  return out;
}

}  // namespace native_meta
}  // namespace metaload

// Python: torch.ops.metaload.native_meta_kernels() etc. (tests, and to see what a scan runs).
METALOAD_LIBRARY_FRAGMENT(m) {
  m.def("native_meta_table() -> str[]", [] { return metaload::native_meta::table(); });
  m.def("native_meta_kernels() -> str[]", [] { return metaload::native_meta::active(); });
  m.def("native_meta_unfit() -> str[]", [] {
    std::vector<std::string> out;
    for (const auto& [op, why] : metaload::native_meta::unfit()) out.push_back(op + ": " + why);
    return out;
  });
}
