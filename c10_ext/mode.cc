// The MetaMode fallback, its run-time registration, and the RAII guards.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/detach_ops.h>
#include <ATen/ops/empty_ops.h>
#include <ATen/ops/empty_strided_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/full_ops.h>
#include <ATen/ops/normal_ops.h>
#include <ATen/ops/ones_ops.h>
#include <ATen/ops/uniform_ops.h>
#include <ATen/ops/zero_ops.h>
#include <ATen/ops/zeros_ops.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "base/torch_compat.h"
#include "c10_ext/data_dependent.h"
#include "c10_ext/meta_mode.h"
#include "c10_ext/mode_fallback.h"
#include "c10_ext/mode_key.h"
#include "c10_ext/op_args.h"
#include "c10_ext/random_draws.h"
#include "c10_ext/values.h"

namespace metaload {
namespace {

// ---- statistics -------------------------------------------------------------------------------

std::atomic<uint64_t> g_forced_tensors{0};
std::atomic<uint64_t> g_forced_bytes{0};

// ---- small host buffers behind forced empty() --------------------------------------------------

// C++ code such as at::tensor / torch::tensor(std::vector) creates a 1-D tensor with empty() and
// writes into data_ptr() directly, without the dispatcher. A meta tensor has no data pointer, so
// that code would fail. 1-D tensors that empty() creates directly, up to this size, therefore get
// a private host buffer while staying on meta: the write lands there, no kernel ever reads it, and
// it is freed with the tensor. Anything else (weights) gets no memory at all.
constexpr size_t kShadowLimitBytes = 64 * 1024;

// Hands out host memory whose DataPtr claims the meta device, so the TensorImpl stays on meta.
struct ShadowAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) METALOAD_ALLOCATE_CONST override {
    void* p = n ? std::malloc(n) : nullptr;
    if (n && !p) throw std::bad_alloc();
    return {p, p, &std::free, c10::Device(c10::kMeta)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &std::free; }
  METALOAD_ALLOCATOR_COPY_DATA
};
ShadowAllocator g_shadow_allocator;

// ---- per-operator classification ---------------------------------------------------------------

enum class OpKind : uint8_t {
  kPassthrough,  // runs as it is
  kDeviceArg,    // factory or conversion with a `device` argument: rewritten to meta
  kLift,         // lift_fresh & co: torch.tensor / torch.from_numpy hand their CPU result here
  kToOther,      // to(other): the device comes from another tensor
  kPin,          // pin_memory: a host copy, so a new tensor: lands on meta
  kReadsValues,  // item, nonzero, unique, ...: a typed error on a meta input, whatever kernels the
                 // Meta key has (under LD_PRELOAD into Python ours are registered late)
};

struct OpInfo {
  OpKind kind = OpKind::kPassthrough;
  int8_t device = -1;      // index of the `device` argument
  int8_t pin_memory = -1;  // index of the `pin_memory` argument
  int8_t self = -1;        // index of the first Tensor argument
  int8_t generator = -1;   // index of the `generator` argument
  bool direct_empty = false;
  bool is_to = false;          // to / _to_copy: an already-meta source is not a saving
  bool value_factory = false;  // arange, linspace, ...: its (small) results get values (values.h)
  bool draws = false;          // draws random numbers (random_draws.h)
  uint64_t writes = 0;         // bit i: argument i is written (in place / out=)
};

// Random ops whose overload at hand may take no generator (randn(size) beside
// randn.generator(size, generator)): they draw from the default one.
bool draws_without_generator_arg(const std::string& name) {
  static const std::unordered_set<std::string> kNames = {
      "aten::rand",      "aten::randn",      "aten::randint",      "aten::randperm",
      "aten::rand_like", "aten::randn_like", "aten::randint_like", "aten::native_dropout"};
  return kNames.count(name) != 0;
}

OpInfo classify(const c10::FunctionSchema& schema) {
  OpInfo info;
  const auto& name = schema.name();
  const auto& overload = schema.overload_name();
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size() && i < 127; ++i) {
    const auto& a = args[i];
    if (i < 64 && a.alias_info() && a.alias_info()->isWrite()) info.writes |= uint64_t{1} << i;
    if (a.name() == "device" && is_device_type(*a.type())) info.device = static_cast<int8_t>(i);
    if (a.name() == "pin_memory") info.pin_memory = static_cast<int8_t>(i);
    if (a.name() == "generator") info.generator = static_cast<int8_t>(i);
    if (info.self < 0 && a.type()->kind() == c10::TypeKind::TensorType) {
      info.self = static_cast<int8_t>(i);
    }
  }
  info.draws = info.generator >= 0 || draws_without_generator_arg(name);
  if (is_own_op(schema)) {
    info.kind = OpKind::kPassthrough;
  } else if (name == "aten::lift_fresh" || name == "aten::lift" ||
             name == "aten::lift_fresh_copy") {
    info.kind = OpKind::kLift;
  } else if (name == "aten::to" && overload == "other") {
    info.kind = OpKind::kToOther;
  } else if (name == "aten::pin_memory" || name == "aten::_pin_memory") {
    info.kind = OpKind::kPin;
  } else if (is_data_dependent_op(schema.operator_name())) {
    info.kind = OpKind::kReadsValues;
  } else if (name == "aten::is_pinned") {
    info.kind = OpKind::kPassthrough;  // a query, not a tensor
  } else if (info.device >= 0) {
    info.kind = OpKind::kDeviceArg;
    info.direct_empty = (name == "aten::empty" && overload == "memory_format") ||
                        (name == "aten::empty_strided" && overload.empty());
    info.is_to = name == "aten::to" || name == "aten::_to_copy";
    info.value_factory = name == "aten::arange" || name == "aten::range" ||
                         name == "aten::linspace" || name == "aten::logspace" ||
                         name == "aten::scalar_tensor";
  }
  return info;
}

const OpInfo& op_info(const c10::OperatorHandle& op) {
  return cached_op_info<OpInfo, &classify>(op);
}

uint64_t nbytes_of(const at::Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * t.element_size();
}

void count_forced(const at::Tensor& t, bool saved_bytes) {
  g_forced_tensors.fetch_add(1, std::memory_order_relaxed);
  if (saved_bytes) g_forced_bytes.fetch_add(nbytes_of(t), std::memory_order_relaxed);
}

at::Tensor meta_like(const at::Tensor& t) {
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

// Returns the tensor empty()/empty_strided() would have made, with a host shadow buffer, or an
// undefined tensor when the request does not qualify (too big, not CPU, unusual layout).
at::Tensor shadow_empty(const OpInfo& info, const torch::jit::Stack& stack, size_t base,
                        bool strided) {
  const auto& size_v = stack[base];
  if (!size_v.isIntList()) return {};
  const auto sizes = size_v.toIntVector();
  if (sizes.size() != 1) return {};
  // empty.memory_format(size, dtype, layout, device, pin_memory, memory_format)
  // empty_strided(size, stride, dtype, layout, device, pin_memory)
  const size_t dtype_i = strided ? 2 : 1;
  const auto& dtype_v = stack[base + dtype_i];
  const auto& layout_v = stack[base + dtype_i + 1];
  const auto& device_v = stack[base + info.device];
  if (!layout_v.isNone() && layout_v.toLayout() != c10::kStrided) return {};
  if (!device_v.isNone() && !device_v.toDevice().is_cpu()) return {};
  const auto dtype =
      dtype_v.isNone() ? c10::get_default_dtype_as_scalartype() : dtype_v.toScalarType();
  int64_t numel = 1;
  for (auto s : sizes) numel *= s;
  if (numel <= 0 || static_cast<size_t>(numel) * c10::elementSize(dtype) > kShadowLimitBytes) {
    return {};
  }
  const c10::DispatchKeySet meta_ks(c10::DispatchKey::Meta);
  if (strided) {
    const auto& stride_v = stack[base + 1];
    if (!stride_v.isIntList()) return {};
    return at::detail::empty_strided_generic(sizes, stride_v.toIntVector(), &g_shadow_allocator,
                                             meta_ks, dtype);
  }
  const auto& mf_v = stack[base + 5];
  return at::detail::empty_generic(
      sizes, &g_shadow_allocator, meta_ks, dtype,
      mf_v.isNone() ? c10::nullopt : c10::optional<c10::MemoryFormat>(mf_v.toMemoryFormat()));
}

void call_below(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard guard(kMetaModeKey);
  op.callBoxed(stack);
}

// A device argument: see require_device_init_again_after (base/torch_compat.h).
void note_device(const c10::IValue& v) {
  if (v.isDevice()) require_device_init_again_after(v.toDevice().type());
}

// kDeviceArg: the device argument becomes meta, pinning is dropped; empty() and empty_strided()
// may get a host shadow buffer instead (shadow_empty).
void force_device_arg(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                      size_t base, size_t n_args) {
  auto& s = *stack;
  auto& dev = s[base + info.device];
  note_device(dev);
  bool requested_meta = false;
  if (dev.isDevice()) {
    requested_meta = dev.toDevice().is_meta();
  } else if (info.self >= 0 && s[base + info.self].isTensor()) {
    requested_meta = s[base + info.self].toTensor().is_meta();  // *_like, new_*, to: self's device
  }
  const bool source_meta = info.is_to && info.self >= 0 && s[base + info.self].toTensor().is_meta();
  if (info.direct_empty && !requested_meta) {
    at::Tensor t = shadow_empty(info, s, base, op.schema().name() == "aten::empty_strided");
    if (t.defined()) {
      torch::jit::drop(*stack, n_args);
      count_forced(t, /*saved_bytes=*/false);
      stack->emplace_back(std::move(t));
      return;
    }
  }
  dev = c10::IValue(c10::Device(c10::kMeta));
  if (info.pin_memory >= 0) s[base + info.pin_memory] = c10::IValue();
  call_below(op, stack);
  if (!requested_meta && !source_meta && !stack->empty() && stack->back().isTensor()) {
    count_forced(stack->back().toTensor(), /*saved_bytes=*/true);
  }
}

// kLift, kPin: a host tensor torch.tensor / numpy made becomes its meta twin (a lifted CPU one
// keeps its values).
void force_host_copy(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                     size_t base, size_t n_args) {
  const at::Tensor self = (*stack)[base].toTensor();
  if (self.is_meta()) return call_below(op, stack);
  at::Tensor out;
  {
    c10::impl::ExcludeDispatchKeyGuard guard(kMetaModeKey);
    out = meta_like(self);
  }
  torch::jit::drop(*stack, n_args);
  // The host data already exists: nothing saved but the copy.
  count_forced(out, /*saved_bytes=*/info.kind == OpKind::kPin);
  if (info.kind == OpKind::kLift && self.device().is_cpu()) attach_values(out, self);
  stack->emplace_back(std::move(out));
}

// kToOther: to(other) takes a meta stand-in for `other`.
void force_to_other(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t base) {
  auto& s = *stack;
  auto& other = s[base + 1];
  if (other.isTensor() && !other.toTensor().is_meta()) {
    c10::impl::ExcludeDispatchKeyGuard guard(kMetaModeKey);
    other = c10::IValue(at::empty({0}, other.toTensor().options().device(c10::kMeta)));
  }
  const bool source_meta = s[base].toTensor().is_meta();
  call_below(op, stack);
  if (!source_meta) count_forced(stack->back().toTensor(), /*saved_bytes=*/true);
}

// Forces the op's results onto meta (values aside).
void force(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (info.kind == OpKind::kPassthrough) return call_below(op, stack);
  const size_t n_args = op.schema().arguments().size();
  const size_t base = stack->size() - n_args;
  switch (info.kind) {
    case OpKind::kDeviceArg:
      return force_device_arg(info, op, stack, base, n_args);
    case OpKind::kLift:
    case OpKind::kPin:
      return force_host_copy(info, op, stack, base, n_args);
    case OpKind::kToOther:
      return force_to_other(op, stack, base);
    case OpKind::kReadsValues:
      for (size_t i = base; i < stack->size(); ++i) {
        const c10::IValue& v = (*stack)[i];
        if (v.isTensor() && v.toTensor().is_meta()) raise_data_dependent(op, stack);
      }
      break;
    case OpKind::kPassthrough:
      break;
  }
  call_below(op, stack);
}

// ---- values (values.h) -------------------------------------------------------------------------

struct MetaInputs {
  int meta = 0;         // meta tensors among the arguments (also inside lists)
  int with_values = 0;  // ... of which carry values
};

MetaInputs scan_meta_inputs(const torch::jit::Stack& s, size_t base) {
  MetaInputs in;
  auto visit = [&in](const c10::IValue& v) {
    if (!v.isTensor()) return;
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.is_meta()) return;
    ++in.meta;
    if (has_values(t)) ++in.with_values;
  };
  for (size_t i = base; i < s.size(); ++i) {
    if (s[i].isList()) {
      for (const auto& e : s[i].toListRef()) visit(e);
    } else {
      visit(s[i]);
    }
  }
  return in;
}

void forget_written(const OpInfo& info, const torch::jit::Stack& args) {
  for (size_t i = 0; i < args.size() && i < 64; ++i) {
    if ((info.writes >> i & 1) && args[i].isTensor()) forget_values(args[i].toTensor());
  }
}

// `v` with `f` applied to it, or, for a list, to each element (a new list of the same type).
template <class F>
c10::IValue map_elements(const c10::IValue& v, F f) {
  if (!v.isList()) return f(v);
  c10::impl::GenericList in = v.toList();
  c10::impl::GenericList out(in.elementType());
  out.reserve(in.size());
  for (const auto& e : v.toListRef()) out.push_back(f(e));
  return c10::IValue(std::move(out));
}

// Runs `op` on CPU for the values: meta tensors with values become CPU aliases of them (an in-place
// op writes into them), devices become cpu, pinning (which needs a GPU) is dropped.
torch::jit::Stack run_on_values(const OpInfo& info, const c10::OperatorHandle& op,
                                torch::jit::Stack args) {
  auto swap = [](const c10::IValue& v) -> c10::IValue {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_meta()) {
      return values_alias(v.toTensor());
    }
    if (v.isDevice()) return c10::IValue(c10::Device(c10::kCPU));
    return v;
  };
  c10::impl::ExcludeDispatchKeyGuard guard(kMetaModeKey);
  for (auto& v : args) v = map_elements(v, swap);
  if (info.pin_memory >= 0 && args[info.pin_memory].isBool()) {
    args[info.pin_memory] = c10::IValue(false);
  }
  op.callBoxed(&args);
  return args;
}

bool wants_values(const c10::IValue& v) {
  auto small_meta = [](const c10::IValue& e) {
    return e.isTensor() && e.toTensor().defined() && e.toTensor().is_meta() &&
           e.toTensor().numel() <= kMaxValueElements && !has_values(e.toTensor());
  };
  if (!v.isList()) return small_meta(v);
  for (const auto& e : v.toListRef()) {
    if (small_meta(e)) return true;
  }
  return false;
}

void attach(const c10::IValue& meta, const c10::IValue& values) {
  if (meta.isTensor() && values.isTensor()) {
    attach_values(meta.toTensor(), values.toTensor());
  } else if (meta.isList() && values.isList()) {
    const auto m = meta.toListRef();
    const auto v = values.toListRef();
    for (size_t i = 0; i < m.size() && i < v.size(); ++i) attach(m[i], v[i]);
  }
}

// A result computed on CPU, as the meta tensor forcing gives (with the values attached).
c10::IValue meta_with_values(const c10::IValue& v) {
  if (v.isList()) return map_elements(v, &meta_with_values);
  if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_cpu()) {
    at::Tensor out;
    {
      c10::impl::ExcludeDispatchKeyGuard guard(kMetaModeKey);
      out = meta_like(v.toTensor());
    }
    attach_values(out, v.toTensor());
    return out;
  }
  return v;
}

// Every meta input carries values (or the op makes values from constants): force as usual, and
// compute the values of its small results on CPU. Returns whether the op ran on the values.
bool force_with_values(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                       size_t n_args) {
  torch::jit::Stack args(stack->end() - n_args, stack->end());  // before forcing rewrites them
  const size_t n_ret = op.schema().returns().size();
  if (info.kind == OpKind::kReadsValues) {  // item, nonzero, equal, ...: answered from the values
    torch::jit::Stack results = run_on_values(info, op, std::move(args));
    torch::jit::drop(*stack, n_args);
    for (const auto& r : results) stack->push_back(meta_with_values(r));
    return true;
  }
  force(info, op, stack);
  bool wanted = info.writes != 0;
  for (size_t i = stack->size() - n_ret; i < stack->size() && !wanted; ++i) {
    wanted = wants_values((*stack)[i]);
  }
  if (!wanted) return false;
  torch::jit::Stack results;
  try {
    results = run_on_values(info, op, args);
  } catch (const std::exception&) {  // values are a bonus: an op they cannot follow leaves them
    forget_written(info, args);      // unknown
    return false;
  }
  for (size_t i = 0; i < n_ret && i < results.size(); ++i) {
    attach((*stack)[stack->size() - n_ret + i], results[i]);
  }
  return true;
}

// A random op (random_draws.h). It draws for real, on CPU with its small results keeping the
// values, only where an eager run draws the same numbers: from the default CPU generator while it
// is in step, for cpu, every meta input carrying values. Otherwise it is forced without values, and
// a draw the eager run would make from that generator is noted as skipped (a meta input: its real
// device is unknown, so it counts).
void force_random(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                  size_t n_args, const MetaInputs& in) {
  const size_t base = stack->size() - n_args;
  const c10::IValue& device = info.device >= 0 ? (*stack)[base + info.device] : c10::IValue();
  if (device.isDevice() && device.toDevice().is_meta()) return force(info, op, stack);  // eager too
  if (in.meta == 0 && info.device < 0)
    return force(info, op, stack);  // real inputs: drawn for real
  const bool own_generator = info.generator >= 0 && !(*stack)[base + info.generator].isNone();
  // No device given: a factory's default (cpu) or a meta input's unknown one (counted as cpu).
  const bool cpu = !device.isDevice() || device.toDevice().is_cpu();
  const bool may_draw = cpu && !own_generator && in.with_values == in.meta && cpu_draws_in_step();
  if (may_draw && force_with_values(info, op, stack, n_args)) return;
  if (!may_draw) {
    if (in.with_values > 0 && info.writes != 0) {
      forget_written(info, torch::jit::Stack(stack->end() - n_args, stack->end()));
    }
    force(info, op, stack);
  }
  if (cpu && !own_generator) note_skipped_draw();
}

void meta_mode_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // torch's FakeTensorMode entered inside a metaload scope (an outer one is set aside when the
  // scope is entered): the innermost scope wins, so the call runs as if metaload were off.
  if (torch_fake_mode_is_on()) return call_below(op, stack);
  const OpInfo& info = op_info(op);
  const size_t n_args = op.schema().arguments().size();
  const MetaInputs in = scan_meta_inputs(*stack, stack->size() - n_args);
  if (info.draws) return force_random(info, op, stack, n_args, in);
  if (!info.value_factory && (in.meta == 0 || in.with_values < in.meta)) {
    if (in.with_values > 0 && info.writes != 0) {  // written by something whose values are unknown
      forget_written(info, torch::jit::Stack(stack->end() - n_args, stack->end()));
    }
    return force(info, op, stack);
  }
  force_with_values(info, op, stack, n_args);
}

// ---- direct kernels for the ops a module constructor calls most -------------------------------

// Every parameter is made (empty), wrapped (Parameter detaches it) and initialised in place
// (uniform_, normal_, fill_, zero_). On a meta tensor without values those need nothing from
// MetaMode, and an unboxed kernel that hands them straight to the Meta kernel costs a fraction of
// the boxed fallback: that keeps a build under MetaMode as cheap as one with device="meta".
// Anything else (values, a tensor that is not meta, torch's FakeTensorMode) goes through the
// fallback.
// The boxed path of a direct kernel: op's arguments through meta_mode_fallback; its last result.
template <class Op, class... Args>
c10::IValue call_fallback(const Args&... args) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
  torch::jit::Stack stack;
  torch::jit::push(stack, args...);
  meta_mode_fallback(op, &stack);
  return std::move(stack.back());
}

// kDraws: a random initialiser, whose draw on a meta tensor without values is skipped
// (random_draws.h).
template <class Op, bool kDraws = false, class Schema = typename Op::schema>
struct Direct;

template <class Op, bool kDraws, class R, class Self, class... Rest>
struct Direct<Op, kDraws, R(Self, Rest...)> {
  static R call(c10::DispatchKeySet ks, Self self, Rest... rest) {
    if (self.is_meta() && !has_values(self) && !torch_fake_mode_is_on()) {
      if (kDraws) note_skipped_draw();
      return Op::redispatch(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kMetaModeKey),
                            self, rest...);
    }
    c10::IValue result = call_fallback<Op>(self, rest...);
    if constexpr (std::is_reference<R>::value) {
      return const_cast<R>(self);  // in place: returns self
    } else {
      return std::move(result).toTensor();
    }
  }
};

// Arguments of a factory as the fallback rewrites them: the device becomes meta, pinning is
// dropped.
template <class T>
T& to_meta(T& arg, bool* requested_meta) {
  return arg;
}
c10::optional<c10::Device>& to_meta(c10::optional<c10::Device>& device, bool* requested_meta) {
  if (device.has_value()) {
    *requested_meta = device->is_meta();
    note_device(c10::IValue(*device));
  }
  device = c10::Device(c10::kMeta);
  return device;
}
c10::optional<bool>& to_meta(c10::optional<bool>& pin_memory, bool*) {  // their only bool?
  pin_memory = c10::nullopt;
  return pin_memory;
}

// Factories: the device argument becomes meta, as in the fallback. empty() and empty_strided()
// with a 1-D size take the fallback (they may get a host shadow buffer, see shadow_empty).
template <class Op, bool kMayShadow, class Schema = typename Op::schema>
struct DirectFactory;

template <class Op, bool kMayShadow, class Size, class... Rest>
struct DirectFactory<Op, kMayShadow, at::Tensor(Size, Rest...)> {
  static at::Tensor call(c10::DispatchKeySet ks, Size size, Rest... rest) {
    if (!(kMayShadow && size.size() == 1) && !torch_fake_mode_is_on()) {
      bool requested_meta = false;
      at::Tensor t;
      {
        // Redispatched, not called again from the top: the keys below (BackendSelect first)
        // pick the Meta kernel from the rewritten device, and a second dispatcher entry per
        // factory was most of what a build under MetaMode cost over one with device="meta".
        c10::impl::ExcludeDispatchKeyGuard guard(kMetaModeKey);  // as call_below
        t = Op::redispatch(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kMetaModeKey),
                           size, to_meta(rest, &requested_meta)...);
      }
      if (!requested_meta) count_forced(t, /*saved_bytes=*/true);
      return t;
    }
    return call_fallback<Op>(size, rest...).toTensor();
  }
};

void register_direct_kernels() {
  // Never destroyed, like the fallback.
  auto* lib = new torch::Library(torch::Library::IMPL, "aten", kMetaModeKey, __FILE__, __LINE__);
  lib->impl("uniform_", TORCH_FN((Direct<at::_ops::uniform_, true>::call)));
  lib->impl("normal_", TORCH_FN((Direct<at::_ops::normal_, true>::call)));
  lib->impl("fill_.Scalar", TORCH_FN(Direct<at::_ops::fill__Scalar>::call));
  lib->impl("zero_", TORCH_FN(Direct<at::_ops::zero_>::call));
  lib->impl("detach", TORCH_FN(Direct<at::_ops::detach>::call));
  lib->impl("empty.memory_format",
            TORCH_FN((DirectFactory<at::_ops::empty_memory_format, true>::call)));
  lib->impl("empty_strided", TORCH_FN((DirectFactory<at::_ops::empty_strided, true>::call)));
  lib->impl("ones", TORCH_FN((DirectFactory<at::_ops::ones, false>::call)));
  lib->impl("zeros", TORCH_FN((DirectFactory<at::_ops::zeros, false>::call)));
  lib->impl("full", TORCH_FN((DirectFactory<at::_ops::full, false>::call)));
  // randn and rand take the fallback: a small one may be drawn for real (force_random).
}

// ---- registration ------------------------------------------------------------------------------

c10::KernelFunction meta_mode_kernel() {
  return c10::KernelFunction::makeFromBoxedFunction<&meta_mode_fallback>();
}

ModeFallback& meta_mode_registration() {
  static ModeFallback* r = new ModeFallback(  // never destroyed, like the fallback
      kMetaModeKey, "MetaMode", "itself", &meta_mode_kernel,
      "metaload MetaMode fallback (c10_ext/mode.cc)", &register_direct_kernels);
  return *r;
}

}  // namespace

void ensure_mode_key_registered() {
  meta_mode_registration().ensure();
}

bool mode_key_registered() {
  return meta_mode_registration().registered();
}

bool is_forcing() {
  return c10::impl::tls_is_dispatch_key_included(kMetaModeKey) &&
         !c10::impl::tls_is_dispatch_key_excluded(kMetaModeKey);
}

namespace {
void restore(bool included, bool excluded) {
  c10::impl::tls_set_dispatch_key_included(kMetaModeKey, included);
  c10::impl::tls_set_dispatch_key_excluded(kMetaModeKey, excluded);
}

// Whether FakeMode is on for this thread; both guards switch it off (innermost wins, meta_mode.h).
bool fake_mode_on() {
  return c10::impl::tls_is_dispatch_key_included(kFakeModeKey);
}
}  // namespace

MetaMode::MetaMode()
    : was_included_(
          (ensure_mode_key_registered(), c10::impl::tls_is_dispatch_key_included(kMetaModeKey))),
      was_excluded_(c10::impl::tls_is_dispatch_key_excluded(kMetaModeKey)),
      was_faking_(fake_mode_on()) {
  restore(/*included=*/true, /*excluded=*/false);
  c10::impl::tls_set_dispatch_key_included(kFakeModeKey, false);
}

MetaMode::~MetaMode() {
  restore(was_included_, was_excluded_);
  c10::impl::tls_set_dispatch_key_included(kFakeModeKey, was_faking_);
}

RealGuard::RealGuard()
    : was_included_(c10::impl::tls_is_dispatch_key_included(kMetaModeKey)),
      was_excluded_(c10::impl::tls_is_dispatch_key_excluded(kMetaModeKey)),
      was_faking_(fake_mode_on()) {
  c10::impl::tls_set_dispatch_key_included(kMetaModeKey, false);
  c10::impl::tls_set_dispatch_key_included(kFakeModeKey, false);
}

RealGuard::~RealGuard() {
  restore(was_included_, was_excluded_);
  c10::impl::tls_set_dispatch_key_included(kFakeModeKey, was_faking_);
}

ForcingStats forcing_stats() {
  return {g_forced_tensors.load(std::memory_order_relaxed),
          g_forced_bytes.load(std::memory_order_relaxed)};
}

void reset_forcing_stats() {
  g_forced_tensors.store(0);
  g_forced_bytes.store(0);
}

}  // namespace metaload
