// The MetaMode fallback, its run-time registration, and the RAII guards.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/torch_compat.h"
#include "c10_ext/data_dependent.h"
#include "c10_ext/meta_mode.h"
#include "c10_ext/mode_key.h"
#include "c10_ext/op_args.h"

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
  bool direct_empty = false;
  bool is_to = false;  // to / _to_copy: an already-meta source is not a saving
};

OpInfo classify(const c10::FunctionSchema& schema) {
  OpInfo info;
  const auto& name = schema.name();
  const auto& overload = schema.overload_name();
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size() && i < 127; ++i) {
    const auto& a = args[i];
    if (a.name() == "device" && is_device_type(*a.type())) info.device = static_cast<int8_t>(i);
    if (a.name() == "pin_memory") info.pin_memory = static_cast<int8_t>(i);
    if (info.self < 0 && a.type()->kind() == c10::TypeKind::TensorType) {
      info.self = static_cast<int8_t>(i);
    }
  }
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

void meta_mode_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpInfo& info = op_info(op);
  if (info.kind == OpKind::kPassthrough) return call_below(op, stack);

  const size_t n_args = op.schema().arguments().size();
  const size_t base = stack->size() - n_args;
  auto& s = *stack;

  switch (info.kind) {
    case OpKind::kDeviceArg: {
      auto& dev = s[base + info.device];
      bool requested_meta = false;
      if (dev.isDevice()) {
        requested_meta = dev.toDevice().is_meta();
      } else if (info.self >= 0 && s[base + info.self].isTensor()) {
        requested_meta =
            s[base + info.self].toTensor().is_meta();  // *_like, new_*, to: self's device
      }
      const bool source_meta =
          info.is_to && info.self >= 0 && s[base + info.self].toTensor().is_meta();
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
      return;
    }
    case OpKind::kLift:
    case OpKind::kPin: {
      const at::Tensor self = s[base].toTensor();
      if (self.is_meta()) return call_below(op, stack);
      at::Tensor out;
      {
        c10::impl::ExcludeDispatchKeyGuard guard(kMetaModeKey);
        out = meta_like(self);
      }
      torch::jit::drop(*stack, n_args);
      // The host data already exists (torch.tensor / numpy made it): nothing saved but the copy.
      count_forced(out, /*saved_bytes=*/info.kind == OpKind::kPin);
      stack->emplace_back(std::move(out));
      return;
    }
    case OpKind::kToOther: {
      auto& other = s[base + 1];
      if (other.isTensor() && !other.toTensor().is_meta()) {
        c10::impl::ExcludeDispatchKeyGuard guard(kMetaModeKey);
        other = c10::IValue(at::empty({0}, other.toTensor().options().device(c10::kMeta)));
      }
      const bool source_meta = s[base].toTensor().is_meta();
      call_below(op, stack);
      if (!source_meta) count_forced(stack->back().toTensor(), /*saved_bytes=*/true);
      return;
    }
    case OpKind::kReadsValues:
      for (size_t i = base; i < s.size(); ++i) {
        if (s[i].isTensor() && s[i].toTensor().is_meta()) raise_data_dependent(op, stack);
      }
      break;
    case OpKind::kPassthrough:
      break;
  }
  call_below(op, stack);
}

// ---- registration ------------------------------------------------------------------------------

std::once_flag g_register_once;
std::atomic<bool> g_registered{false};
std::string g_register_error;  // set once, under g_register_once

void register_fallback() {
  auto& dispatcher = c10::Dispatcher::singleton();
  if (dispatcher.hasBackendFallbackForDispatchKey(kMetaModeKey)) {
    g_register_error = std::string("cannot switch MetaMode on: dispatch key ") +
                       c10::toString(kMetaModeKey) +
                       " already has a fallback registered by another library (or another copy of "
                       "metaload loaded from a different path); metaload needs that key for itself";
    return;
  }
  try {
    // Never deregistered: the fallback must outlive every thread that may still dispatch.
    new c10::RegistrationHandleRAII(dispatcher.registerFallback(
        kMetaModeKey, c10::KernelFunction::makeFromBoxedFunction<&meta_mode_fallback>(),
        "metaload MetaMode fallback (c10_ext/mode.cc)"));
    g_registered.store(true);
  } catch (const std::exception& e) {
    g_register_error = std::string("cannot switch MetaMode on: registering the fallback for ") +
                       c10::toString(kMetaModeKey) + " failed: " + e.what();
  }
}

}  // namespace

void ensure_mode_key_registered() {
  std::call_once(g_register_once, register_fallback);
  if (!g_registered.load()) throw ModeError(g_register_error);
}

bool mode_key_registered() {
  return g_registered.load();
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
}  // namespace

MetaMode::MetaMode()
    : was_included_(
          (ensure_mode_key_registered(), c10::impl::tls_is_dispatch_key_included(kMetaModeKey))),
      was_excluded_(c10::impl::tls_is_dispatch_key_excluded(kMetaModeKey)) {
  restore(/*included=*/true, /*excluded=*/false);
}

MetaMode::~MetaMode() {
  restore(was_included_, was_excluded_);
}

RealGuard::RealGuard()
    : was_included_(c10::impl::tls_is_dispatch_key_included(kMetaModeKey)),
      was_excluded_(c10::impl::tls_is_dispatch_key_excluded(kMetaModeKey)) {
  c10::impl::tls_set_dispatch_key_included(kMetaModeKey, false);
}

RealGuard::~RealGuard() {
  restore(was_included_, was_excluded_);
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
