// Meta kernels for the ops whose result depends on tensor values (item, nonzero, unique, ...).
// libtorch has none, so on a meta tensor they fail with a generic "could not run ... on Meta"
// message. Ours raise DataDependentError naming the op and saying how to get real values. They
// are registered when the library loads, only for ops that have no Meta kernel yet.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <vector>

#include "base/registration.h"
#include "base/torch_library.h"
#include "c10_ext/data_dependent.h"
#include "c10_ext/mode_key.h"
#include "c10_ext/random_draws.h"

namespace metaload {
namespace {

std::string describe_tensor_args(const c10::FunctionSchema& schema,
                                 const torch::jit::Stack& stack) {
  const size_t n = schema.arguments().size();
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const auto& v = stack[stack.size() - n + i];
    if (!v.isTensor()) continue;
    const auto& t = v.toTensor();
    if (!out.empty()) out += ", ";
    out += schema.arguments()[i].name() + ": " + std::string(c10::toString(t.scalar_type())) + " " +
           c10::str(t.sizes());
  }
  return out;
}

const char* what_it_reads(const std::string& op) {
  if (op == "aten::_local_scalar_dense" || op == "aten::item")
    return "reads a value (Tensor.item(), printing, tolist)";
  if (op == "aten::equal" || op == "aten::allclose") return "compares values";
  return "produces an output whose size depends on the values";
}

[[noreturn]] void throw_data_dependent(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  throw DataDependentError(
      schema.name() + " " + what_it_reads(schema.name()) + ", but its input has none: it is a " +
      "meta or fake tensor, which holds shapes only (" + describe_tensor_args(schema, *stack) +
      "). Create the tensors whose values you need under metaload::RealGuard (Python: `with " +
      "metaload.real():`) and outside FakeMode." + random_draws_hint());
}

bool same_view(const at::Tensor& a, const at::Tensor& b) {
  return a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl() ||
         (a.storage().is_alias_of(b.storage()) && a.storage_offset() == b.storage_offset() &&
          a.sizes() == b.sizes() && a.strides() == b.strides() &&
          a.scalar_type() == b.scalar_type());
}

// equal(a, b) needs values, except when a and b are the same view of the same memory: code such
// as multi-head attention asks equal(query, key) to detect self-attention. (A tensor holding NaN
// is not equal to itself; shapes never depend on that.)
void equal_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto args = torch::jit::last(*stack, 2);
  if (args[0].isTensor() && args[1].isTensor() &&
      same_view(args[0].toTensor(), args[1].toTensor())) {
    torch::jit::drop(*stack, 2);
    stack->emplace_back(true);
    return;
  }
  throw_data_dependent(op, stack);
}

// x.repeat_interleave(n, dim) with a plain number n has a known size, but libtorch's composite
// kernel turns n into a repeats tensor and calls repeat_interleave(repeats) + index_select, which
// needs values. For fake and meta tensors this kernel gives the same result through unsqueeze +
// expand + flatten instead, which needs none. It sits on the autograd keys fake tensors carry
// (AutogradCPU / AutogradCUDA for the device they claim) and meta tensors' AutogradMeta, so it runs
// before the composite kernel would decompose; real tensors go on to that composite kernel as
// before.
void repeat_interleave_int(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                           torch::jit::Stack* stack) {
  // repeat_interleave.self_int(Tensor self, SymInt repeats, int? dim=None, *, SymInt?
  // output_size=None)
  const auto args = torch::jit::last(*stack, 4);
  const at::Tensor self = args[0].toTensor();
  if (!self.is_meta() && !self.key_set().has(c10::DispatchKey::Fake)) {
    return op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
  }
  const int64_t repeats = args[1].toInt();
  TORCH_CHECK(repeats >= 0, "repeats can not be negative");
  const bool flat = args[2].isNone();
  const at::Tensor input = flat ? self.flatten() : self;
  TORCH_CHECK(input.dim() > 0, "repeat_interleave: dim ", args[2].toInt(),
              " is out of range for a 0-dim tensor");
  const int64_t dim = flat ? 0 : c10::maybe_wrap_dim(args[2].toInt(), input.dim());
  std::vector<int64_t> expanded = input.sizes().vec();
  expanded.insert(expanded.begin() + dim + 1, repeats);
  if (!args[3].isNone()) {
    TORCH_CHECK(args[3].toInt() == input.size(dim) * repeats,
                "allocated size does not match required size");
  }
  // Contiguous, like index_select's result.
  at::Tensor out = input.unsqueeze(dim + 1).expand(expanded).flatten(dim, dim + 1).contiguous();
  torch::jit::drop(*stack, 4);
  stack->emplace_back(std::move(out));
}

// _to_copy and copy_ on meta: libtorch's composite kernels serve meta -> meta, and fail with a
// generic "Cannot copy out of meta tensor" when a meta tensor's values are copied to a real device
// (printing one, .cpu() outside MetaMode). These kernels keep meta -> meta exactly as libtorch
// does it and make the other direction a DataDependentError naming the op.
at::Tensor to_copy_meta(const at::Tensor& self, c10::optional<at::ScalarType> dtype,
                        c10::optional<at::Layout> layout, c10::optional<at::Device> device,
                        c10::optional<bool> pin_memory, bool non_blocking,
                        c10::optional<at::MemoryFormat> memory_format) {
  const at::Device target = device.value_or(self.device());
  if (!target.is_meta()) {
    throw DataDependentError(
        "aten::_to_copy copies the values of a meta tensor (" +
        std::string(c10::toString(self.scalar_type())) + " " + c10::str(self.sizes()) + ") to " +
        target.str() +
        ", but it has none: it is a meta or fake tensor, which holds shapes only. "
        "Create the tensors whose values you need under metaload::RealGuard (Python: `with "
        "metaload.real():`) and outside FakeMode.");
  }
  TORCH_CHECK(layout.value_or(at::kStrided) == at::kStrided, "meta _to_copy supports strided only");
  const auto options = self.options().dtype(dtype.value_or(self.scalar_type())).device(target);
  const auto mf = memory_format.value_or(at::MemoryFormat::Preserve);
  if (mf == at::MemoryFormat::Preserve && self.is_non_overlapping_and_dense()) {
    return at::empty_strided(self.sizes(), self.strides(), options);
  }
  return at::empty(self.sizes(), options,
                   mf == at::MemoryFormat::Preserve ? self.suggest_memory_format() : mf);
}

at::Tensor& copy_meta(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (!self.is_meta()) {
    throw DataDependentError(
        "aten::copy_ copies the values of a meta tensor (" +
        std::string(c10::toString(src.scalar_type())) + " " + c10::str(src.sizes()) +
        ") into a tensor on " + self.device().str() +
        ", but it has none: it is a meta or fake "
        "tensor, which holds shapes only. Create the tensors whose values you need under "
        "metaload::RealGuard (Python: `with metaload.real():`) and outside FakeMode.");
  }
  // Into a meta tensor: nothing to copy; the shapes must broadcast as a real copy requires.
  const auto shape = at::infer_size(self.sizes(), src.sizes());
  TORCH_CHECK(at::IntArrayRef(shape) == self.sizes(), "output with shape ", self.sizes(),
              " doesn't match the broadcast shape ", shape);
  return self;
}

const char* const kDataDependentOps[] = {
    "_local_scalar_dense",
    "nonzero",
    "nonzero.out",
    "masked_select",
    "masked_select.out",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "unique_dim_consecutive",
    "bincount",
    "_assert_async",
};

// "nonzero.out" -> aten::nonzero, overload "out".
c10::OperatorName aten_op_name(const char* qualified) {
  std::string s(qualified);
  const auto dot = s.find('.');
  return c10::OperatorName("aten::" + s.substr(0, dot),
                           dot == std::string::npos ? "" : s.substr(dot + 1));
}

bool has_meta_kernel(const char* qualified) {
  auto op = c10::Dispatcher::singleton().findOp(aten_op_name(qualified));
  return !op || op->hasKernelForDispatchKey(c10::DispatchKey::Meta);  // absent op: nothing to do
}

void register_data_dependent_kernels() {
  {
    try {
      auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__,
                                     __LINE__);  // kept for the life of the process
      for (const char* op : kDataDependentOps) {
        if (!has_meta_kernel(op)) {
          lib->impl(op, torch::CppFunction::makeFromBoxedFunction<&throw_data_dependent>());
        }
      }
      if (!has_meta_kernel("_to_copy")) lib->impl("_to_copy", TORCH_FN(to_copy_meta));
      if (!has_meta_kernel("copy_")) lib->impl("copy_", TORCH_FN(copy_meta));
      if (!has_meta_kernel("equal")) {
        lib->impl("equal", torch::CppFunction::makeFromBoxedFunction<&equal_meta>());
      }
      // repeat_interleave.Tensor's Meta kernel is in kernels/ (it must replace torch's Python one).
      auto self_int = c10::Dispatcher::singleton().findOp({"aten::repeat_interleave", "self_int"});
      for (const auto key : {c10::DispatchKey::AutogradCPU, c10::DispatchKey::AutogradCUDA,
                             c10::DispatchKey::AutogradMeta}) {
        if (!self_int || self_int->hasKernelForDispatchKey(key)) continue;
        auto* autograd = new torch::Library(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
        autograd->impl("repeat_interleave.self_int",
                       torch::CppFunction::makeFromBoxedFunction<&repeat_interleave_int>());
      }
    } catch (const std::exception& e) {
      // Loading the library must never abort the process: these kernels only improve messages.
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);  // its message, no backtrace
      load_warning(std::string("metaload: data-dependent op kernels not registered: ") +
                   (c10_error ? c10_error->what_without_backtrace() : e.what()));
    }
  }
}

const bool g_registered = (register_when_safe(&register_data_dependent_kernels), true);

}  // namespace

bool is_data_dependent_op(const c10::OperatorName& name) {
  // Composites: what they call is dispatched below the modes, where torch 2.x has Meta kernels of
  // its own for _local_scalar_dense (an untyped "cannot be called on meta tensors").
  if (name.name == "aten::item" || name.name == "aten::is_nonzero" ||
      name.name == "aten::allclose") {
    return true;
  }
  for (const char* op : kDataDependentOps) {
    if (name == aten_op_name(op)) return true;
  }
  return false;
}

void raise_data_dependent(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  throw_data_dependent(op, stack);
}

}  // namespace metaload
