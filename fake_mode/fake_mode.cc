// The Fake key's fallback: every op on fake tensors (or any op while FakeMode is active) lands
// here, below autograd. It works out the device the result would have on a real run, runs the
// op's Meta kernel (fake tensors report the meta device while it runs), and wraps new results as
// fake tensors on that device.
#include "fake_mode/fake_mode.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "base/registration.h"
#include "base/text.h"
#include "base/torch_compat.h"
#include "base/torch_library.h"
#include "c10_ext/data_dependent.h"
#include "c10_ext/mode_fallback.h"
#include "c10_ext/op_args.h"
#include "c10_ext/scopes.h"
#include "fake_mode/cpu_rules.h"
#include "fake_mode/fake_tensor.h"
#include "kernels/native_meta.h"

namespace metaload {
namespace {

constexpr c10::DispatchKey kFakeKey = kFakeModeKey;

thread_local c10::optional<c10::Device> t_mode_device;

// The mode's device while FakeMode is on: a MetaMode or RealGuard inside it takes the key out of
// the thread's included set (innermost wins, c10_ext/meta_mode.h), and the device goes with it.
c10::optional<c10::Device> mode_device_now() {
  if (!t_mode_device || !c10::impl::tls_is_dispatch_key_included(kFakeKey)) return c10::nullopt;
  return t_mode_device;
}

// "cuda" means the current cuda device in a real run: the mode's cuda device, else cuda:0.
c10::Device normalize(c10::Device d, const c10::optional<c10::Device>& mode_device) {
  if (!d.is_cuda() || d.has_index()) return d;
  if (mode_device && mode_device->is_cuda()) return *mode_device;
  return c10::Device(c10::kCUDA, 0);
}

// ---- per-operator facts ---------------------------------------------------------------------

struct OpInfo {
  int8_t device = -1;         // index of a `device` argument (factories, _to_copy)
  int8_t pin_memory = -1;     // index of a `pin_memory` argument
  int8_t unchecked = -1;      // index of an argument a real run takes from any device
  bool own = false;           // a torch.ops.metaload operator: runs as it is
  bool reads_values = false;  // item, nonzero, unique...: a typed error, whatever Meta kernels
                              // this torch has (2.x's Python ones raise their own errors)
  bool mask_index = false;    // aten::index: with a bool/uint8 mask its shape is the mask's count
  CpuRule cpu_rule = CpuRule::kNone;  // the CPU kernel judges otherwise than Meta (cpu_rules.h)
  // libtorch's C++ shape kernel, called in place of a Python-registered Meta kernel (torch 2.x
  // puts Python ones over hundreds of C++ ones); null: redispatch to Meta.
  const c10::KernelFunction* native = nullptr;
};

// The argument of an op that a real run accepts on any device (native_functions.yaml marks these
// ops `device_check: NoCheck`): a copy's source, advanced indexing's indices (cpu indices index a
// cuda tensor). The result is on self's device, and the other arguments are still checked
// (index_put_'s values must be on self's device unless zero-dim cpu).
const char* unchecked_argument(const std::string& name) {
  if (name == "aten::copy_" || name == "aten::copy") return "src";
  if (name == "aten::_copy_from" || name == "aten::_copy_from_and_resize") return "self";
  if (name == "aten::index" || name == "aten::index_put_" || name == "aten::index_put" ||
      name == "aten::_index_put_impl_" || name == "aten::_index_put_impl") {
    return "indices";
  }
  return nullptr;
}

// x[mask]: aten::index with a bool or uint8 index tensor, whose result has as many rows as the
// mask has true values (torch 2.x's Python Meta kernel raises an untyped error for it).
bool indexes_with_a_mask(const torch::jit::Stack& stack, size_t n_args) {
  const c10::IValue& indices = stack[stack.size() - n_args + 1];
  if (!indices.isList()) return false;
  for (const c10::IValue& i : indices.toListRef()) {
    if (!i.isTensor()) continue;
    const auto type = i.toTensor().scalar_type();
    if (type == at::kBool || type == at::kByte) return true;
  }
  return false;
}

OpInfo classify(const c10::FunctionSchema& schema) {
  OpInfo info;
  info.own = is_own_op(schema);
  if (auto handle = c10::Dispatcher::singleton().findOp(schema.operator_name())) {
    info.native = native_meta::kernel_for(*handle);
  }
  info.reads_values = is_data_dependent_op(schema.operator_name());
  info.mask_index = schema.name() == "aten::index";
  info.cpu_rule = cpu_rule_for(schema);
  const char* unchecked = unchecked_argument(schema.name());
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size() && i < 127; ++i) {
    if (args[i].name() == "device" && is_device_type(*args[i].type())) {
      info.device = static_cast<int8_t>(i);
    }
    if (args[i].name() == "pin_memory") info.pin_memory = static_cast<int8_t>(i);
    if (unchecked && args[i].name() == unchecked) info.unchecked = static_cast<int8_t>(i);
  }
  return info;
}

const OpInfo& op_info(const c10::OperatorHandle& op) {
  return cached_op_info<OpInfo, &classify>(op);
}

// ---- device rules ---------------------------------------------------------------------------

// Gathers the devices of an op's tensor arguments the way a real run checks them.
struct DeviceRule {
  const c10::OperatorHandle& op;
  const c10::optional<c10::Device>& mode_device;  // mode_device_now(), read once per op
  c10::optional<c10::Device> common;              // the device every non-scalar tensor is on
  c10::optional<c10::Device> cpu_scalar;          // a zero-dim cpu tensor was seen
  bool saw_wildcard = false;                      // a plain meta tensor outside FakeMode

  void see(const at::Tensor& t) {
    if (!t.defined()) return;
    c10::Device d = claimed_device(t);
    if (d.is_meta() && !is_fake(t)) {
      if (!mode_device) {
        saw_wildcard = true;
        return;
      }
      d = *mode_device;  // a meta-built model's parameters live on the mode's device
    }
    if (d.is_cpu() && t.dim() == 0) {
      cpu_scalar = d;  // zero-dim cpu tensors mix with any device, as in a real run
      return;
    }
    if (!common) {
      common = d;
    } else if (*common != d) {
      TORCH_CHECK(false,
                  "Expected all tensors to be on the same device, but found at least two "
                  "devices, ",
                  *common, " and ", d, "! (in ", op.schema().name(),
                  ", run on fake tensors by metaload)");
    }
  }

  c10::Device result() const {
    if (common) return *common;
    if (cpu_scalar) return *cpu_scalar;
    return mode_device.value_or(c10::Device(c10::kCPU));
  }
};

// A meta tensor standing in for a real one (same sizes, strides, dtype), so Meta kernels take it.
// Made with the Fake key excluded: a factory under FakeMode would give a fake tensor on the mode's
// device, and view ops (detach, lift_fresh, view) would pass that device on to their result instead
// of the real tensor's own.
at::Tensor meta_stand_in(const at::Tensor& real) {
  c10::impl::ExcludeDispatchKeyGuard no_fake(kFakeKey);
  c10::impl::ExcludeDispatchKeyGuard no_mode(kMetaModeKey);
  at::Tensor meta =
      at::empty_strided(real.sizes(), real.strides(), real.options().device(c10::kMeta));
  // A Python number passed as a tensor (x * 2.5) is a wrapped number, which type promotion ranks
  // below tensors: an int tensor times it is float32, times a 0-dim float64 tensor float64.
  if (real.unsafeGetTensorImpl()->is_wrapped_number()) {
    meta.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  return meta;
}

bool needs_stand_in(const at::Tensor& t) {
  return t.defined() && !is_fake(t) && !t.is_meta();
}

// Applies `fn` to every tensor in an argument (a tensor, a list of tensors, a list of optionals).
template <typename F>
void for_each_tensor(const c10::IValue& v, F&& fn) {
  if (v.isTensor()) {
    fn(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) fn(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) fn(e.toTensor());
    }
  }
}

// Replaces every real tensor in an argument by a meta stand-in.
void replace_real(c10::IValue& v) {
  if (v.isTensor()) {
    if (needs_stand_in(v.toTensor())) v = meta_stand_in(v.toTensor());
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    for (size_t i = 0; i < list.size(); ++i) {
      const at::Tensor t = list.get(i);
      if (needs_stand_in(t)) list.set(i, meta_stand_in(t));
    }
  } else if (v.isList()) {
    auto list = v.toList();
    for (size_t i = 0; i < list.size(); ++i) {
      const c10::IValue e = list.get(i);
      if (e.isTensor() && needs_stand_in(e.toTensor())) list.set(i, meta_stand_in(e.toTensor()));
    }
  }
}

// Outputs that are new meta tensors become fake tensors on `device`; outputs that are inputs
// (in-place and out= ops return them) stay what they are.
at::Tensor wrap_output(const at::Tensor& t, c10::Device device,
                       c10::ArrayRef<const c10::TensorImpl*> inputs) {
  if (!t.defined() || !t.is_meta()) return t;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  for (const c10::TensorImpl* in : inputs) {
    if (in == impl) return t;
  }
  return make_fake(t, device);
}

// While a Meta kernel runs for fake tensors: Fake is excluded (no recursion), and Meta's backend
// bit is included, because fake tensors carry their claimed backend's bit and nested ops must
// still pick Meta kernels. The whole thread-local key set is saved and restored: the
// include/exclude guards subtract functionality keys only, and would leave the Meta backend bit
// behind.
c10::impl::LocalDispatchKeySet kernel_key_set() {
  const c10::impl::LocalDispatchKeySet now = c10::impl::tls_local_dispatch_key_set();
  c10::impl::PODLocalDispatchKeySet keys;
  keys.set_included(now.included_ | c10::DispatchKeySet(c10::DispatchKey::Meta));
  keys.set_excluded(now.excluded_.add(kFakeKey));
  return keys;
}

struct KernelScope {
  KernelScope() : keys(kernel_key_set()) { ++detail::fake_kernel_depth(); }
  ~KernelScope() { --detail::fake_kernel_depth(); }
  c10::impl::ForceDispatchKeyGuard keys;
};

// What step 1 of the fallback finds: the device of the results, whether they become fake
// tensors, and the inputs (real ones need meta stand-ins).
struct ResultPlan {
  c10::Device target{c10::kCPU};
  bool wrap = true;
  c10::SmallVector<const c10::TensorImpl*, 8> inputs;  // no heap allocation per op
  bool has_real = false;                               // a scan's ops mostly see none
};

// Step 1: the device of the result -- a factory's device argument (then rewritten to meta), or
// the rule over the tensor arguments.
ResultPlan plan_results(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack& s,
                        size_t base, size_t n_args) {
  // Thread-locals in a shared library cost a __tls_get_addr call per access: read it once.
  const c10::optional<c10::Device> mode_device = mode_device_now();
  DeviceRule rule{op, mode_device};
  ResultPlan plan;
  for (size_t i = 0; i < n_args; ++i) {
    for_each_tensor(s[base + i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      plan.inputs.push_back(t.unsafeGetTensorImpl());
      plan.has_real = plan.has_real || needs_stand_in(t);
      if (info.device < 0 && static_cast<int>(i) != info.unchecked) rule.see(t);
    });
  }
  c10::Device target(c10::kCPU);
  if (info.device >= 0) {
    auto& dev = s[base + info.device];
    if (dev.isDevice()) {
      target = normalize(dev.toDevice(), mode_device);
      require_device_init_again_after(target.type());  // base/torch_compat.h
    } else if (!plan.inputs.empty()) {
      const at::Tensor& self = s[base].isTensor() ? s[base].toTensor() : at::Tensor();
      target = self.defined() ? claimed_device(self) : rule.result();
      if (target.is_meta() && mode_device && !(self.defined() && is_fake(self))) {
        target = *mode_device;
      }
    } else {
      target = mode_device.value_or(c10::Device(c10::kCPU));
    }
    dev = c10::IValue(c10::Device(c10::kMeta));
    if (info.pin_memory >= 0) s[base + info.pin_memory] = c10::IValue();
  } else {
    target = rule.result();
  }
  // Meta means "no device yet": inside FakeMode that is the mode's device (as for a meta-built
  // model's parameters); outside it, results stay plain meta tensors.
  plan.wrap = !target.is_meta() || mode_device.has_value();
  if (target.is_meta() && mode_device) target = *mode_device;
  plan.target = target;
  return plan;
}

// Step 2: real tensors take meta stand-ins; the Meta kernel runs (libtorch's C++ one where
// native_meta has it, else whatever the Meta key holds).
void run_meta_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                     size_t base, size_t n_args, bool has_real) {
  if (has_real) {
    for (size_t i = 0; i < n_args; ++i) replace_real((*stack)[base + i]);
  }
  KernelScope scope;
  const c10::DispatchKeySet meta_keys(c10::DispatchKey::Meta);
  if (info.native != nullptr) {
    info.native->callBoxed(op, meta_keys, stack);
  } else {
    op.redispatchBoxed(meta_keys, stack);
  }
}

// Step 3: new results become fake tensors on the target device.
void wrap_results(const c10::OperatorHandle& op, torch::jit::Stack& s, const ResultPlan& plan) {
  const size_t n_out = op.schema().returns().size();
  for (size_t i = s.size() - n_out; i < s.size(); ++i) {
    c10::IValue& v = s[i];
    if (v.isTensor()) {
      v = wrap_output(v.toTensor(), plan.target, plan.inputs);
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j)
        list.set(j, wrap_output(list.get(j), plan.target, plan.inputs));
    }
  }
}

// A value read (item, equal, is_nonzero, ...) whose tensors are all real: a real run reads the
// same values, so the read runs for real (narrow's start or tensor_split's sections given as a
// cpu tensor, as op_db's samples do, are read with item()). Reads that return tensors (nonzero,
// unique) stay typed errors: their results would be real tensors among fake ones.
bool real_read(const c10::OperatorHandle& op, const torch::jit::Stack& s, size_t base,
               size_t n_args) {
  for (const auto& r : op.schema().returns()) {
    switch (r.type()->kind()) {
      case c10::TypeKind::IntType:
      case c10::TypeKind::FloatType:
      case c10::TypeKind::BoolType:
      case c10::TypeKind::NumberType:
      case c10::TypeKind::ComplexType:
        continue;
      default:
        return false;
    }
  }
  bool any = false, all_real = true;
  for (size_t i = 0; i < n_args; ++i) {
    for_each_tensor(s[base + i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      any = true;
      all_real = all_real && needs_stand_in(t);
    });
  }
  return any && all_real;
}

// Ops this thread sent on to torch's FakeTensorMode (fake_mode_deferrals below).
thread_local int64_t t_deferrals = 0;

// torch's FakeTensorMode entered inside a FakeMode (the innermost wins; python/metaload/
// _interplay.py sets an outer one aside): the op goes on below this key to torch's Python key and
// that mode, and so do the ops it runs meanwhile.
void call_torch_fake_mode(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                          torch::jit::Stack* stack) {
  ++t_deferrals;
  c10::impl::ExcludeDispatchKeyGuard no_fake(kFakeKey);
  c10::impl::ExcludeDispatchKeyGuard no_mode(kMetaModeKey);
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kFakeKey), stack);
}

void fake_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                   torch::jit::Stack* stack) {
  if (C10_UNLIKELY(keys.has(c10::DispatchKey::Python)) && torch_fake_mode_is_on()) {
    return call_torch_fake_mode(op, keys, stack);
  }
  const OpInfo& info = op_info(op);
  if (info.own) {
    c10::impl::ExcludeDispatchKeyGuard no_fake(kFakeKey);
    return op.callBoxed(stack);
  }
  const size_t n_args = op.schema().arguments().size();
  const size_t base = stack->size() - n_args;
  if (info.reads_values) {
    if (real_read(op, *stack, base, n_args)) {
      c10::impl::ExcludeDispatchKeyGuard no_fake(kFakeKey);
      return op.callBoxed(stack);
    }
    raise_data_dependent(op, stack);
  }
  if (info.mask_index && indexes_with_a_mask(*stack, n_args)) raise_data_dependent(op, stack);
  const ResultPlan plan = plan_results(info, op, *stack, base, n_args);
  if (info.cpu_rule == CpuRule::kNone || !plan.target.is_cpu() ||
      !apply_cpu_rule(info.cpu_rule, stack, n_args)) {
    run_meta_kernel(info, op, stack, base, n_args, plan.has_real);
  }
  if (plan.wrap) wrap_results(op, *stack, plan);
}

// ---- registration ---------------------------------------------------------------------------

// Autograd and device guards look up a guard for the claimed device; a CPU-only libtorch has none
// for CUDA, and a CUDA libtorch on a machine without a GPU has one that fails on every call (no
// driver). Fake cuda tensors then get a no-op one; real CUDA could not run anyway. Where a GPU
// exists, libtorch's own guard stays.
void register_cuda_guard_if_none() {
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA) ||
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount() == 0) {
    static c10::impl::DeviceGuardImplRegistrar registrar(
        c10::DeviceType::CUDA, new c10::impl::NoOpDeviceGuardImpl<c10::DeviceType::CUDA>());
  }
}

c10::KernelFunction fake_kernel() {
  return c10::KernelFunction::makeFromBoxedFunction<&fake_fallback>();
}

}  // namespace

void ensure_fake_key_registered() {
  static ModeFallback* r = new ModeFallback(  // never destroyed, like the fallback
      kFakeKey, "FakeMode", "fake tensors", &fake_kernel,
      "metaload fake tensor fallback (fake_mode/fake_mode.cc)", &register_cuda_guard_if_none);
  r->ensure();
}

c10::optional<c10::Device> fake_mode_device() {
  return mode_device_now();
}

c10::Device claimable_fake_device(c10::Device device, const std::string& what) {
  if (device.is_cpu() && (!device.has_index() || device.index() == 0)) {
    return c10::Device(c10::kCPU);
  }
  if (device.is_cuda() && device.index() < kMaxFakeCudaDevices) return device;
  throw ModeError(what + " " + device.str() +
                  " cannot be claimed by fake tensors: a fake device is cpu (no index, or 0) or "
                  "cuda:N with 0 <= N < " +
                  std::to_string(kMaxFakeCudaDevices));
}

FakeMode::FakeMode(c10::Device device)
    : was_included_((claimable_fake_device(device, "FakeMode: the device"),
                     ensure_fake_key_registered(), run_deferred_registrations(),
                     c10::impl::tls_is_dispatch_key_included(kFakeKey))),
      was_excluded_(c10::impl::tls_is_dispatch_key_excluded(kFakeKey)),
      was_forcing_(c10::impl::tls_is_dispatch_key_included(kMetaModeKey)),
      saved_device_(t_mode_device) {
  t_mode_device = normalize(claimable_fake_device(device, "FakeMode: the device"), t_mode_device);
  c10::impl::tls_set_dispatch_key_included(kFakeKey, true);
  c10::impl::tls_set_dispatch_key_excluded(kFakeKey, false);
  c10::impl::tls_set_dispatch_key_included(kMetaModeKey, false);  // innermost wins
}

FakeMode::~FakeMode() {
  t_mode_device = saved_device_;
  c10::impl::tls_set_dispatch_key_included(kFakeKey, was_included_);
  c10::impl::tls_set_dispatch_key_excluded(kFakeKey, was_excluded_);
  c10::impl::tls_set_dispatch_key_included(kMetaModeKey, was_forcing_);
}

namespace {

// ---- operators for Python -------------------------------------------------------------------

// A device string torch cannot parse is a ModeError naming it, as one FakeMode cannot claim.
c10::Device parse_fake_device(c10::string_view text, const char* what) {
  try {
    return c10::Device(std::string(text));
  } catch (const c10::Error&) {
    throw ModeError(std::string(what) + " " + quote_text(std::string(text)) +
                    " is not a device: a fake device is cpu (no index, or 0) or cuda:N with 0 "
                    "<= N < " +
                    std::to_string(kMaxFakeCudaDevices));
  }
}

int64_t enter_fake(c10::string_view device) {
  const c10::Device d = claimable_fake_device(parse_fake_device(device, "enter_fake: the device"),
                                              "enter_fake: the device");
  return push_scope(std::make_unique<ScopeOf<FakeMode>>(d));
}

// The Fake key's fallback registered now rather than in the first fake() scope: registering
// touches every operator's dispatch table (about 4 ms), which Python's first metaload scope of any
// kind pays instead of a scan's first forward.
void register_fake_key() {
  ensure_fake_key_registered();
}

// How many ops this thread's FakeModes have sent on to a torch FakeTensorMode entered inside them.
// Python's fake() excludes metaload's keys around every call made under that mode, including
// torch's own calls into it that bypass the dispatcher (a FakeTensor's detach for `.data`); a
// metaload.scan pass without that Python mode is redone with it when this count moved.
int64_t fake_mode_deferrals() {
  return t_deferrals;
}

// t.to(device) from C++: Python's bindings would initialise CUDA first, which fails without a GPU
// (and costs a context with one). Recorded by autograd like any to().
at::Tensor fake_to(const at::Tensor& t, c10::string_view device) {
  ensure_fake_key_registered();
  return t.to(parse_fake_device(device, "fake_to: the device"));
}

bool is_fake_op(const at::Tensor& t) {
  return is_fake(t);
}

std::string fake_device_op(const at::Tensor& t) {
  return claimed_device(t).str();
}

}  // namespace
}  // namespace metaload

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def("enter_fake(str target) -> int", &metaload::enter_fake);
  m.def("register_fake_key() -> ()", &metaload::register_fake_key);
  m.def("fake_mode_deferrals() -> int", &metaload::fake_mode_deferrals);
  m.def("fake_to(Tensor t, str target) -> Tensor", &metaload::fake_to);
  m.def("is_fake(Tensor t) -> bool", &metaload::is_fake_op);
  m.def("fake_device(Tensor t) -> str", &metaload::fake_device_op);
}

// enter_fake, register_fake_key and fake_mode_deferrals take no tensors: with a mode on it would
// reach the mode's fallback (see c10_ext/activation.cc); direct kernels for both mode keys keep it
// out.
METALOAD_LIBRARY_IMPL(Fake, m) {
  m.impl("enter_fake", &metaload::enter_fake);
  m.impl("register_fake_key", &metaload::register_fake_key);
  m.impl("fake_mode_deferrals", &metaload::fake_mode_deferrals);
}

METALOAD_LIBRARY_IMPL(DeferredInit, m) {
  m.impl("enter_fake", &metaload::enter_fake);
  m.impl("register_fake_key", &metaload::register_fake_key);
  m.impl("fake_mode_deferrals", &metaload::fake_mode_deferrals);
}
